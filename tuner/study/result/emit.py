"""The emitted configuration: the chosen trial's engine arguments as a ``vllm serve --config`` YAML.

The chosen trial is the best one that met the SLOs, else the one that came closest; the header's
first line says which (``# meets SLOs: yes`` or ``no``, then each SLO missed).

Builds text. The arguments go through ``tuner.flags.config_yaml``, the same function that wrote
each trial's config, so what is emitted is byte for byte what was measured, less host and port
(which tuner chose per trial) and random weights: a study measured on random weights
(``load-format: dummy``) emits the configuration that serves the model's weights, and its
header says how it was measured and what the configuration loads (where the model's folder
holds no weights, that they must be put there first). A local model folder is named by its
absolute path, so the file serves from any folder; a Hugging Face id as given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.engine.dummy_model import has_weights
from tuner.engine.environment import command_to_serve
from tuner.engine.own_server import ServerCommand
from tuner.flags import LOAD_FORMAT, RANDOM_WEIGHTS, SERVER_ONLY, config_yaml, random_weights
from tuner.study.capacity.probes import NO_RATE
from tuner.study.measure.scoring import Miss, Verdict
from tuner.study.plan.layouts import layout_of

# The header's last line, and what it names the file by.
SERVE_WITH = "# Serve with: "
THIS_FILE = "<this file>"

# The measured figures quoted in the header, with how a person reads them.
HEADLINE: tuple[tuple[str, str, float, str], ...] = (
    ("p95 TTFT", "ttft_p95_s", 1000.0, "ms"),
    ("p95 TPOT", "tpot_p95_s", 1000.0, "ms"),
    ("p99 end-to-end", "e2e_p99_s", 1000.0, "ms"),
    ("throughput", "throughput_req_per_s", 1.0, "req/s"),
    ("output tokens", "throughput_output_tokens_per_s", 1.0, "tok/s"),
)


@dataclass(frozen=True)
class Provenance:
    """Where a configuration came from, for its header."""

    tuner_version: str
    vllm_version: str
    device: str
    study: str
    trace_path: str
    trace_sha256: str
    window: str
    trial_number: int
    # The vLLM version and device are those of the machine writing the file, not the trial's:
    # it was recorded before tuner kept them on each trial.
    machine_of_writer: bool = False


def served_model(model: str) -> str:
    """The model as the emitted file names it: a local folder's absolute path, else the id."""
    folder = Path(model).expanduser()
    return str(folder.resolve()) if folder.is_dir() else model


def served_config(
    model: str, engine_args: Mapping[str, Any], server: ServerCommand | None = None
) -> str:
    """The YAML body: the model and the trial's engine arguments, without host and port, and
    without random weights; for the user's own app (``server``), as its engine-config file."""
    served = {"model": served_model(model), **served_args(engine_args)}
    return config_yaml(served) if server is None else server.config_text(served)


def served_args(engine_args: Mapping[str, Any]) -> dict[str, Any]:
    """The engine arguments a configuration file carries: a trial's, without host and port
    (tuner chose them per trial) and without random weights."""
    return {
        k: v
        for k, v in engine_args.items()
        if k not in SERVER_ONLY and not (k == LOAD_FORMAT and v == RANDOM_WEIGHTS)
    }


def serve_command(path: str, server: ServerCommand | None = None) -> str:
    """How to serve the configuration at ``path``: ``vllm serve``, or the user's app."""
    return command_to_serve(path) if server is None else server.serve_command(path)


def random_weights_lines(model: str) -> list[str]:
    """The header's lines for a study measured on random weights: how, and what the config
    loads instead (the model's folder holds weights, or none, or the model is a hub id)."""
    lines = [
        "# Measured on random weights (load-format: dummy) of this model's shape, every",
        "# request's output length forced: speed depends on the shapes, not the values.",
    ]
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return [*lines, "# The config below loads the model's real weights."]
    if has_weights(folder):
        return [*lines, "# The config below loads the weights saved in that folder."]
    return [
        *lines,
        f"# {served_model(model)} holds no weights: the config below serves",
        "# once the model's real weights are in that folder.",
    ]


