"""vLLM's prefix cache primed with what a server that had served the trace would hold.

A window replayed on an empty prefix cache measures a server that has just started. Where the
trace records shared prompt blocks (``hash_ids``), a production server that served the trace up
to the window holds many of the window's blocks already: in Mooncake's trace, 96% of the 512-
token blocks of its busiest minute appear earlier in the trace, while only 7 to 8% repeat inside
a 10 s replay of it. So before a measured replay, each of the window's prompts whose leading
blocks the trace sent before the window (``ReplaySettings.cached_ids``) has those blocks sent
once, as a prompt of one output token; those blocks are drawn from the study's seed whatever
the window's own (``ReplaySettings.history_seed``), so a server primed for one window finds
them again for the next, and primes after the first cost little. vLLM's own cache decides what
stays: a KV cache too small for all of them keeps the most recent, as the production server's
would.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tuner.load.http import ReplaySettings
from tuner.load.metrics import SERVER_COUNTERS, parse_scrape
from tuner.load.spread import replay
from tuner.traces.model import Request

# vLLM's counter of prompt tokens found in its prefix cache, by the name a window's figures read.
_HITS = dict(SERVER_COUNTERS)["server_prefix_cache_hits"]
# How primes are built and kept, in a study's fingerprint (``tuner.study.trials.fingerprint``):
# raised when that changes what a window finds cached, so that a study measured one way is not
# continued another. 2: history blocks from the study's seed, kept between rates, a prompt's
# last partial block primed as far as it reaches.
PRIMING = 2


@dataclass(frozen=True)
class Primed:
    """What priming sent: prompt tokens, how many of them vLLM found in its prefix cache already
    (None where its ``/metrics`` could not be read), and how long it took."""

    tokens: int = 0
    found_tokens: float | None = None
    seconds: float = 0.0

    def figures(self) -> dict[str, float]:
        """The rate's figures of it: ``prefix_primed_tokens``, ``prefix_primed_found_tokens``
        (where known) and ``prefix_prime_s``."""
        out = {"prefix_primed_tokens": float(self.tokens), "prefix_prime_s": self.seconds}
        if self.found_tokens is not None:
            out["prefix_primed_found_tokens"] = self.found_tokens
        return out


def priming_requests(
    requests: Sequence[Request], cached_ids: frozenset[int], block_tokens: int
) -> list[Request]:
    """One request of one output token per prefix to prime: for each of ``requests``, its
    leading blocks whose hash ids are all in ``cached_ids``, as far into its prompt as they
    reach (a prompt's last block is often part of one: so much of it is primed as the longest
    of the prompts that end there holds); a prefix that another one begins with is left out
    (sending the longer caches both)."""
    if not cached_ids or block_tokens <= 0:
        return []
    chains: dict[tuple[int, ...], int] = {}
    for request in requests:
        cached = 0
        for hash_id in request.hash_ids[: -(-request.input_tokens // block_tokens)]:
            if hash_id not in cached_ids:
                break
            cached += 1
        if cached:
            chain = request.hash_ids[:cached]
            tokens = min(cached * block_tokens, request.input_tokens)
            chains[chain] = max(tokens, chains.get(chain, 0))
    # Sorted, a chain that another begins with comes right before one that does; the longer
    # one holds the shorter's last block whole.
    ordered = sorted(chains)
    following = [*ordered[1:], ()]
    longest = [c for c, after in zip(ordered, following, strict=True) if after[: len(c)] != c]
    return [Request(0.0, chains[chain], 1, chain) for chain in longest]


def prime(base_url: str, requests: Sequence[Request], settings: ReplaySettings) -> Primed:
    """Send the ``priming_requests`` of the window ``requests``, replayed with ``settings``
    (the blocks the window's prompts will have), all at once, and wait until every one has
    finished (``Primed()``: nothing to prime)."""
    primes = priming_requests(requests, settings.cached_ids, settings.block_tokens)
    if not primes:
        return Primed()
    began = time.monotonic()
    result = replay(base_url, primes, replace(settings, client_procs=1))
    seconds = time.monotonic() - began
    before, after = parse_scrape(result.metrics_before), parse_scrape(result.metrics_after)
    found = None
    if _HITS in before.values and _HITS in after.values:
        found = after.values[_HITS] - before.values[_HITS]
    return Primed(sum(p.input_tokens for p in primes), found, seconds)
