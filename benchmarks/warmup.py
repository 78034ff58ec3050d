"""How long a fresh vLLM engine stays slower than it will be, request by request.

For each of ``--engines`` fresh engines (each a new server process), sends ``--requests``
requests of the same shape one after another and records each one's TTFT and TPOT. Prints the
per-position median over the engines next to the steady state (the median of the last half),
and the first position from which every later position stays within ``--tolerance`` of it:
the number of requests worth spending on warm-up (the spec's ``warmup_requests``).

    python benchmarks/warmup.py --engines 3 --requests 24
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

from tuner.engine import Engine, ProcessLauncher, write_model
from tuner.load import ReplaySettings, replay_in_process
from tuner.traces import Request


def settle_index(series: list[float], tolerance: float) -> tuple[int, float]:
    """Steady value (median of the second half) and the first index after which all stay near.

    Near: inside the second half's own range widened by ``tolerance``, so that request-to-request
    noise of a warm engine does not count as warm-up.
    """
    half = series[len(series) // 2 :]
    steady = statistics.median(half)
    low, high = min(half) * (1 - tolerance), max(half) * (1 + tolerance)
    for i in range(len(series)):
        if all(low <= v <= high for v in series[i:]):
            return i, steady
    return len(series), steady


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--input-tokens", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--shape", default="cpu-demo")
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--eager", action="store_true", help="enforce-eager (no torch.compile)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.2)
    options = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="warmup-"))
    model = str(write_model(work / "model", options.shape))
    args: dict[str, object] = {
        "load-format": "dummy",
        "max-model-len": 4096,
        "gpu-memory-utilization": options.gpu_memory_utilization,
    }
    if options.eager:
        args["enforce-eager"] = True
    settings = ReplaySettings(
        model=model, vocab_size=8192 if options.shape == "cpu-demo" else 151936
    )
    ttft: list[list[float]] = []
    tpot: list[list[float]] = []
    began = time.monotonic()
    for n in range(options.engines):
        with Engine(model, args, work / f"engine-{n}", launcher=ProcessLauncher()) as engine:
            engine.wait_healthy(900)
            row_ttft, row_tpot = [], []
            for i in range(options.requests):
                # One at a time; distinct prompts (index i) so the prefix cache never helps.
                request = Request(0.0, options.input_tokens, options.output_tokens)
                result = replay_in_process(
                    engine.base_url,
                    [request],
                    dataclasses.replace(settings, seed=n * 1000 + i),
                )
                r = result.results[0]
                row_ttft.append(r.ttft_s or float("nan"))
                row_tpot.append(r.tpot_s or float("nan"))
            ttft.append(row_ttft)
            tpot.append(row_tpot)
            print(
                f"engine {n}: TTFT first {row_ttft[0] * 1000:.0f} ms, "
                f"last {row_ttft[-1] * 1000:.0f} ms",
                flush=True,
            )

    print(f"\nper-position median over {options.engines} fresh engines")
    print(f"{'#':>3} {'TTFT ms':>9} {'TPOT ms':>9}")
    med_ttft = [statistics.median(col) for col in zip(*ttft, strict=True)]
    med_tpot = [statistics.median(col) for col in zip(*tpot, strict=True)]
    for i, (a, b) in enumerate(zip(med_ttft, med_tpot, strict=True)):
        print(f"{i:>3} {a * 1000:9.1f} {b * 1000:9.2f}")
    for name, series in (("TTFT", med_ttft), ("TPOT", med_tpot)):
        index, steady = settle_index(series, options.tolerance)
        print(
            f"{name}: steady {steady * 1000:.1f} ms; "
            f"inside the warm range (+-{options.tolerance:.0%}) from "
            f"request {index} on (first request {series[0] / steady:.1f}x steady)"
        )
    print(
        f"\ntook {time.monotonic() - began:.0f} s; rerun: python benchmarks/warmup.py "
        f"--engines {options.engines} --requests {options.requests} --shape {options.shape}"
        + (" --eager" if options.eager else "")
    )


if __name__ == "__main__":
    main()
