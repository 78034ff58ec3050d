"""A translation service built the way teams embed vLLM: FastAPI around ``AsyncLLM``.

``POST /translate`` takes ``{"text": ..., "target": "French", "max_tokens": 256}`` and answers
``{"translation": ..., "output_tokens": N}``; with ``"stream": true`` it answers server-sent
events instead, ``data: {"text": ...}`` as tokens come and a last ``data: {"output_tokens": N}``.
``"ignore_eos": true`` runs a request to ``max_tokens`` whatever it generates (load tests).
``GET /health`` answers once the engine is up; ``GET /metrics`` is vLLM's Prometheus metrics.

The engine is built from ``AsyncEngineArgs`` whose fields are the keys of the YAML file that
``--engine-config`` names (``model`` at least): the file tuner writes for each trial and the
file it writes for the configuration it picks.

    python examples/translate_app/app.py --port 8000 --engine-config engine.yaml

The engine is created under ``if __name__ == "__main__"`` (in the app's lifespan): vLLM's CPU
build starts its engine core in a spawned process, which imports this file again.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

PROMPT = "Translate the following text into {target}.\n\n{text}\n\n{target}:"


class TranslateRequest(BaseModel):
    """The body of ``POST /translate``."""

    text: str
    target: str = "French"
    max_tokens: int = 256
    stream: bool = False
    ignore_eos: bool = False


def engine_args_of(path: Path) -> Any:
    """``AsyncEngineArgs`` from the YAML file at ``path`` (its keys are the fields)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    fields = yaml.safe_load(path.read_text()) or {}
    return AsyncEngineArgs(**fields)


def build_app(engine_config: Path) -> FastAPI:
    """The service; its engine is started when the app starts and shut down when it stops."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    engines: dict[str, AsyncLLM] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = AsyncLLM.from_engine_args(engine_args_of(engine_config))
        engines["llm"] = engine
        try:
            yield
        finally:
            engine.shutdown()

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/translate", response_model=None)
    async def translate(body: TranslateRequest, raw: Request) -> Response:
        params = SamplingParams(
            max_tokens=body.max_tokens,
            ignore_eos=body.ignore_eos,
            temperature=0.0,
            output_kind=RequestOutputKind.DELTA,
        )
        prompt = PROMPT.format(target=body.target, text=body.text)
        outputs = engines["llm"].generate(prompt, params, uuid.uuid4().hex)
        if body.stream:
            return StreamingResponse(_events(outputs), media_type="text/event-stream")
        text, count = [], 0
        async for output in outputs:
            text.append(output.outputs[0].text)
            count += len(output.outputs[0].token_ids)
        return JSONResponse({"translation": "".join(text), "output_tokens": count})

    return app


async def _events(outputs: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    """Server-sent events of a streamed translation: each piece of text, then the count."""
    count = 0
    async for output in outputs:
        piece = output.outputs[0]
        count += len(piece.token_ids)
        if piece.token_ids:
            yield b"data: " + json.dumps({"text": piece.text}).encode() + b"\n\n"
    yield b"data: " + json.dumps({"output_tokens": count}).encode() + b"\n\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--engine-config", type=Path, required=True, help="AsyncEngineArgs YAML")
    args = parser.parse_args()
    import uvicorn

    uvicorn.run(build_app(args.engine_config), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
