"""Open-loop replay of a trace against an OpenAI-compatible ``/v1/completions`` endpoint.

The only asynchronous code in tuner. Each request is sent at its trace time, whatever the server
is doing, and streamed so that the time to the first token is seen. vLLM's ``/metrics`` is read
before, during (for the gauges) and after the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from tuner.metrics import RequestResult
from tuner.prompts import prompt_token_ids
from tuner.trace import Request

logger = logging.getLogger(__name__)

Clock = Callable[[], float]


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


@dataclass
class ReplayResult:
    """What one replay saw: per-request results and the raw ``/metrics`` texts."""

    results: list[RequestResult]
    duration_s: float
    metrics_before: str = ""
    metrics_after: str = ""
    metrics_during: list[str] = field(default_factory=list)


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


async def _send(
    client: httpx.AsyncClient,
    body: bytes,
    request: Request,
    scheduled_s: float,
    start: float,
    clock: Clock,
) -> RequestResult:
    sent = clock()
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
                    break
                chunk = json.loads(data)
                if chunk.get("choices"):
                    if ttft_s is None:
                        ttft_s = clock() - sent
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


async def _scrape(client: httpx.AsyncClient) -> str:
    try:
        response = await client.get("/metrics", timeout=10.0)
    except httpx.HTTPError as exc:
        logger.warning("reading /metrics failed: %s", exc)
        return ""
    return response.text if response.status_code == 200 else ""


async def _sample_gauges(
    client: httpx.AsyncClient, interval_s: float, into: list[str], stop: asyncio.Event
) -> None:
    while not stop.is_set():
        into.append(await _scrape(client))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)


async def replay_async(
    base_url: str,
    requests: Sequence[Request],
    settings: ReplaySettings,
    clock: Clock = time.perf_counter,
) -> ReplayResult:
    """Send every request at its arrival time and wait for all of them to finish."""
    bodies = [request_body(i, r, settings) for i, r in enumerate(requests)]
    timeout = httpx.Timeout(settings.request_timeout_s, connect=30.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits) as client:
        before = await _scrape(client)
        during: list[str] = []
        stop = asyncio.Event()
        sampler = asyncio.create_task(
            _sample_gauges(client, settings.gauge_interval_s, during, stop)
        )
        tasks: list[asyncio.Task[RequestResult]] = []
        start = clock()
        for request, body in zip(requests, bodies, strict=True):
            delay = start + request.arrival_s - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(
                asyncio.create_task(_send(client, body, request, request.arrival_s, start, clock))
            )
        done, pending = (
            await asyncio.wait(tasks, timeout=settings.drain_timeout_s)
            if tasks
            else (
                set(),
                set(),
            )
        )
        for task in pending:
            task.cancel()
        duration_s = clock() - start
        stop.set()
        await sampler
        after = await _scrape(client)
    results = []
    for request, task in zip(requests, tasks, strict=True):
        if task in done:
            results.append(task.result())
        else:
            results.append(
                RequestResult(
                    request.arrival_s,
                    request.arrival_s,
                    request.input_tokens,
                    request.output_tokens,
                    error=f"not finished within the {settings.drain_timeout_s:g} s drain timeout",
                )
            )
    return ReplayResult(results, duration_s, before, after, during)


def replay(
    base_url: str,
    requests: Sequence[Request],
    settings: ReplaySettings,
    clock: Clock = time.perf_counter,
) -> ReplayResult:
    """Blocking wrapper around ``replay_async``."""
    return asyncio.run(replay_async(base_url, requests, settings, clock))
