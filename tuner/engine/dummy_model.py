"""Small model folders written on the spot, with no model hub.

``write_model`` writes a Qwen2-architecture folder of a shape in ``SHAPES``: ``config.json``,
``generation_config.json``, a byte-level BPE tokenizer and, with ``weights``, ``model.safetensors``
(transformers' own initialisation of the architecture, drawn from a seed). vLLM loads a folder
with weights as it loads any model, with its default load format, so a configuration measured on
it serves as it is; a folder without weights serves only with ``load-format: dummy`` (random
values of the shape), which is how a large shape is measured without writing gigabytes.

The tokenizer encodes text one token a byte (ids 1 to 256) and decodes any id; 0 is the end of
sequence. transformers 5 rebuilds the tokenizer of any Qwen2 model as a byte-level BPE whatever
its files say, so no other kind would be kept.

A folder is complete when its manifest (``tuner-model.json``, written last) names its shape,
seed and files, and each file has the size listed. A complete folder is reused as it is; one
of tuner's that is not is written again, its manifest first marked as being written, so a write
cut short is never taken for a complete one. A folder holding a model tuner did not write, or
any other file, is never written over.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


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
    # The shape of Qwen2.5-7B: about 7.6 B parameters, 15.2 GB in bf16.
    "qwen2.5-7b": ModelShape(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    ),
}

EOS_TOKEN = "<eos>"
# Written last: what the folder holds, by a writer of this format.
MANIFEST = "tuner-model.json"
FORMAT = 1
# A folder of files being written, inside the model folder (so that each moves in atomically).
STAGING_PREFIX = ".tuner-writing-"
# What transformers writes besides the weights, which ``write_model`` writes itself.
CONFIG_FILES = frozenset({"config.json", "generation_config.json"})


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
    """A byte-level BPE ``tokenizers`` file with no merges: 0 is end of sequence, 1 to 256 the
    256 byte symbols, each id beyond the word ``t<i>`` (never produced by encoding text)."""
    from tokenizers.pre_tokenizers import ByteLevel

    symbols = sorted(ByteLevel.alphabet())
    if vocab_size <= len(symbols):
        raise ValueError(f"a byte-level vocabulary needs more than {len(symbols)} tokens")
    vocab = {EOS_TOKEN: 0, **{s: i for i, s in enumerate(symbols, start=1)}}
    vocab |= {f"t{i}": i for i in range(len(vocab), vocab_size)}
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    eos = {
        "id": 0,
        "content": EOS_TOKEN,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [eos],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
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
    }


def metadata_files(shape: ModelShape) -> dict[str, dict[str, object]]:
    """Every file of the folder but its weights, by name."""
    return {
        "config.json": model_config(shape),
        "generation_config.json": {"bos_token_id": 0, "eos_token_id": 0},
        "tokenizer.json": tokenizer_json(shape.vocab_size),
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


def _shape(shape: str | ModelShape) -> ModelShape:
    return SHAPES[shape] if isinstance(shape, str) else shape


def _description(shape: ModelShape, weights: bool, seed: int | None) -> dict[str, Any]:
    """What the manifest says of the folder, beside its files."""
    seed = seed if weights else None
    return {"format": FORMAT, "shape": asdict(shape), "weights": weights, "seed": seed}


def has_weights(folder: str | Path) -> bool:
    """Whether a model folder holds weight files vLLM's default load format reads."""
    patterns = ("*.safetensors", "*.bin", "*.pt")
    return any(next(Path(folder).glob(pattern), None) for pattern in patterns)


def is_complete(
    folder: str | Path, shape: str | ModelShape, weights: bool = True, seed: int = 0
) -> bool:
    """Whether ``folder`` is a whole model of that shape as ``write_model`` writes it: with the
    weights of that seed, or, where ``weights`` is false, with or without weights."""
    folder, shape = Path(folder), _shape(shape)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest.pop("files")
    except (OSError, ValueError, KeyError, AttributeError):
        return False
    wanted = [_description(shape, weights, seed)]
    if not weights:
        wanted += [_description(shape, True, manifest.get("seed"))]
    if manifest not in wanted or not set(metadata_files(shape)) <= set(files):
        return False
    try:
        return all((folder / name).stat().st_size == size for name, size in files.items())
    except OSError:
        return False


