"""The emitted configuration: the best trial's engine arguments as a ``vllm serve --config`` YAML.

Pure: builds text. The arguments go through ``tuner.flags.config_yaml``, the same function that
wrote each trial's config, so what is emitted is byte for byte what was measured (less host and
port, which tuner chose per trial).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.flags import SERVER_ONLY, config_yaml

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


def served_config(model: str, engine_args: Mapping[str, Any]) -> str:
    """The YAML body: the model and the trial's engine arguments, without host and port."""
    args = {k: v for k, v in engine_args.items() if k not in SERVER_ONLY}
    return config_yaml({"model": model, **args})


def format_figure(metrics: Mapping[str, Any], key: str, scale: float, unit: str) -> str:
    value = metrics.get(key)
    if not isinstance(value, int | float):
        return "n/a"
    return f"{value * scale:.1f} {unit}"


def render(
    model: str,
    engine_args: Mapping[str, Any],
    provenance: Provenance,
    best: Mapping[str, Any],
    baseline: Mapping[str, Any] | None,
) -> str:
    """The whole file: a comment header, then the config ``vllm serve --config`` reads."""
    p = provenance
    lines = [
        f"# Tuned by tuner {p.tuner_version} for vLLM {p.vllm_version} on {p.device}.",
        f"# Study {p.study!r}, trial {p.trial_number}.",
        f"# Trace: {p.trace_path} (sha256 {p.trace_sha256})",
        f"# Window: {p.window}",
        "# Measured on that window:",
    ]
    for label, key, scale, unit in HEADLINE:
        row = f"#   {label:<16} best {format_figure(best, key, scale, unit):>14}"
        if baseline is not None:
            row += f"   baseline {format_figure(baseline, key, scale, unit):>14}"
        lines.append(row)
    lines.append("# Serve with: vllm serve --config <this file>")
    return "\n".join(lines) + "\n" + served_config(model, engine_args)
