"""A model folder that vLLM serves with ``load-format: dummy``: no weights, no model hub.

The folder holds a real architecture's ``config.json`` and a word-level tokenizer whose
vocabulary covers the config's ``vocab_size``. vLLM fills the weights with random values; speed
depends only on the shapes, as long as output lengths are forced (``ignore_eos``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelShape:
    """The shape of a Qwen2-architecture decoder."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    torch_dtype: str


SHAPES: dict[str, ModelShape] = {
    # Small enough to start in seconds on two CPU cores, large enough that a decode step costs
    # milliseconds, so that a few requests per second queue behind a small max-num-seqs.
    "cpu-demo": ModelShape(
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=8192,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    ),
    # The quick start's model. cpu-demo spends most of two CPU cores prefilling the conversation
    # trace's long prompts (1700 tokens on average), so at loads where a small max-num-seqs queues
    # every configuration does. This one decodes at 7 ms a token alone (cpu-demo: 15 ms) and
    # prefills the same window with room to spare, so whether requests queue is up to max-num-seqs.
    "cpu-tiny": ModelShape(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        vocab_size=8192,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    ),
    # The shape of Qwen2.5-3B: about 3.1 B parameters, 6 GB in bf16.
    "qwen2.5-3b": ModelShape(
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    ),
}

EOS_TOKEN = "<eos>"


def model_config(shape: ModelShape) -> dict[str, object]:
    """The ``config.json`` of a Qwen2 model of that shape."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        **asdict(shape),
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": shape.num_hidden_layers,
        "bos_token_id": 0,
        "eos_token_id": 0,
    }


def tokenizer_json(vocab_size: int) -> dict[str, object]:
    """A word-level ``tokenizers`` file: token ``i`` is the word ``t<i>``, 0 is end of sequence."""
    vocab = {EOS_TOKEN: 0, **{f"t{i}": i for i in range(1, vocab_size)}}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": 0,
                "content": EOS_TOKEN,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": EOS_TOKEN},
    }


def write_model(folder: str | Path, shape: str | ModelShape = "cpu-demo") -> Path:
    """Write (or overwrite) the model folder and return its path."""
    if isinstance(shape, str):
        shape = SHAPES[shape]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "config.json": model_config(shape),
        "tokenizer.json": tokenizer_json(shape.vocab_size),
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": EOS_TOKEN,
            "pad_token": EOS_TOKEN,
            "model_max_length": shape.max_position_embeddings,
            "clean_up_tokenization_spaces": False,
        },
        "generation_config.json": {"bos_token_id": 0, "eos_token_id": 0},
    }
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content, indent=1) + "\n")
    return folder
