"""``JSONResponse`` sends what Litestar's ``Response`` sends for the same answer, byte for byte,
and takes Litestar's own way when a route or the app adds something of its own."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from litestar import Response
from litestar.background_tasks import BackgroundTask
from litestar.datastructures import Cookie

from gateway.json_response import JSONResponse

BODY = b'{"id":"chatcmpl-1","choices":[]}'
HEADERS = {"x-request-id": "req-1", "X-RateLimit-Limit-Requests": "60", "x-ratelimit-reset-tokens": "0.250s"}


def sent(response: Response[Any], **route: Any) -> list[dict[str, Any]]:
    """The ASGI messages ``response`` sends when a route with ``route``'s settings returns it."""
    messages: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        messages.append(message)

    async def receive() -> Any:
        return {"type": "http.disconnect"}

    asgi = response.to_asgi_response(None, None, **({"cookies": [], "headers": {}, "status_code": 200} | route))  # type: ignore[arg-type]
    asyncio.run(asgi({"type": "http"}, receive, send))  # type: ignore[arg-type]
    return messages


@pytest.mark.parametrize("status", [None, 200, 429])
@pytest.mark.parametrize("headers", [HEADERS, {}, {"content-type": "application/json; charset=utf-8"}])
def test_the_same_messages_as_litestars_response(status: int | None, headers: dict[str, str]) -> None:
    ours = sent(JSONResponse(BODY, status_code=status, headers=headers))
    litestars = sent(Response(BODY, status_code=status, media_type="application/json", headers=headers))
    assert ours == litestars
    assert ours[0]["status"] == (status or 200)


@pytest.mark.parametrize("route", [
    {"headers": {"x-route": "1"}},
    {"cookies": [Cookie(key="k", value="v")]},
    {"background": BackgroundTask(asyncio.sleep, 0)},
    {"status_code": 201},
], ids=["route headers", "route cookies", "background task", "route status"])
def test_what_a_route_adds_is_sent_as_litestar_sends_it(route: dict[str, Any]) -> None:
    ours = sent(JSONResponse(BODY, headers=HEADERS), **route)
    litestars = sent(Response(BODY, media_type="application/json", headers=HEADERS), **route)
    assert ours == litestars


def test_the_responses_own_cookie_is_sent() -> None:
    ours = JSONResponse(BODY, headers=HEADERS)
    litestars = Response(BODY, media_type="application/json", headers=HEADERS)
    for response in (ours, litestars):
        response.set_cookie("session", "s1")
    assert sent(ours) == sent(litestars)
    assert any(name == b"set-cookie" for name, _ in sent(ours)[0]["headers"])
