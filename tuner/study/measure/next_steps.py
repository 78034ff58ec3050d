"""What to do when no trial met the SLOs: relax them, or add servers (roughly how many).

Pure: builds text from what the closest trial measured and the rate the replay window offered.
The servers figure is rough on purpose, and says what it rests on: the window's offered rate
over the rate one server of the closest configuration completed requests at, shown to three
significant digits and rounded up as shown (1.02 / 1.02 = 1 is one server).

No figure is given where more servers would not help, and the text says why instead:
- every SLO missed is one that a request's own work misses with the queue taken away (a TTFT
  SLO under vLLM's prefill time at the same percentile: more servers shorten the wait for a
  slot, not the prefill);
- vLLM queued no request and the trial kept up (it completed the window's rate, or every
  request with the last one no later after the replay's end than its e2e p99): it ran below
  what it carries and missed anyway.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.study.measure.scoring import Miss


@dataclass(frozen=True)
class Offered:
    """What an open-loop replay asked of a server: its window's requests over its seconds."""

    requests: int
    replay_s: float

    @property
    def req_per_s(self) -> float:
        return self.requests / self.replay_s if self.replay_s > 0 else 0.0


def shown_ratio(offered_req_per_s: float, served_req_per_s: float) -> float:
    """The offered rate over the completed one, to three significant digits, as the text shows
    it: 1.0000000000000002 is 1."""
    return float(f"{offered_req_per_s / served_req_per_s:.3g}")


def servers_needed(offered_req_per_s: float, served_req_per_s: float) -> int:
    """Servers like the measured one that complete the offered rate, if throughput adds up: the
    ratio as shown rounded up, so that one shown as 1 (1.02 / 1.02) is one server, not two."""
    return max(1, math.ceil(shown_ratio(offered_req_per_s, served_req_per_s)))


def ratio_text(offered_req_per_s: float, served_req_per_s: float) -> str:
    """``10 / 2.5 = 4``: the rates to the fewest significant digits (three at least) whose
    quotient shows as the ratio shown, so that the arithmetic reads true (``1.025 / 1.015 =
    1.01``, not ``1.02 / 1.02 = 1.01``)."""
    ratio = shown_ratio(offered_req_per_s, served_req_per_s)
    for digits in range(3, 9):
        offered, served = f"{offered_req_per_s:.{digits}g}", f"{served_req_per_s:.{digits}g}"
        if float(served) > 0 and shown_ratio(float(offered), float(served)) == ratio:
            break
    return f"{offered} / {served} = {ratio:g}"


def drain_s(measured: Mapping[str, Any], offered: Offered) -> float | None:
    """How long after the replay's end the trial's last request completed, where it completed
    every request; None where it did not, or the figures are missing."""
    requests, ok = measured.get("requests"), measured.get("requests_ok")
    duration_s = measured.get("duration_s")
    if not (
        isinstance(requests, int | float)
        and isinstance(ok, int | float)
        and isinstance(duration_s, int | float)
    ):
        return None
    if requests <= 0 or ok != requests:
        return None
    return max(0.0, duration_s - offered.replay_s)


def beyond_servers(misses: Sequence[Miss], measured: Mapping[str, Any]) -> list[Miss]:
    """The misses that more servers would not fix: those a request's own work misses with the
    queue taken away. A TTFT SLO under vLLM's mean prefill time is one (a request's TTFT is its
    wait in the queue and its prefill; more servers shorten the wait, not the prefill).

    The mean, vLLM's sum over its count, is exact; the histogram's percentiles are not (the H100
    study's prefill p95 read 285 ms, interpolated in the bucket up to 300 ms, where the client's
    whole TTFT p95 was 78 ms).
    """
    prefill_s = measured.get("server_prefill_mean_s")
    if not isinstance(prefill_s, int | float):
        return []
    return [
        m
        for m in misses
        if m.metric.startswith("ttft_") and m.limit is not None and prefill_s > m.limit
    ]


def next_steps(
    trial_number: int,
    measured: Mapping[str, Any],
    offered: Offered | None,
    spec_path: Path,
    misses: Sequence[Miss] = (),
) -> list[str]:
    """What a person can do next, with the rates that the servers figure rests on; ``misses``
    are the SLOs the trial missed (``tuner.study.measure.scoring.verdict``)."""
    lines = [
        f"next: relax the SLOs in {spec_path} and search again under a new --study (trials keep "
        "the verdict they were measured with), or add servers where they would help:"
    ]
    served = measured.get("throughput_req_per_s")
    shown_served = (
        f"trial {trial_number} completed {served:.2f} req/s (its completed requests over the "
        "seconds from the window's start to its last completion, the drain included)"
        if isinstance(served, int | float)
        else f"trial {trial_number} has no throughput figure"
    )
    if offered is None:
        lines.append(
            f"  {shown_served}; the replay was closed-loop (a concurrency trace), so its rate "
            "followed the server and gives no servers figure"
        )
        return lines
    lines.append(
        f"  the window offers {offered.req_per_s:.2f} req/s ({offered.requests} requests over "
        f"its {offered.replay_s:.1f} s replay); {shown_served}"
    )
    if isinstance(served, int | float) and served > 0:
        lines.append(_servers_line(f"trial {trial_number}", measured, offered, served, misses))
    return lines