def write_model(
    folder: str | Path, shape: str | ModelShape, weights: bool = True, seed: int = 0
) -> Path:
    """Make ``folder`` a model of that shape and return its path; a complete one
    (``is_complete``) is left as it is.

    With ``weights``, ``model.safetensors`` holds transformers' initialisation of the
    architecture drawn from ``seed`` (the same seed, the same bytes; the global random state is
    left as it was): this needs torch and transformers (vLLM's own dependencies) and builds the
    whole model in memory, so a large shape takes its full size there and on disk. Without,
    the folder serves only with ``load-format: dummy``.

    tuner writes into a folder that is absent, empty, its own (it has a manifest), or holds no
    model but one of this shape without weights; its files are replaced, each whole, and others
    are left. Any other folder holds files tuner did not write: a ``FileExistsError``.
    """
    folder, shape = Path(folder), _shape(shape)
    if is_complete(folder, shape, weights, seed):
        return folder
    _refuse_another_model(folder, shape)
    folder.mkdir(parents=True, exist_ok=True)
    _write_manifest(folder, {"format": FORMAT, "writing": True})
    for stale in folder.glob(STAGING_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    # Weights of an earlier write (another shape or seed, or cut short): never to be served.
    for stale in folder.glob("model*.safetensors*"):
        stale.unlink()
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=folder))
    try:
        for name, content in metadata_files(shape).items():
            (staging / name).write_text(json.dumps(content, indent=1) + "\n")
        if weights:
            _save_weights(staging, seed)
        sizes = {}
        for path in sorted(staging.iterdir()):
            sizes[path.name] = path.stat().st_size
            os.replace(path, folder / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _write_manifest(folder, {**_description(shape, weights, seed), "files": sizes})
    return folder


def _write_manifest(folder: Path, manifest: Mapping[str, Any]) -> None:
    partial = folder / (MANIFEST + ".partial")
    partial.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(partial, folder / MANIFEST)


def _refuse_another_model(folder: Path, shape: ModelShape) -> None:
    """A ``FileExistsError`` where ``folder`` holds files tuner did not write: it has no
    manifest, and weights, a ``config.json`` that is not of that shape (an earlier tuner wrote
    that config, with no weights), or no ``config.json`` and any file at all; or it is a file."""
    if (folder / MANIFEST).exists():
        return
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"{folder} is a file, not a folder")
    if has_weights(folder):
        raise FileExistsError(f"{folder} holds weights that tuner did not write")
    try:
        config = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        if folder.is_dir() and next(folder.iterdir(), None) is not None:
            raise FileExistsError(f"{folder} holds files that tuner did not write") from None
        return
    except (OSError, ValueError):
        config = None
    # transformers writes the dtype as ``dtype``, older versions as ``torch_dtype``.
    fields = {k: v for k, v in asdict(shape).items() if k != "torch_dtype"}
    if not isinstance(config, dict) or any(config.get(k) != v for k, v in fields.items()):
        raise FileExistsError(
            f"{folder} holds a model of another shape than the one to write there "
            f"({shape.num_hidden_layers} layers, hidden size {shape.hidden_size})"
        )


def _save_weights(folder: Path, seed: int) -> None:
    """Save the weights of the model whose ``config.json`` is in ``folder`` into it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging

    config = AutoConfig.from_pretrained(folder)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=config.dtype)
    saved = folder / "saved"
    bars = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        model.save_pretrained(saved, safe_serialization=True)
    finally:
        if bars:
            logging.enable_progress_bar()
    for path in saved.iterdir():
        if path.name not in CONFIG_FILES:
            os.replace(path, folder / path.name)
    shutil.rmtree(saved)
