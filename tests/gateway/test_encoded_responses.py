"""``JSONResponse`` sends what Litestar's ``Response`` sends for the same answer, and ``EventStream``
what Litestar's ``Stream`` sends for the same events, byte for byte; both take Litestar's own way
when a route or the app adds something of its own."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import pytest
from litestar import Response
from litestar.background_tasks import BackgroundTask
from litestar.datastructures import Cookie
from litestar.response import Stream

from gateway.event_stream import WRITE_NOW, EventStream
from gateway.json_response import JSONResponse

BODY = b'{"id":"chatcmpl-1","choices":[]}'
HEADERS = {"x-request-id": "req-1", "X-RateLimit-Limit-Requests": "60", "x-ratelimit-reset-tokens": "0.250s"}


def sent(response: Response[Any], **route: Any) -> list[dict[str, Any]]:
    """The ASGI messages ``response`` sends when a route with ``route``'s settings returns it."""
    messages: list[dict[str, Any]] = []
    ended = asyncio.Event()

    async def send(message: Any) -> None:
        messages.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            ended.set()

    async def receive() -> Any:  # as a server's: the disconnect comes once the response is over
        await ended.wait()
        return {"type": "http.disconnect"}

    async def run() -> None:
        asgi = response.to_asgi_response(None, None, **({"cookies": [], "headers": {}, "status_code": 200} | route))  # type: ignore[arg-type]
        await asgi({"type": "http"}, receive, send)  # type: ignore[arg-type]

    asyncio.run(run())
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


def test_a_background_task_runs_after_the_answer_as_litestars_does() -> None:
    ran: list[str] = []

    async def task(who: str) -> None:
        ran.append(who)

    def litestars(**kw: Any) -> Response[bytes]:
        return Response(BODY, media_type="application/json", **kw)

    for make in (partial(JSONResponse, BODY), litestars):
        sent(make(headers=HEADERS), background=BackgroundTask(task, "route"))
        sent(make(headers=HEADERS, background=BackgroundTask(task, "own")), background=BackgroundTask(task, "route"))
    assert ran == ["route", "own"] * 2


def test_the_responses_own_cookie_is_sent() -> None:
    ours = JSONResponse(BODY, headers=HEADERS)
    litestars = Response(BODY, media_type="application/json", headers=HEADERS)
    for response in (ours, litestars):
        response.set_cookie("session", "s1")
    assert sent(ours) == sent(litestars)
    assert any(name == b"set-cookie" for name, _ in sent(ours)[0]["headers"])


async def _events() -> Any:
    for event in (b"data: 1\n\n", b"data: [DONE]\n\n"):
        yield event


@pytest.mark.parametrize("route", [
    {}, {"headers": {"x-route": "1"}}, {"cookies": [Cookie(key="k", value="v")]}, {"status_code": 201},
    {"media_type": "application/json"},
], ids=["plain", "route headers", "route cookies", "route status", "route media type"])
def test_an_event_stream_sends_what_litestars_stream_sends(route: dict[str, Any]) -> None:
    done: list[str] = []

    async def finish(who: str) -> None:
        done.append(who)

    ours = sent(EventStream(_events(), headers=HEADERS, background=BackgroundTask(finish, "ours")), **route)
    litestars = sent(Stream(_events(), media_type="text/event-stream", headers=HEADERS,
                            background=BackgroundTask(finish, "litestars")), **route)
    assert ours == litestars
    assert [m.get("body") for m in ours[1:]] == [b"data: 1\n\n", b"data: [DONE]\n\n", b""]
    assert done == ["ours", "litestars"]


class _Relay:
    """An event iterator that says which event it ends with, as gateway.streaming.SSERelay does."""

    last_event = b"data: [DONE]\n\n"

    def __init__(self, events: list[bytes]) -> None:
        self.events = events

    async def __aiter__(self) -> Any:
        for event in self.events:
            yield event


@pytest.mark.parametrize("events", [
    [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"],
    [b"data: 1\n\n", b"data: [DONE]\n\n", b"data: late\n\n"],  # not the last after all: sent in order
    [b"data: 1\n\n"],  # no [DONE]: the end alone
])
def test_the_last_event_leaves_with_the_end_of_the_body(events: list[bytes]) -> None:
    """With the server's synchronous writer, each event is written at once but the last one, which
    goes in the message that ends the body (one system call with the end, not two)."""
    written: list[bytes] = []
    messages: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        messages.append(message)

    async def receive() -> Any:
        await asyncio.sleep(3600)

    async def run() -> None:
        asgi = EventStream(_Relay(events)).to_asgi_response(None, None, cookies=[], headers={}, status_code=200)  # type: ignore[arg-type]
        scope = {"type": "http", WRITE_NOW: lambda data: written.append(data) is None}
        await asgi(scope, receive, send)  # type: ignore[arg-type]

    asyncio.run(run())
    ends_done = events[-1] == _Relay.last_event
    assert written == (events[:-1] if ends_done else events)
    assert messages[-1] == {"type": "http.response.body", "body": events[-1] if ends_done else b"", "more_body": False}
