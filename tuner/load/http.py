"""Streamed completions over HTTP: the body of one request and the client that times it.

Each request streams, so that the time to its first token is seen; its output length is forced
(``max_tokens``, ``min_tokens``, ``ignore_eos``) so that it matches the trace. A request that
fails, however it fails, comes back as a ``RequestResult`` with its error: it is data.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from tuner.load.metrics import LiveRequest, RequestResult
from tuner.load.prompts import prompt_token_ids
from tuner.traces.model import Request

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


async def send(
    client: httpx.AsyncClient,
    body: bytes,
    request: Request,
    scheduled_s: float,
    start: float,
    clock: Clock,
    live: LiveRequest | None = None,
) -> RequestResult:
    sent = clock()
    if live is not None:
        live.sent_s = sent - start
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
                chunk = json.loads(data)
                if chunk.get("choices"):
                    if ttft_s is None:
                        ttft_s = clock() - sent
                        if live is not None:
                            live.first_token_s = ttft_s + live.sent_s
                    tokens += 1
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens")
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
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
    if live is not None:
        live.done_s = e2e_s + live.sent_s
    received = usage_tokens if usage_tokens is not None else tokens
    error = None
    if received != request.output_tokens:
        error = f"short output: {received} of {request.output_tokens} tokens"
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