def gpus_lines(engine_args: Mapping[str, Any]) -> list[str]:
    """The header's line of a server on several GPUs (its layout): how many it needs."""
    layout = layout_of(engine_args)
    if layout.gpus == 1:
        return []
    args = ", ".join(f"{name} {value}" for name, value in layout.args.items())
    return [f"# One server on {layout.gpus} GPUs ({args}): CUDA_VISIBLE_DEVICES names them."]


def format_figure(metrics: Mapping[str, Any], key: str, scale: float, unit: str) -> str:
    """``metrics[key]`` times ``scale`` with its unit, one decimal; "n/a" where not measured."""
    value = metrics.get(key)
    if not isinstance(value, int | float):
        return "n/a"
    return f"{value * scale:.1f} {unit}"


def _ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.3g} ms"


def describe_miss(miss: Miss) -> str:
    """``ttft_p95_s: 4561 ms (SLO 2000 ms)``, ``error_rate: 12.5% (SLO 0%)``."""
    if miss.metric == NO_RATE:
        return "no rate tried met every SLO (capacity 0)"
    if miss.metric == "error_rate":
        measured = "not measured" if miss.measured is None else f"{miss.measured:.1%}"
        limit = "" if miss.limit is None else f" (SLO {miss.limit:.1%})"
    elif miss.metric.endswith("_s"):
        measured = "not measured" if miss.measured is None else _ms(miss.measured)
        limit = "" if miss.limit is None else f" (SLO {_ms(miss.limit)})"
    else:
        return miss.metric
    return f"{miss.metric}: {measured}{limit}"


def verdict_lines(verdict: Verdict) -> list[str]:
    """``meets SLOs: yes``, or ``no`` and one indented line per SLO missed."""
    if verdict.meets_slos:
        return ["meets SLOs: yes"]
    return ["meets SLOs: no", *(f"  {describe_miss(m)}" for m in verdict.misses)]


def render(
    model: str,
    engine_args: Mapping[str, Any],
    provenance: Provenance,
    verdict: Verdict,
    chosen: Mapping[str, Any],
    other: Mapping[str, Any] | None,
    extra: Sequence[str] = (),
    measured: str = "on that window",
    labels: tuple[str, str] | None = None,
    server: ServerCommand | None = None,
) -> str:
    """The whole file: a comment header, then the config ``vllm serve --config`` reads, or for
    the user's own app (``server``) its engine-config file, with its command.

    ``extra`` lines follow the verdict (a capacity study's capacity and servers, what the
    configuration was held against); ``measured`` says where the figures were measured;
    ``labels`` name the two columns of figures, the chosen trial's and ``other``'s (by default
    best or closest, and defaults).
    """
    p = provenance
    chosen_label, other_label = labels or ("best" if verdict.meets_slos else "closest", "defaults")
    lines = [f"# {line}" for line in verdict_lines(verdict)]
    lines += [f"# {line}" for line in extra]
    lines.append(f"# Tuned by tuner {p.tuner_version} for vLLM {p.vllm_version} on {p.device}.")
    if random_weights(engine_args):
        lines += random_weights_lines(model)
    if p.machine_of_writer:
        lines.append(
            f"# (trial {p.trial_number} recorded no vLLM version or device: those are of the "
            "machine that wrote this file)"
        )
    lines += [
        f"# Study {p.study!r}, trial {p.trial_number}.",
        f"# Trace: {p.trace_path} (sha256 {p.trace_sha256})",
        f"# Window: {p.window}",
        f"# Measured {measured}:",
    ]
    for label, key, scale, unit in HEADLINE:
        row = f"#   {label:<16} {chosen_label} {format_figure(chosen, key, scale, unit):>14}"
        if other is not None:
            row += f"   {other_label} {format_figure(other, key, scale, unit):>14}"
        lines.append(row)
    lines += gpus_lines(engine_args)
    lines.append(SERVE_WITH + serve_command(THIS_FILE, server))
    return "\n".join(lines) + "\n" + served_config(model, engine_args, server)