def _servers_line(
    trial: str, measured: Mapping[str, Any], offered: Offered, served: float, misses: Sequence[Miss]
) -> str:
    """Whether more servers would help ``trial``'s misses, and roughly how many."""
    beyond = beyond_servers(misses, measured)
    if misses and len(beyond) == len(misses):
        return f"  no servers figure: more servers would not fix {trial}'s misses: " + _prefill(
            beyond, measured
        )
    kept_up = _kept_up(trial, measured, offered, served)
    if kept_up is not None:
        return f"  no servers figure: {kept_up}"
    count = servers_needed(offered.req_per_s, served)
    ratio = f"offered / completed: {ratio_text(offered.req_per_s, served)}"
    if count == 1:
        text = (
            f"  one server like {trial} completes the window's rate ({ratio}): it lacks no "
            "throughput, so more servers would help only by giving each a lighter load"
        )
    else:
        text = (
            f"  roughly {count} servers like {trial} ({ratio}, rounded up: assumes the load "
            f"splits evenly and each server completes what {trial} did)"
        )
    waiting = measured.get("waiting_peak")
    if waiting == 0:
        text += "; vLLM queued no request (waiting 0 in every sample)"
    elif isinstance(waiting, int | float):
        text += f"; vLLM's waiting queue peaked at {waiting:.0f}"
    if beyond:
        text += "; more servers would not fix every miss, though: " + _prefill(beyond, measured)
    return text


def _prefill(beyond: Sequence[Miss], measured: Mapping[str, Any]) -> str:
    """Why more servers would not fix the TTFT misses ``beyond``."""
    slos = " and ".join(f"the {m.metric} SLO of {_time(m.limit or 0.0)}" for m in beyond)
    queue_s = measured.get("server_queue_mean_s")
    waited = ""
    if isinstance(queue_s, int | float) and queue_s > 0:
        waited = f" ({_time(queue_s)} a request on average)"
    return (
        f"vLLM's prefill alone, its queue aside, took {_time(measured['server_prefill_mean_s'])} "
        f"a request on average, more than {slos}; more servers shorten the wait in vLLM's "
        f"queue{waited}, not the prefill"
    )


def _kept_up(
    trial: str, measured: Mapping[str, Any], offered: Offered, served: float
) -> str | None:
    """Why no servers figure, where vLLM queued no request and ``trial`` kept up: it completed
    every request, the last no later after the replay's end than its e2e p99 (a longer drain
    is a backlog), or the window's rate as shown; else None."""
    if measured.get("waiting_peak") != 0:
        return None
    text = f"vLLM queued no request (waiting 0 in every sample) and {trial} kept up"
    drained_s, e2e_s = drain_s(measured, offered), measured.get("e2e_p99_s")
    drained = drained_s is not None and isinstance(e2e_s, int | float) and drained_s <= e2e_s
    if drained and served < offered.req_per_s:
        done, asked = _apart(served, offered.req_per_s)
        text += (
            f": it completed all {measured['requests']:.0f} requests, the last {drained_s:.2f} s "
            f"after the replay ended, within its e2e p99 ({e2e_s:.2f} s), so its {done} req/s is "
            f"under the {asked} offered only by that drain"
        )
    elif servers_needed(offered.req_per_s, served) == 1:
        text += f" (offered / completed: {ratio_text(offered.req_per_s, served)})"
    else:
        return None
    return text + (
        "; it ran below what it carries and missed the SLOs anyway: its misses are each "
        "request's own time with nothing queued, which more servers would not remove (they "
        "would only make each one's batch smaller)"
    )


def _time(seconds: float) -> str:
    """``30.5 s``, ``250 ms``, ``1 ms``."""
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1000:.3g} ms"


def _apart(low: float, high: float) -> tuple[str, str]:
    """Two different rates with the fewest decimals (two at least, six at most) that tell
    them apart: ``1.021`` and ``1.025``, not ``1.02`` twice."""
    for digits in range(2, 7):
        if f"{low:.{digits}f}" != f"{high:.{digits}f}":
            break
    return f"{low:.{digits}f}", f"{high:.{digits}f}"
