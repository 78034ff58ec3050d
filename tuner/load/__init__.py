"""Load: replaying a window's requests against a server over HTTP, in one session whichever way
they are sent (open loop, closed loop, spread over client processes), the prompts they carry, and
what is measured (client timings and vLLM's ``/metrics``). The only asynchronous code in tuner.

The names offered to code outside tuner (``benchmarks/``, an embedding program) are in
``__all__``, each imported from its module when first used (``tuner.face``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.face import lazy

if TYPE_CHECKING:
    from tuner.load.health import client_behind
    from tuner.load.http import ReplaySettings, request_body
    from tuner.load.metrics import RequestResult, parse_scrape, replay_figures, summarize_client
    from tuner.load.open_loop import replay_in_process
    from tuner.load.spread import replay

_FACE = {
    "ReplaySettings": "tuner.load.http",
    "RequestResult": "tuner.load.metrics",
    "client_behind": "tuner.load.health",
    "parse_scrape": "tuner.load.metrics",
    "replay": "tuner.load.spread",
    "replay_figures": "tuner.load.metrics",
    "replay_in_process": "tuner.load.open_loop",
    "request_body": "tuner.load.http",
    "summarize_client": "tuner.load.metrics",
}

__all__ = [
    "ReplaySettings",
    "RequestResult",
    "client_behind",
    "parse_scrape",
    "replay",
    "replay_figures",
    "replay_in_process",
    "request_body",
    "summarize_client",
]

__getattr__, __dir__ = lazy(__name__, _FACE)
