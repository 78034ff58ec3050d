"""Write a model folder whose random weights are saved as safetensors, drawn on the GPU if any.

    python benchmarks/gpu/write_weights.py FOLDER SHAPE

``tuner.engine.dummy_model.write_model_with_weights`` with the tensors created on the GPU
(``torch.device("cuda")``) when there is one, so that a 7 to 8 B shape is drawn in seconds
rather than minutes of CPU time; the values then go through host memory to disk. SHAPE is a name
of ``dummy_model.SHAPES`` or of ``SHAPES`` here. Prints one JSON line: the shape, where the
weights were drawn, the folder's size in bytes and the seconds taken.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from tuner.engine import dummy_model
from tuner.engine.dummy_model import ModelShape, write_model_with_weights

SHAPES: dict[str, ModelShape] = {
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


def shape_named(name: str) -> ModelShape:
    """The shape of that name, here or in tuner's own list."""
    found = SHAPES.get(name) or dummy_model.SHAPES.get(name)
    if found is None:
        known = ", ".join(sorted({*SHAPES, *dummy_model.SHAPES}))
        raise SystemExit(f"no shape {name!r} (known: {known})")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("shape")
    args = parser.parse_args(argv)
    shape = shape_named(args.shape)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    began = time.monotonic()
    with torch.device(device):
        folder = write_model_with_weights(args.folder, shape)
    seconds = time.monotonic() - began
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    line = {"shape": args.shape, "device": device, "bytes": size, "seconds": round(seconds, 1)}
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
