"""vLLM's prefix cache primed with what a server that had served the trace would hold.

A window replayed on an empty prefix cache measures a server that has just started. Where the
trace records shared prompt blocks (``hash_ids``), a production server that served the trace up
to the window holds many of the window's blocks already: in Mooncake's trace, 96% of the 512-
token blocks of its busiest minute appear earlier in the trace, while only 7 to 8% repeat inside
a 10 s replay of it. So before a measured replay, each of the window's prompts whose leading
blocks the trace sent before the window (``ReplaySettings.cached_ids``) has those blocks sent
once, as a prompt of one output token, with the replay's own seed (equal ids, equal tokens).
vLLM's own cache decides what stays: a KV cache too small for all of them keeps the most recent,
as the production server's would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tuner.load.http import ReplaySettings
from tuner.load.spread import replay
from tuner.traces.model import Request


def priming_requests(
    requests: Sequence[Request], cached_ids: frozenset[int], block_tokens: int
) -> list[Request]:
    """One request of one output token per prefix to prime: for each of ``requests``, its
    leading whole blocks (within its prompt) whose hash ids are all in ``cached_ids``; a prefix
    that another one begins with is left out (sending the longer caches both)."""
    if not cached_ids or block_tokens <= 0:
        return []
    chains: set[tuple[int, ...]] = set()
    for request in requests:
        whole = request.hash_ids[: request.input_tokens // block_tokens]
        cached = 0
        for hash_id in whole:
            if hash_id not in cached_ids:
                break
            cached += 1
        if cached:
            chains.add(tuple(whole[:cached]))
    # Sorted, a chain that another begins with comes right before one that does.
    ordered = sorted(chains)
    following = [*ordered[1:], ()]
    longest = [c for c, after in zip(ordered, following, strict=True) if after[: len(c)] != c]
    return [Request(0.0, len(chain) * block_tokens, 1, chain) for chain in longest]


def prime(base_url: str, requests: Sequence[Request], settings: ReplaySettings) -> int:
    """Send the ``priming_requests`` of the window ``requests``, replayed with ``settings``
    (their seed gives the blocks the window's prompts will have), all at once, and wait until
    every one has finished; the prompt tokens sent (0: nothing to prime)."""
    primes = priming_requests(requests, settings.cached_ids, settings.block_tokens)
    if primes:
        replay(base_url, primes, replace(settings, client_procs=1))
    return sum(p.input_tokens for p in primes)
