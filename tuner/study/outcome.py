"""What to do when no trial met the SLOs: relax them, or add servers (roughly how many).

Pure: builds text from what the closest trial measured and the rate the replay window offered.
The servers figure is rough on purpose, and says what it rests on: the window's offered rate
over the rate one server of the closest configuration completed requests at.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Offered:
    """What an open-loop replay asked of a server: its window's requests over its seconds."""

    requests: int
    replay_s: float

    @property
    def req_per_s(self) -> float:
        return self.requests / self.replay_s if self.replay_s > 0 else 0.0


def servers_needed(offered_req_per_s: float, served_req_per_s: float) -> int:
    """Servers like the measured one that complete the offered rate, if throughput adds up."""
    return max(1, math.ceil(offered_req_per_s / served_req_per_s))


def next_steps(
    trial_number: int, measured: Mapping[str, Any], offered: Offered | None, spec_path: Path
) -> list[str]:
    """What a person can do next, with the rates that the servers figure rests on."""
    lines = [
        f"next: relax the SLOs in {spec_path} and search again under a new --study (trials keep "
        "the verdict they were measured with), or add servers:"
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
        count = servers_needed(offered.req_per_s, served)
        if count == 1:
            text = (
                f"  one server like trial {trial_number} completes the window's rate "
                f"({served:.2f} >= {offered.req_per_s:.2f} req/s): it lacks no throughput, so "
                "more servers would help only by giving each a lighter load"
            )
        else:
            text = (
                f"  roughly {count} servers like trial {trial_number} ({offered.req_per_s:.2f} / "
                f"{served:.2f}, rounded up: assumes the load splits evenly and each server "
                f"completes what trial {trial_number} did)"
            )
        waiting = measured.get("waiting_peak")
        if waiting == 0:
            text += (
                "; vLLM queued no request (waiting 0 in every sample), so its misses are not "
                "from a queue and more servers may not fix them"
            )
        elif isinstance(waiting, int | float):
            text += f"; vLLM's waiting queue peaked at {waiting:.0f}"
        lines.append(text)
    return lines
