"""The servers ``bench/gateway_floor.py`` measures: each adds one layer of the gateway's stack.

- ``raw``: a bare ASGI callable that answers a fixed chat completion (uvicorn + httptools + uvloop);
- ``litestar``: the same answer from a Litestar route that decodes the body into the gateway's
  ``ChatCompletionRequest`` (the framework the gateway runs on);
- ``proxy``: that route forwarding the body to the upstream with the gateway's own pooled client
  (``backends.http_upstream.HTTPUpstream``; ``backends/raw_http.py`` for a whole answer) and
  relaying the answer: no auth, quotas, routing, metering or telemetry.

Run by uvicorn as factories: ``uvicorn bench.floor_apps:litestar_app --factory``; the proxy reads
its upstream from ``FLOOR_UPSTREAM``.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, post

from backends.config import DeploymentConfig
from backends.http_upstream import HTTPUpstream
from backends.openai_wire import ChatCompletionRequest

ANSWER = msgspec.json.encode({
    "id": "chatcmpl-floor", "object": "chat.completion", "created": 0, "model": "floor",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
})  # fmt: skip
_decode = msgspec.json.Decoder(ChatCompletionRequest).decode


def raw_app() -> Any:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": ANSWER})

    return app


def litestar_app() -> Litestar:
    @post("/v1/chat/completions", status_code=200)
    async def chat(request: Request[Any, Any, Any]) -> Response[bytes]:
        _decode(await request.body())
        return Response(ANSWER, media_type="application/json")

    return Litestar([chat])


def proxy_app() -> Litestar:
    upstream = HTTPUpstream(DeploymentConfig(provider="openai", model="echo", api_base=os.environ["FLOOR_UPSTREAM"]),
                            "", {})

    @post("/v1/chat/completions", status_code=200)
    async def chat(request: Request[Any, Any, Any]) -> Response[bytes]:
        body = _decode(await request.body())
        answer = await upstream.post(
            "/chat/completions", msgspec.json.encode(msgspec.structs.replace(body, model="echo"))
        )
        return Response(answer.body, media_type="application/json")

    return Litestar([chat])
