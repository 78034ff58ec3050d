"""Write a model folder whose random weights are saved as safetensors, drawn on the GPU if any.

    python benchmarks/gpu/write_weights.py FOLDER SHAPE

``tuner.engine.dummy_model.write_model`` (with weights) with the tensors created on the GPU
(``torch.device("cuda")``) when there is one, so that a 7 to 8 B shape is drawn in seconds
rather than minutes of CPU time; the values then go through host memory to disk. SHAPE is a name
of ``dummy_model.SHAPES`` (``qwen2.5-7b``, ``qwen2.5-3b``, ``cpu-tiny``, ...). Prints one JSON
line: the shape, where the weights were drawn, the folder's size in bytes and the seconds taken.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from tuner.engine import SHAPES, write_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("shape", choices=sorted(SHAPES))
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    began = time.monotonic()
    with torch.device(device):
        folder = write_model(args.folder, args.shape, weights=True)
    seconds = time.monotonic() - began
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    line = {"shape": args.shape, "device": device, "bytes": size, "seconds": round(seconds, 1)}
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
