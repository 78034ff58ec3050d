"""Streamed completions over HTTP: the body of one request and the client that times it.

Each request streams, so that the time to its first token is seen; its output length is forced
(``max_tokens``, ``min_tokens``, ``ignore_eos``) so that it matches the trace. A request that
fails, however it fails, comes back as a ``RequestResult`` with its error: it is data.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from tuner.load.metrics import LiveRequest, RequestResult
from tuner.load.prompts import prompt_token_ids
from tuner.traces.model import Request

logger = logging.getLogger(__name__)

Clock = Callable[[], float]

# Connection pools a replay spreads its requests over. httpcore (1.0.9) scans every connection
# of a pool, and for idle ones every connection again, each time a request starts or ends; with
# hundreds of streams in flight that bookkeeping starved the send loop (2 s streams at 200 req/s
# on two cores: send lag p99 6.5 s with one pool, 57 ms with 16; benchmarks/replay_fidelity.py
# --hold-s 2).
POOLS = 16


@dataclass(frozen=True)
class ReplaySettings:
    """How to talk to the server: which model, how long to wait, how often to read gauges."""

    model: str
    vocab_size: int
    block_tokens: int = 0
    seed: int = 0
    request_timeout_s: float = 600.0
    drain_timeout_s: float = 600.0
    gauge_interval_s: float = 1.0
    monitor_interval_s: float = 1.0


def request_body(index: int, request: Request, settings: ReplaySettings) -> bytes:
    """The JSON body of one streamed completion with forced output length."""
    body = {
        "model": settings.model,
        "prompt": prompt_token_ids(
            index, request, settings.vocab_size, settings.block_tokens, settings.seed
        ),
        "max_tokens": request.output_tokens,
        "min_tokens": request.output_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return json.dumps(body, separators=(",", ":")).encode()


class MalformedChunk(ValueError):
    """A server-sent event of the stream that is not shaped as a completion chunk."""


JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}


def json_type(value: object) -> str:
    """What a value read by ``json.loads`` was in the JSON: ``an array``, ``null``."""
    if value is None:
        return "null"
    return JSON_TYPES.get(type(value), "a number")


def read_chunk(data: str) -> tuple[bool, int | None]:
    """Whether one event's JSON carries a choice (a token), and the ``completion_tokens`` its
    ``usage`` reports (None where it reports none).

    Raises ``ValueError`` (``MalformedChunk``, or ``json``'s own) for anything else: JSON that is
    not an object, ``choices`` that is not an array, ``usage`` that is not an object, a count that
    is not an integer.
    """
    chunk = json.loads(data)
    if not isinstance(chunk, dict):
        raise MalformedChunk(f"{json_type(chunk)}, not an object: {data[:100]}")
    choices = chunk.get("choices")
    if choices is not None and not isinstance(choices, list):
        raise MalformedChunk(f"choices is {json_type(choices)}, not an array: {data[:100]}")
    usage = chunk.get("usage")
    if usage is None:
        return bool(choices), None
    if not isinstance(usage, dict):
        raise MalformedChunk(f"usage is {json_type(usage)}, not an object: {data[:100]}")
    count = usage.get("completion_tokens")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool)):
        raise MalformedChunk(
            f"completion_tokens is {json_type(count)}, not an integer: {data[:100]}"
        )
    return bool(choices), count


async def send(
    client: httpx.AsyncClient,
    body: bytes,
    request: Request,
    scheduled_s: float,
    start: float,
    clock: Clock,
    live: LiveRequest | None = None,
) -> RequestResult:
    """Send one request and time it; whatever fails, the request comes back with its error.

    Only cancellation (how a replay stops early) and the interpreter's own exits
    (``KeyboardInterrupt``, ``SystemExit``) propagate. ``live`` is told when the request was
    sent, when its first token came, and when it was done if it succeeded; a failed request is
    never done there, so that the pruner's figures count it as a miss, as the final ones do.
    """
    sent = clock()
    if live is not None:
        live.sent_s = sent - start
        live.sent = True
    ttft_s: float | None = None
    tokens = 0
    usage_tokens: int | None = None
    try:
        async with client.stream(
            "POST",
            "/v1/completions",
            content=body,
            headers={"content-type": "application/json"},
        ) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:300]
                return RequestResult(
                    scheduled_s,
                    sent - start,
                    request.input_tokens,
                    request.output_tokens,
                    error=f"HTTP {response.status_code}: {text}",
                )
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    # Read on to the end of the body: a connection closed mid-body cannot
                    # be reused, and a new one per request costs the replay loop dearly.
                    continue
                token, count = read_chunk(data)
                if token:
                    if ttft_s is None:
                        ttft_s = clock() - sent
                        if live is not None:
                            live.first_token_s = ttft_s + live.sent_s
                    tokens += 1
                if count is not None:
                    usage_tokens = count
    except Exception as exc:
        # Transport and protocol errors (httpx.HTTPError) and malformed chunks (ValueError) are
        # what a misbehaving server causes. Anything else is unexpected (httpx's own stream
        # errors, a bug): still one failed request, but logged with its traceback.
        if not isinstance(exc, httpx.HTTPError | ValueError):
            logger.warning("request failed unexpectedly", exc_info=True)
        return RequestResult(
            scheduled_s,
            sent - start,
            request.input_tokens,
            request.output_tokens,
            ttft_s=ttft_s,
            tokens_received=tokens,
            error=f"{type(exc).__name__}: {exc}"[:300],
        )
    e2e_s = clock() - sent
    received = usage_tokens if usage_tokens is not None else tokens
    error = None
    if received != request.output_tokens:
        error = f"short output: {received} of {request.output_tokens} tokens"
    elif live is not None:
        live.done_s = e2e_s + live.sent_s
    return RequestResult(
        scheduled_s,
        sent - start,
        request.input_tokens,
        request.output_tokens,
        ttft_s=ttft_s,
        e2e_s=e2e_s,
        tokens_received=received,
        error=error,
    )
