"""Small model folders written on the spot, with no model hub.

``write_model`` writes a folder that vLLM serves with ``load-format: dummy``: a real
architecture's ``config.json`` and a word-level tokenizer whose vocabulary covers the config's
``vocab_size``, no weights. vLLM fills the weights with random values; speed depends only on the
shapes, as long as output lengths are forced (``ignore_eos``).

``write_model_with_weights`` writes a folder that vLLM loads as it loads any model, with its
default load format: the weights themselves (random values, saved as safetensors) and a
byte-level BPE tokenizer. transformers 5 (5.19) rebuilds the tokenizer of any Qwen2 model as a
byte-level BPE whatever its files say, which leaves ``write_model``'s word-level vocabulary
unreachable from text; this one survives that, so text prompts encode (one token a byte) and
decode back.
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


def byte_level_tokenizer_json(vocab_size: int) -> dict[str, object]:
    """A byte-level BPE ``tokenizers`` file with no merges: 0 is end of sequence, 1 to 256 the
    256 byte symbols, each id beyond the word ``t<i>`` (never produced by encoding text)."""
    from tokenizers.pre_tokenizers import ByteLevel

    symbols = sorted(ByteLevel.alphabet())
    if vocab_size <= len(symbols):
        raise ValueError(f"a byte-level vocabulary needs more than {len(symbols)} tokens")
    vocab = {EOS_TOKEN: 0, **{s: i for i, s in enumerate(symbols, start=1)}}
    vocab |= {f"t{i}": i for i in range(len(vocab), vocab_size)}
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    # The word-level file's frame (its end-of-sequence token), with a byte-level model.
    document = tokenizer_json(0)
    document.update(
        pre_tokenizer={"type": "ByteLevel", **byte_level},
        decoder={"type": "ByteLevel", **byte_level},
        model={
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    )
    return document


def write_model_with_weights(
    folder: str | Path, shape: str | ModelShape = "cpu-tiny", seed: int = 0
) -> Path:
    """Write (or overwrite) a model folder holding saved weights and return its path.

    ``config.json`` and ``generation_config.json`` as transformers writes them for that shape;
    ``model.safetensors``, transformers' own initialisation of the architecture drawn from
    ``seed`` (the same seed, the same bytes; the global random state is left as it was); the
    byte-level tokenizer. Needs torch and transformers (vLLM's own dependencies); the whole
    model is built in memory, so a large shape takes its full size there and on disk.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if isinstance(shape, str):
        shape = SHAPES[shape]
    folder = write_model(folder, shape)
    files = {
        "tokenizer.json": byte_level_tokenizer_json(shape.vocab_size),
        "tokenizer_config.json": {
            "tokenizer_class": "Qwen2Tokenizer",
            "bos_token": None,
            "eos_token": EOS_TOKEN,
            "pad_token": EOS_TOKEN,
            "unk_token": EOS_TOKEN,
            "model_max_length": shape.max_position_embeddings,
            "clean_up_tokenization_spaces": False,
        },
    }
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content, indent=1) + "\n")
    config = AutoConfig.from_pretrained(folder)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=config.dtype)
    model.save_pretrained(folder, safe_serialization=True)
    return folder
