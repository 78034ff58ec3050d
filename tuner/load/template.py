"""An application's own request: its path, its JSON body with the trace's lengths put in, and how
its response is read (``RequestTemplate``, an ``Exchange`` of ``tuner.load.http``).

The body is the app's, with placeholders among its values: ``{prompt}`` (the prompt, as text or
as token ids), ``{output_tokens}`` (the request's output length, a number) and ``{model}``. A
value that is a placeholder alone becomes the value itself (a number, a list of ids); one with
text around a placeholder gets it written in.

The response is read one of three ways (``stream``): ``none``, one JSON object read whole, whose
``output_tokens_field`` gives the count of tokens generated, so only the end-to-end latency is
measured; ``sse``, server-sent events (``data: ...`` lines); ``chunked``, one event per line
(JSON lines). An event is a token, its arrival the first token's time for the first one, unless
it holds only the ``output_tokens_field`` (a closing count); the count, where an event gives
it, is the last one given, else the events counted.

Text prompts are made of ``words``, pieces that the model's tokenizer reads as one token each
(``tuner.load.prompts.prompt_words``): a prompt of ``n`` token ids is ``n`` words, equal ids
giving equal words, so the trace's prefix sharing is kept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from tuner.load.http import (
    Clock,
    Received,
    ReplaySettings,
    event_lines,
    first_token,
    json_type,
)
from tuner.load.metrics import LiveRequest
from tuner.traces.model import Request

PROMPT = "{prompt}"
OUTPUT_TOKENS = "{output_tokens}"
MODEL = "{model}"
PLACEHOLDERS = (PROMPT, OUTPUT_TOKENS, MODEL)
TEXT, TOKEN_IDS = "text", "token_ids"
PROMPT_KINDS = (TEXT, TOKEN_IDS)
NONE, SSE, CHUNKED = "none", "sse", "chunked"
STREAMS = (NONE, SSE, CHUNKED)


class UnreadableResponse(ValueError):
    """A response, or an event of one, that is not shaped as the template says."""


def dig(value: Any, dotted: str) -> Any:
    """``value["a"]["b"]`` for ``"a.b"``; None where a key is missing or a level not an object."""
    for key in dotted.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


@dataclass(frozen=True)
class RequestTemplate:
    """An application's request and response, as a spec's ``server.request`` states them."""

    path: str
    body: Mapping[str, Any]
    prompt: str = TEXT
    stream: str = NONE
    # Where the response (or one of its events) gives the count of tokens generated: a dotted
    # path of JSON keys. Needed where the response does not stream.
    output_tokens_field: str | None = None
    # The pieces text prompts are made of (``prompt_words``); set for a ``text`` prompt.
    words: tuple[str, ...] = field(default=(), repr=False)

    @property
    def streams(self) -> bool:
        """Whether the response streams, so that a first token (TTFT, TPOT) is seen."""
        return self.stream != NONE

    def payload(self, index: int, request: Request, settings: ReplaySettings) -> bytes:
        """The app's body for the window's ``index``-th request."""
        ids = settings.prompt(index, request)
        prompt: Any = ids
        if self.prompt == TEXT:
            if not self.words:
                raise ValueError("a text prompt needs the tokenizer's words")
            prompt = "".join(self.words[i % len(self.words)] for i in ids)
        filled = self.body_with(prompt, request.output_tokens, settings.model)
        return json.dumps(filled, separators=(",", ":")).encode()

    def body_with(self, prompt: Any, output_tokens: int, model: str) -> Any:
        """The app's body with its placeholders filled: the prompt (text or token ids), the
        output length and the model."""
        return _fill(self.body, {PROMPT: prompt, OUTPUT_TOKENS: output_tokens, MODEL: model})

    async def receive(
        self,
        response: httpx.Response,
        got: Received,
        clock: Clock,
        sent: float,
        live: LiveRequest | None,
    ) -> None:
        """Read the response into ``got`` as ``stream`` says, to the end of its body."""
        if self.stream == NONE:
            text = await response.aread()
            got.usage_tokens = self._count(json.loads(text), required=True)
            return
        async for line in event_lines(response):
            data = line.strip()
            if self.stream == SSE:
                if not data.startswith(b"data:"):
                    continue
                data = data[5:].strip()
            if not data or data == b"[DONE]":
                continue
            self._event(data, got, clock, sent, live)

    def _event(
        self, data: bytes, got: Received, clock: Clock, sent: float, live: LiveRequest | None
    ) -> None:
        """One event: a token unless it holds only the count; the count where it has one."""
        try:
            event: Any = json.loads(data)
        except ValueError:
            event = None  # a piece of text: a token
        count = self._count(event, required=False)
        if count is not None:
            got.usage_tokens = count
        counted_alone = (
            count is not None
            and isinstance(event, Mapping)
            and self.output_tokens_field is not None
            and set(event) == {self.output_tokens_field.split(".")[0]}
        )
        if not counted_alone:
            first_token(got, clock, sent, live)

    def _count(self, value: Any, required: bool) -> int | None:
        """The count at ``output_tokens_field`` in ``value``; None where it has none and none
        is ``required``."""
        if self.output_tokens_field is None:
            return None
        count = dig(value, self.output_tokens_field)
        if count is None and not required:
            return None
        if not isinstance(count, int) or isinstance(count, bool):
            raise UnreadableResponse(
                f"{self.output_tokens_field} is {json_type(count)}, not an integer: "
                f"{json.dumps(value)[:100]}"
            )
        return count


def _fill(value: Any, values: Mapping[str, Any]) -> Any:
    """``value`` with each placeholder replaced: a string that is one placeholder becomes its
    value, one with text around placeholders gets them written in."""
    if isinstance(value, str):
        if value in values:
            return values[value]
        for placeholder, filled in values.items():
            if placeholder in value:
                shown = filled if isinstance(filled, str) else json.dumps(filled)
                value = value.replace(placeholder, shown)
        return value
    if isinstance(value, Mapping):
        return {k: _fill(v, values) for k, v in value.items()}
    if isinstance(value, Sequence):
        return [_fill(v, values) for v in value]
    return value
