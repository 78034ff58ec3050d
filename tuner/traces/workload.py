"""From a whole trace to the requests one trial replays: window, clipping, time scale.

Every trial of a study replays exactly the same requests; this is where they are chosen.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuner.errors import InputError
from tuner.traces.model import Clipping, Request, Trace, busiest_window, clip_to_context


@dataclass(frozen=True)
class ModelInfo:
    """What replay needs to know of the served model."""

    vocab_size: int
    max_model_len: int


def model_info(
    model: str,
    max_model_len: int | None,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> ModelInfo:
    """What replay needs of ``model``: a local folder, or a Hugging Face model id resolved as vLLM
    resolves it (the Hugging Face cache under ``HF_HOME``, offline with ``HF_HUB_OFFLINE=1``, at
    ``revision``). Its config is read by transformers; an ``InputError`` where it cannot be.
    A local folder whose ``config.json`` states both figures plainly is read as JSON
    (``_plain_config``): importing transformers takes seconds that tuner would spend before its
    first line."""
    if not trust_remote_code and revision is None:
        plain = _plain_config(Path(model), max_model_len)
        if plain is not None:
            return plain
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(
            model, revision=revision, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError, KeyError) as exc:
        where = "folder" if Path(model).exists() else "Hugging Face id"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InputError(
            f"cannot read the model {model!r} (a {where}): {first}; give a model folder with a "
            "config.json, or a Hugging Face id that is in the local cache or can be downloaded"
        ) from None
    text = config.get_text_config()
    try:
        vocab_size = int(text.vocab_size)
        context = int(max_model_len or text.max_position_embeddings)
    except (AttributeError, TypeError, ValueError) as exc:
        raise InputError(f"the model {model!r}'s config lacks a usable {exc}") from None
    return ModelInfo(vocab_size=vocab_size, max_model_len=context)


def _plain_config(folder: Path, max_model_len: int | None) -> ModelInfo | None:
    """``ModelInfo`` from ``folder/config.json`` where it names no code of its own (``auto_map``)
    and its text model's ``vocab_size`` and ``max_position_embeddings`` (where ``max_model_len``
    is not given) are whole numbers: the values transformers reads for them
    (``get_text_config``: the ``text_config`` section where there is one). None where any of that
    does not hold: transformers reads it, with its aliases and defaults."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or "auto_map" in config:
        return None
    text = config.get("text_config", config)
    if not isinstance(text, dict):
        return None
    vocab_size = _whole(text.get("vocab_size"))
    context = max_model_len or _whole(text.get("max_position_embeddings"))
    if vocab_size is None or context is None:
        return None
    return ModelInfo(vocab_size=vocab_size, max_model_len=context)


def _whole(value: object) -> int | None:
    """``value`` where it is a whole number above 0 (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


@dataclass(frozen=True)
class TraceWindow:
    """The replayed window and how it was cut from the trace."""

    trace: Trace
    start_s: float
    window_s: float
    time_scale: float
    clipping: Clipping
    # Set where the replay was cut short: its seconds, fewer than the window's scaled length.
    cut_s: float | None = None
    # The window's requests before any cut (as many as ``trace`` holds where there is none).
    window_requests: int | None = None
    # The hash ids of the window's prompts that the trace sent before the window (``seen_before``).
    cached_ids: frozenset[int] = frozenset()

    @property
    def peak_req_per_s(self) -> float:
        """The window's rate in the trace's own time (unscaled, uncut)."""
        count = len(self.trace) if self.window_requests is None else self.window_requests
        return count / self.window_s if self.window_s else 0.0

    @property
    def replay_s(self) -> float:
        """How long the window lasts when replayed."""
        return self.cut_s if self.cut_s is not None else self.window_s * self.time_scale

    @property
    def offered_req_per_s(self) -> float:
        """The rate the replay sends at: the window's requests over its replayed seconds."""
        return len(self.trace) / self.replay_s if self.replay_s else 0.0

    def describe(self) -> str:
        cut = "" if self.cut_s is None else f", its first {self.cut_s:g} s"
        return (
            f"{len(self.trace)} requests from {self.start_s:.1f} s to "
            f"{self.start_s + self.window_s:.1f} s of the trace, replayed over "
            f"{self.replay_s:.1f} s (time scale {self.time_scale:g}{cut}, "
            f"{self.offered_req_per_s:.2f} req/s)"
        )


