"""How many bytes a model's weights take on a GPU, for the layouts tuner measures
(``tuner.study.plan.layouts``).

Read, in this order, from:

- the weight files: each ``*.safetensors`` file's header (its tensors' dtypes and shapes, not
  its data), so that the bytes are those vLLM loads at the ``dtype`` it is given (a float
  tensor at that dtype's width; an integer or 8-bit one, a quantized model's, as stored);
- else the model's ``config.json``: its parameters counted from the decoder's shape (embeddings,
  attention, a gated MLP or its experts) at the dtype's width. An estimate: it counts no
  vision tower, and a quantized model (``quantization_config``) is not estimated.

A local folder is read as it is; a Hugging Face id from the local cache only (no download).
None where neither tells (no config, or one of another shape).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Bytes per value of each dtype, by the names configs, vLLM's ``--dtype`` and safetensors use.
DTYPE_BYTES = {
    "float32": 4, "float": 4, "F32": 4, "float16": 2, "half": 2, "F16": 2, "bfloat16": 2,
    "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
    "F8_E4M3": 1, "F8_E5M2": 1,
}  # fmt: skip
# The safetensors dtypes vLLM casts to ``--dtype`` when it loads them.
FLOAT_DTYPES = frozenset({"F32", "F16", "BF16", "F64"})
# A mixture of experts' count of experts, by the names configs give it.
EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")
# The most of a safetensors header read (its length is the file's first 8 bytes).
MOST_HEADER_BYTES = 100 << 20


@dataclass(frozen=True)
class ModelSize:
    """A model's weights on a GPU: their bytes, how they were found (said beside them), and
    the attention heads (a tensor-parallel size must divide them; None where unknown)."""

    weight_bytes: int
    how: str
    attention_heads: int | None = None


def parameters_of(config: Mapping[str, Any]) -> int | None:
    """The parameters of a decoder of this ``config.json`` (its text config where it nests
    one): embeddings (twice where not tied), each layer's attention and gated MLP (or its
    experts); None where the config lacks the shape."""
    text = _text(config)
    try:
        hidden = int(text["hidden_size"])
        layers = int(text["num_hidden_layers"])
        vocab = int(text["vocab_size"])
        heads = int(text["num_attention_heads"])
        inner = int(text.get("intermediate_size") or 4 * hidden)
    except (KeyError, TypeError, ValueError):
        return None
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or hidden // heads)
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    experts = next((text[k] for k in EXPERTS if text.get(k)), None)
    if experts:
        expert_inner = int(text.get("moe_intermediate_size") or inner)
        mlp = int(experts) * 3 * hidden * expert_inner + hidden * int(experts)
    else:
        mlp = 3 * hidden * inner
    embeddings = vocab * hidden * (1 if text.get("tie_word_embeddings", True) else 2)
    return embeddings + layers * (attention + mlp + 2 * hidden) + hidden


def dtype_of(config: Mapping[str, Any], dtype: str | None) -> str:
    """The dtype vLLM loads the weights at: ``dtype`` as given (vLLM's ``--dtype``), else the
    config's (``torch_dtype`` or ``dtype``), else bfloat16."""
    if dtype and dtype != "auto":
        return dtype
    for source in (config, _text(config)):
        for key in ("torch_dtype", "dtype"):
            if isinstance(source.get(key), str):
                return str(source[key])
    return "bfloat16"


def size_of_config(config: Mapping[str, Any], dtype: str | None = None) -> ModelSize | None:
    """The weights of a model of ``config`` at ``dtype`` (``dtype_of``), estimated from its
    shape; None for a quantized model or a config without one."""
    count = parameters_of(config)
    if count is None or config.get("quantization_config"):
        return None
    width = DTYPE_BYTES.get(dtype_of(config, dtype), 2)
    return ModelSize(
        count * width,
        f"estimated from config.json: {count / 1e9:.2f} B parameters at {width} bytes",
        _heads(config),
    )


def size_of_files(
    folder: Path, config: Mapping[str, Any], dtype: str | None = None
) -> ModelSize | None:
    """The weights in ``folder``'s safetensors files, as vLLM loads them at ``dtype``; None
    where it holds none or one cannot be read."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    width = DTYPE_BYTES.get(dtype or "", 0) if dtype and dtype != "auto" else 0
    total = 0
    for path in files:
        header = _header(path)
        if header is None:
            return None
        for name, tensor in header.items():
            if name == "__metadata__" or not isinstance(tensor, Mapping):
                continue
            count = 1
            for n in tensor.get("shape", ()):
                count *= int(n)
            stored = str(tensor.get("dtype"))
            each = width if width and stored in FLOAT_DTYPES else DTYPE_BYTES.get(stored, 2)
            total += count * each
    said = f"{len(files)} safetensors file{'s' if len(files) != 1 else ''}"
    return ModelSize(total, f"the weights of {said}", _heads(config))


def model_size(
    model: str, dtype: str | None = None, revision: str | None = None
) -> ModelSize | None:
    """The weights of ``model`` (a local folder, or a Hugging Face id in the local cache) at
    ``dtype``: from its safetensors files, else estimated from its config; None where neither
    can be read."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        found = _cached_snapshot(model, revision)
        if found is None:
            return None
        folder = found
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, Mapping):
        return None
    return size_of_files(folder, config, dtype) or size_of_config(config, dtype)


def _text(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The text model's config: its ``text_config`` where it nests one, else itself."""
    nested = config.get("text_config")
    return nested if isinstance(nested, Mapping) else config


def _heads(config: Mapping[str, Any]) -> int | None:
    heads = _text(config).get("num_attention_heads")
    return heads if isinstance(heads, int) and heads > 0 else None


def _header(path: Path) -> dict[str, Any] | None:
    """A safetensors file's header: its first 8 bytes give the length of the JSON after them."""
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > MOST_HEADER_BYTES:
                return None
            header = json.loads(handle.read(length))
    except (OSError, ValueError, struct.error):
        return None
    return header if isinstance(header, dict) else None


def _cached_snapshot(model: str, revision: str | None) -> Path | None:
    """The folder of ``model``'s files in the Hugging Face cache, without downloading; None
    where it is not there."""
    try:
        from huggingface_hub import snapshot_download

        found = snapshot_download(model, revision=revision, local_files_only=True)
    except (ImportError, OSError, ValueError):  # not in the cache, or not an id
        return None
    return Path(found)
