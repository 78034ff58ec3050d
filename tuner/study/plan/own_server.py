"""A spec's ``server`` section: the user's own app, how tuner starts it and what it asks of it.

    server:
      command: python examples/translate_app/app.py --port {port} --engine-config {config}
      health_path: /health
      request:
        path: /translate
        body: {text: "{prompt}", max_tokens: "{output_tokens}", ignore_eos: true}
        prompt: text          # or token_ids
        stream: none          # or sse, chunked
        output_tokens_field: output_tokens

Without ``request``, the app is asked as vLLM's OpenAI server is (``/v1/completions``). A
response that does not stream shows no first token: SLOs and objective weights may then name
only end-to-end latencies, and a spec naming TTFT or TPOT is refused with one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.engine.own_server import ServerCommand
from tuner.errors import SpecError
from tuner.load.template import PROMPT_KINDS, STREAMS, RequestTemplate

SECTION = "server"
_KEYS = {"command", "health_path", "request"}
_REQUEST_KEYS = {"path", "body", "prompt", "stream", "output_tokens_field"}
# The metrics only a streamed response measures.
FIRST_TOKEN_METRICS = ("ttft_", "tpot_")
# Arguments of vLLM's OpenAI server, not of its engine: ``AsyncEngineArgs`` has no such field
# (vLLM 0.26.0 to 0.32.0), so an app that builds its engine from one fails at start on it. The
# GPU search space ``tuner init`` writes holds api-server-count.
SERVER_ONLY_ARGUMENTS = frozenset({"api-server-count"})


@dataclass(frozen=True)
class OwnServer:
    """The app's command, and its request (None: vLLM's OpenAI completions)."""

    command: ServerCommand
    request: RequestTemplate | None = None

    @property
    def streams(self) -> bool:
        """Whether a first token is seen in its responses."""
        return self.request is None or self.request.streams

    def fingerprint(self) -> dict[str, Any]:
        """What a study's trials were measured through: the command, its health path, and the
        request (its words, which come from the model, left out)."""
        request = self.request
        asked = None
        if request is not None:
            asked = {
                "path": request.path,
                "body": dict(request.body),
                "prompt": request.prompt,
                "stream": request.stream,
                "output_tokens_field": request.output_tokens_field,
            }
        command = self.command
        return {"command": command.command, "health_path": command.health_path, "request": asked}


def parse_server(path: str, raw: Any) -> OwnServer | None:
    """The ``server`` section checked (None where there is none); ``SpecError`` names the key."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise SpecError(path, SECTION, f"must be a mapping, got {type(raw).__name__}")
    if unknown := set(raw) - _KEYS:
        raise SpecError(
            path, f"{SECTION}.{sorted(unknown)[0]}", f"unknown key; known: {sorted(_KEYS)}"
        )
    command = raw.get("command")
    if not isinstance(command, str):
        raise SpecError(path, f"{SECTION}.command", "must be the command that starts the server")
    health = raw.get("health_path", "/health")
    try:
        server = ServerCommand(command, health if isinstance(health, str) else "")
    except ValueError as exc:
        raise SpecError(path, SECTION, str(exc)) from None
    request = raw.get("request")
    return OwnServer(server, None if request is None else _request(path, request))


def _request(path: str, raw: Any) -> RequestTemplate:
    where = f"{SECTION}.request"
    if not isinstance(raw, Mapping):
        raise SpecError(path, where, f"must be a mapping, got {type(raw).__name__}")
    if unknown := set(raw) - _REQUEST_KEYS:
        raise SpecError(
            path, f"{where}.{sorted(unknown)[0]}", f"unknown key; known: {sorted(_REQUEST_KEYS)}"
        )
    target, body = raw.get("path"), raw.get("body")
    if not isinstance(target, str) or not target.startswith("/"):
        raise SpecError(path, f"{where}.path", "must be the endpoint's path, starting with /")
    if not isinstance(body, Mapping) or not body:
        raise SpecError(path, f"{where}.body", "must be the request's JSON object")
    if "{prompt}" not in repr(body):
        raise SpecError(path, f"{where}.body", "must hold the prompt's placeholder, {prompt}")
    prompt, stream = raw.get("prompt", "text"), raw.get("stream", "none")
    if prompt not in PROMPT_KINDS:
        raise SpecError(path, f"{where}.prompt", f"must be one of {PROMPT_KINDS}, got {prompt!r}")
    if stream not in STREAMS:
        raise SpecError(path, f"{where}.stream", f"must be one of {STREAMS}, got {stream!r}")
    field = raw.get("output_tokens_field")
    if field is not None and (not isinstance(field, str) or not field):
        raise SpecError(path, f"{where}.output_tokens_field", "must be a dotted path of keys")
    if field is None and stream == "none":
        raise SpecError(
            path,
            f"{where}.output_tokens_field",
            "is needed where the response does not stream: where it gives the tokens generated",
        )
    return RequestTemplate(target, dict(body), prompt, stream, field)


def check_first_token_metrics(
    path: str, server: OwnServer | None, slos: Mapping[str, float], weights: Mapping[str, float]
) -> None:
    """A ``SpecError`` where a server that does not stream is held to TTFT or TPOT."""
    if server is None or server.streams:
        return
    for name, named in (("slos", slos), ("weights", weights)):
        for metric in named:
            if metric.startswith(FIRST_TOKEN_METRICS):
                raise SpecError(
                    path,
                    f"{name}.{metric}",
                    "not measured: the server's responses do not stream (server.request.stream:"
                    " none), so tuner sees no first token; use e2e_ metrics",
                )