def build_workload(
    trace: Trace,
    window_s: float,
    time_scale: float,
    context: int,
    longest_replay_s: float | None = None,
) -> TraceWindow:
    """The busiest ``window_s`` seconds, clipped to the model's context, then time-scaled; with
    ``longest_replay_s``, only the requests that arrive within that many replayed seconds."""
    start_s, window = busiest_window(trace, window_s)
    if not len(window):
        raise InputError(f"{trace.source}: no requests in the replay window")
    window, clipping = clip_to_context(window, context)
    window_s = min(window_s, trace.span_s) or window_s
    scaled = window.scaled(time_scale)
    cut_s = None
    if longest_replay_s is not None and window_s * time_scale > longest_replay_s:
        scaled = scaled.window(0.0, longest_replay_s)
        cut_s = longest_replay_s
    return TraceWindow(
        trace=scaled,
        start_s=start_s,
        window_s=window_s,
        time_scale=time_scale,
        clipping=clipping,
        cut_s=cut_s,
        window_requests=len(window),
        cached_ids=seen_before(trace, start_s, window),
    )


def seen_before(trace: Trace, start_s: float, window: Trace) -> frozenset[int]:
    """The hash ids of ``window``'s prompts that requests of ``trace`` arriving before
    ``start_s`` sent already: the shared blocks a server that had served the trace up to the
    window would hold in its prefix cache, as far as its KV cache keeps them."""
    if trace.hash_ids is None or window.hash_ids is None:
        return frozenset()
    before = int(np.searchsorted(trace.arrival_s, start_s, side="left"))
    if before == 0:
        return frozenset()
    ids, offsets = trace.hash_ids.ids, trace.hash_ids.offsets
    earlier = ids[offsets[0] : offsets[before]]
    inside = window.hash_ids.ids[window.hash_ids.offsets[0] : window.hash_ids.offsets[-1]]
    if earlier.dtype == object or inside.dtype == object:  # ids beyond int64
        return frozenset(set(earlier.tolist()) & set(inside.tolist()))
    # In NumPy: a trace of a million requests holds about twelve million ids.
    return frozenset(np.intersect1d(earlier, inside).tolist())


def at_rate(
    requests: Sequence[Request],
    period_s: float,
    rate_req_per_s: float,
    duration_s: float,
    history: frozenset[int] = frozenset(),
) -> list[Request]:
    """The window's requests sent at ``rate_req_per_s`` on average for ``duration_s`` seconds.

    ``requests`` arrive over ``period_s`` (the window as replayed). All arrivals are stretched or
    squeezed by one factor, so the trace's bursts and lengths keep their shape, and the window
    is repeated end to end until ``duration_s`` is filled; a request arriving at or after it
    is left out. A repeat stands for more traffic like the window's, not the same prompts
    again: its shared blocks get hash ids of their own, but for those in ``history`` (the
    blocks the trace sent before the window, which every repeat finds cached alike).
    """
    if not requests or period_s <= 0 or rate_req_per_s <= 0 or duration_s <= 0:
        raise ValueError("at_rate needs requests, a positive period, rate and duration")
    factor = len(requests) / period_s / rate_req_per_s
    stretched_s = period_s * factor
    # Ids of a repeat: the window's shifted past every id it holds, once per repeat.
    shift = 1 + max((max(r.hash_ids, default=0) for r in requests), default=0)
    out: list[Request] = []
    copy = 0
    while copy * stretched_s < duration_s:
        offset_s = copy * stretched_s
        for request in requests:
            arrival_s = offset_s + request.arrival_s * factor
            if arrival_s >= duration_s:
                break
            ids = request.hash_ids
            if copy and ids:
                ids = tuple(h if h in history else h + copy * shift for h in ids)
            out.append(dataclasses.replace(request, arrival_s=arrival_s, hash_ids=ids))
        copy += 1
    return out
