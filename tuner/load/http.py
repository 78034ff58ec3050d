"""Streamed completions over HTTP: the body of one request and the client that times it.

Each request streams, so that the time to its first token is seen; its output length is forced
(``max_tokens``, ``min_tokens``, ``ignore_eos``) so that it matches the trace. A request that
fails, however it fails, comes back as a ``RequestResult`` with its error: it is data.

What a request is on the wire is an ``Exchange``'s: its path, its body, how its response is
read. vLLM's OpenAI completions (``OpenAICompletions``) are the default; an application's own
endpoint is a ``tuner.load.template.RequestTemplate``.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from tuner.load.metrics import LiveRequest, RequestResult
from tuner.load.prompts import prompt_token_ids
from tuner.traces.model import Request

logger = logging.getLogger(__name__)

Clock = Callable[[], float]

# The moment the request's bytes were written: the transport's trace hook (aiohttp's, on the same
# task as ``send``) fills the holder that ``send`` puts here, with ``send``'s own clock.
_WRITTEN: contextvars.ContextVar[list[Any]] = contextvars.ContextVar("tuner_written")


async def _written(*_: object) -> None:
    holder = _WRITTEN.get(None)
    if holder is not None:
        holder[1] = holder[0]()


def make_client(base_url: str, settings: ReplaySettings) -> httpx.AsyncClient:
    """The replay's HTTP client: httpx over aiohttp's transport.

    httpx's own transport (httpcore over anyio) spent about half of a replay's CPU reading
    streamed events, in anyio's per-read overhead: one process was faithful to about 40 req/s of
    the story's shape on two cores. aiohttp's reads cost about half as much
    (``benchmarks/replay_fidelity.py``). Its pool has no limit (in flight is what the trace
    says), and its trace hook tells ``send`` when each request's bytes were written.
    """
    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(_written)
    trace.on_request_chunk_sent.append(_written)
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, force_close=False),
        trace_configs=[trace],
    )
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=httpx.Timeout(settings.request_timeout_s, connect=30.0),
        transport=AiohttpTransport(client=session),
    )


class Exchange(Protocol):
    """One kind of request: the ``path`` it is posted to, the body of the window's ``index``-th
    request (``payload``), and how its response is read into a ``Received`` (``receive``, which
    raises ``ValueError`` for a response it cannot read)."""

    @property
    def path(self) -> str: ...

    def payload(self, index: int, request: Request, settings: ReplaySettings) -> bytes: ...

    async def receive(
        self,
        response: httpx.Response,
        got: Received,
        clock: Clock,
        sent: float,
        live: LiveRequest | None,
    ) -> None: ...


@dataclass(frozen=True)
class ReplaySettings:
    """How to talk to the server: which model, how long to wait, how often to read gauges."""

    model: str
    vocab_size: int
    block_tokens: int = 0
    seed: int = 0
    # The longest a stream may stay silent (no byte from the server) before its request fails.
    request_timeout_s: float = 600.0
    drain_timeout_s: float = 600.0
    gauge_interval_s: float = 1.0
    monitor_interval_s: float = 1.0
    # Client processes an open-loop replay is spread over (``tuner.load.spread``).
    client_procs: int = 1
    # What a request is on the wire: vLLM's completions unless the server is the user's own.
    exchange: Exchange = field(default_factory=lambda: OPENAI_COMPLETIONS)
    # Hash ids of shared prompt blocks that the server's prefix cache is primed with before a
    # measured replay (``tuner.load.priming``): those the trace sent before its window.
    cached_ids: frozenset[int] = frozenset()
    # The seed of those blocks' tokens: the study's, whatever ``seed`` a window replays with, so
    # the blocks one window primed are found by the next (``prompt_token_ids``).
    history_seed: int = 0

    def prompt(self, index: int, request: Request) -> list[int]:
        """The token ids of the replay's ``index``-th request."""
        return prompt_token_ids(
            index,
            request,
            self.vocab_size,
            self.block_tokens,
            self.seed,
            self.cached_ids,
            self.history_seed,
        )


