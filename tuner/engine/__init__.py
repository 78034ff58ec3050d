"""The engine: one vLLM server per trial (launchers, zygote, ``vllm serve`` as a module), its
start-up timing, the machine it runs on, and the dummy models tuner writes.

The names offered to code outside tuner (``benchmarks/``, an embedding program) are in
``__all__``, each imported from its module when first used (``tuner.face``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.face import lazy

if TYPE_CHECKING:
    from tuner.engine.dummy_model import SHAPES, write_model
    from tuner.engine.environment import HostMemory, host_memory, is_cpu_build
    from tuner.engine.handle import EngineFailed
    from tuner.engine.launchers import (
        LAUNCHERS,
        Launch,
        Launcher,
        ProcessLauncher,
        ZygoteLauncher,
        auto_launcher,
        spawn,
    )
    from tuner.engine.local import LocalServer, free_port, signal_group
    from tuner.engine.process import Engine
    from tuner.engine.startup import STEPS, compile_cache, reported_durations, steps
    from tuner.engine.zygote import die_with

_FACE = {
    "Engine": "tuner.engine.process",
    "EngineFailed": "tuner.engine.handle",
    "HostMemory": "tuner.engine.environment",
    "LAUNCHERS": "tuner.engine.launchers",
    "Launch": "tuner.engine.launchers",
    "Launcher": "tuner.engine.launchers",
    "LocalServer": "tuner.engine.local",
    "ProcessLauncher": "tuner.engine.launchers",
    "SHAPES": "tuner.engine.dummy_model",
    "STEPS": "tuner.engine.startup",
    "ZygoteLauncher": "tuner.engine.launchers",
    "auto_launcher": "tuner.engine.launchers",
    "compile_cache": "tuner.engine.startup",
    "die_with": "tuner.engine.zygote",
    "free_port": "tuner.engine.local",
    "host_memory": "tuner.engine.environment",
    "is_cpu_build": "tuner.engine.environment",
    "reported_durations": "tuner.engine.startup",
    "signal_group": "tuner.engine.local",
    "spawn": "tuner.engine.launchers",
    "steps": "tuner.engine.startup",
    "write_model": "tuner.engine.dummy_model",
}

__all__ = [
    "LAUNCHERS",
    "SHAPES",
    "STEPS",
    "Engine",
    "EngineFailed",
    "HostMemory",
    "Launch",
    "Launcher",
    "LocalServer",
    "ProcessLauncher",
    "ZygoteLauncher",
    "auto_launcher",
    "compile_cache",
    "die_with",
    "free_port",
    "host_memory",
    "is_cpu_build",
    "reported_durations",
    "signal_group",
    "spawn",
    "steps",
    "write_model",
]

__getattr__, __dir__ = lazy(__name__, _FACE)