def request_body(index: int, request: Request, settings: ReplaySettings) -> bytes:
    """The JSON body of one streamed completion with forced output length."""
    body = {
        "model": settings.model,
        "prompt": settings.prompt(index, request),
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


async def event_lines(response: httpx.Response) -> AsyncIterator[bytes]:
    """The lines of a streamed body, split here: httpx's ``aiter_lines`` decodes to text and
    passes every line through two more generators, which a replay pays for at every token."""
    rest = b""
    async for data in response.aiter_bytes():
        *lines, rest = (rest + data).split(b"\n")
        for line in lines:
            yield line
    if rest:
        yield rest


def read_chunk(data: str | bytes) -> tuple[bool, int | None]:
    """Whether one event's JSON carries a choice (a token), and the ``completion_tokens`` its
    ``usage`` reports (None where it reports none).

    Raises ``ValueError`` (``MalformedChunk``, or ``json``'s own) for anything else: JSON that is
    not an object, ``choices`` that is not an array, ``usage`` that is not an object, a count that
    is not an integer.
    """
    chunk = json.loads(data)
    if isinstance(data, bytes):
        data = data.decode(errors="replace")
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


def _since(written: list[Any], start: float) -> float | None:
    return None if written[1] is None else written[1] - start


@dataclass(slots=True)
class Received:
    """What a streamed response has brought so far: the first token's time, the tokens
    counted, and the count the server's usage chunk gave."""

    ttft_s: float | None = None
    tokens: int = 0
    usage_tokens: int | None = None


async def _receive(
    response: httpx.Response,
    got: Received,
    clock: Clock,
    sent: float,
    live: LiveRequest | None,
) -> None:
    """Read the response's server-sent events into ``got`` until the body ends."""
    async for line in event_lines(response):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            # Read on to the end of the body: a connection closed mid-body cannot be reused,
            # and a new one per request costs the replay loop dearly.
            continue
        token, count = read_chunk(data)
        if token:
            first_token(got, clock, sent, live)
        if count is not None:
            got.usage_tokens = count


@dataclass(frozen=True)
class OpenAICompletions:
    """vLLM's OpenAI completions: ``request_body`` posted to ``/v1/completions``, its
    server-sent chunks read by ``read_chunk``."""

    path: str = "/v1/completions"

    def payload(self, index: int, request: Request, settings: ReplaySettings) -> bytes:
        return request_body(index, request, settings)

    async def receive(
        self,
        response: httpx.Response,
        got: Received,
        clock: Clock,
        sent: float,
        live: LiveRequest | None,
    ) -> None:
        await _receive(response, got, clock, sent, live)


OPENAI_COMPLETIONS: Exchange = OpenAICompletions()


def body_of(index: int, request: Request, settings: ReplaySettings) -> bytes:
    """The body of the window's ``index``-th request, as the settings' exchange puts it."""
    return settings.exchange.payload(index, request, settings)


def first_token(got: Received, clock: Clock, sent: float, live: LiveRequest | None) -> None:
    """Note a token received now: the first one's time goes to ``got`` and to ``live``."""
    if got.ttft_s is None:
        got.ttft_s = clock() - sent
        if live is not None:
            live.first_token_s = got.ttft_s + live.sent_s
    got.tokens += 1
    if live is not None:
        live.tokens += 1


def _failure(client: httpx.AsyncClient, exc: Exception) -> str:
    """A failed request's error text.

    Transport and protocol errors (httpx.HTTPError) and malformed chunks (ValueError) are what
    a misbehaving server causes. Anything else is unexpected (httpx's own stream errors, a
    bug): still one failed request, but logged with its traceback."""
    if not isinstance(exc, httpx.HTTPError | ValueError):
        logger.warning("request failed unexpectedly", exc_info=True)
    # The transport maps aiohttp's errors onto httpx's loosely (a server that hung up in the
    # headers comes back as a ConnectTimeout): aiohttp's own says what happened.
    shown = exc.__cause__ if isinstance(exc.__cause__, aiohttp.ClientError) else exc
    failure = f"{type(shown).__name__}: {shown}"
    if isinstance(exc, httpx.ReadTimeout):
        silent_s = client.timeout.read or 0.0
        failure = f"stalled: nothing from the server for {silent_s:g} s ({failure})"
    return failure


async def send(
    client: httpx.AsyncClient,
    body: bytes,
    request: Request,
    scheduled_s: float,
    start: float,
    clock: Clock,
    live: LiveRequest | None = None,
    exchange: Exchange = OPENAI_COMPLETIONS,
) -> RequestResult:
    """Send one request (where and how its response is read: ``exchange``'s) and time it;
    whatever fails, the request comes back with its error.

    Only cancellation (how a replay stops early) and the interpreter's own exits
    (``KeyboardInterrupt``, ``SystemExit``) propagate. ``live`` is told when the request was
    sent, when its first token came, and when it was done if it succeeded; a failed request is
    never done there, so that the pruner's figures count it as a miss, as the final ones do.
    """
    sent = clock()
    written = [clock, None]
    _WRITTEN.set(written)
    if live is not None:
        live.sent_s = sent - start
        live.sent = True
    got = Received()
    # Every outcome names the request by its schedule, its send time and its lengths.
    result = partial(
        RequestResult, scheduled_s, sent - start, request.input_tokens, request.output_tokens
    )
    try:
        async with client.stream(
            "POST", exchange.path, content=body, headers={"content-type": "application/json"}
        ) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:300]
                status = f"HTTP {response.status_code}: {text}"
                return result(error=status, written_s=_since(written, start))
            await exchange.receive(response, got, clock, sent, live)
    except Exception as exc:
        return result(
            ttft_s=got.ttft_s,
            tokens_received=got.tokens,
            error=_failure(client, exc)[:300],
            written_s=_since(written, start),
        )
    e2e_s = clock() - sent
    received = got.usage_tokens if got.usage_tokens is not None else got.tokens
    error: str | None = None
    if received != request.output_tokens:
        error = f"short output: {received} of {request.output_tokens} tokens"
    elif live is not None:
        live.done_s = e2e_s + live.sent_s
    return result(
        ttft_s=got.ttft_s,
        e2e_s=e2e_s,
        tokens_received=received,
        error=error,
        written_s=_since(written, start),
    )
