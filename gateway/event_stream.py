"""The response a relayed stream goes out in: Litestar's ``Stream``, cheaper per stream and per chunk.

Litestar streams its body inside an anyio task group that listens for the client's disconnect;
its cancel scopes cost more per stream than relaying twenty chunks does. Here one plain asyncio
task waits on ``receive()`` and cancels the body's task when the client goes away, as the task
group did; the response then ends normally, so its background task (the settlement) still runs.

The start message goes through every ``send`` wrapper on the way out (the ``before_send`` hooks
add their headers, the telemetry middleware notes the status); the body's messages, one per chunk,
go straight to the server's ``send``, which the app (``gateway.app.GatewayApp``) keeps in the scope under
``DIRECT_SEND``: none of those wrappers looks at a body message, and each would cost a coroutine
per chunk. A server that can also write a body chunk synchronously (``switchyard serve``'s protocol,
``gateway.cli.http_protocol``) puts that writer in the scope under ``WRITE_NOW``; a body that can use
it (one with a ``write_directly`` method) is given it, and writes chunks from the callbacks where
they arrive.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Callable
from typing import TYPE_CHECKING, Any

from litestar.datastructures import MutableScopeHeaders
from litestar.enums import MediaType
from litestar.response.base import ASGIResponse
from litestar.response.streaming import ASGIStreamingResponse, Stream
from litestar.types import HTTPResponseBodyEvent, Receive, Scope, Send
from litestar.utils.helpers import get_enum_string_value

from gateway.json_response import encode_headers, litestar_adds

if TYPE_CHECKING:
    from litestar import Litestar, Request

DIRECT_SEND = "switchyard.direct_send"  # scope key: the ASGI server's own send, unwrapped
WRITE_NOW = "switchyard.write_now"  # scope key: the server's synchronous body writer (WriteNow), if any
LOOP = "switchyard.loop"  # scope key: the server's event loop, if it says (a lookup is a getpid on Python 3.11)
# scope key: False from an app that ends a request quietly when the server cancels its task because
# the client left before the response began (``gateway.app.GatewayApp``); the server
# (``gateway.cli.http_protocol``) sets it True as it does, and cancels no other app's requests
CLIENT_LEFT = "switchyard.client_left"

# Does what ``send({"type": "http.response.body", "body": data, "more_body": True})`` would, without
# waiting, and returns True; or writes nothing and returns False when it cannot do it now (the
# response has not started or is over, the client left, or its write buffer is full).
WriteNow = Callable[[bytes], bool]


class EventStream(Stream):
    """``text/event-stream`` from an async iterator of bytes."""

    def __init__(self, events: AsyncIterable[bytes], **kwargs: Any) -> None:
        super().__init__(events, media_type="text/event-stream", **kwargs)

    def to_asgi_response(self, app: Litestar | None, request: Request[Any, Any, Any], **kwargs: Any) -> ASGIResponse:
        if litestar_adds(app, kwargs) or self.cookies:
            response = super().to_asgi_response(app, request, **kwargs)
            response.__class__ = _WatchedBody  # same slots: only send_body differs
            return response
        # what Stream.to_asgi_response and ASGIResponse do, with the header list made in one pass
        kind = get_enum_string_value(kwargs.get("media_type") or self.media_type or MediaType.JSON)
        content_type = f"{kind}; charset={self.encoding}" if kind.startswith("text/") else kind
        response = _WatchedBody.__new__(_WatchedBody)
        response.headers = MutableScopeHeaders({"headers": encode_headers(self.headers, content_type.encode(), None)})
        response.status_code = self.status_code or kwargs.get("status_code") or 200
        response.body = b""
        response.content_length = 0
        response.background = self.background or kwargs.get("background")
        response.encoding = self.encoding
        response.is_head_response = False
        response._encoded_cookies = ()
        response.iterator = self.iterator  # type: ignore[assignment]  # an async iterable of bytes, as __init__ takes
        return response


class _WatchedBody(ASGIStreamingResponse):
    __slots__ = ()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the response; its background task (the settlement) runs however that ends: also when
        the server's ``send`` raises, or something other than the client's leaving cancels it."""
        try:
            await self.start_response(send=send)
            if self.is_head_response:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            else:
                write_now: WriteNow | None = scope.get(WRITE_NOW)  # type: ignore[assignment]  # a custom scope key
                # an event iterator that can write its events itself (gateway.streaming.SSERelay); a
                # duck-typed look, as an isinstance check on a runtime Protocol costs microseconds
                if write_now is not None and (write_directly := getattr(self.iterator, "write_directly", None)):
                    write_directly(write_now)
                await self.send_body(scope.get(DIRECT_SEND, send), receive, write_now,  # type: ignore[arg-type]
                                     scope.get(LOOP))  # type: ignore[arg-type]
        finally:
            await self.after_response()

    async def send_body(self, send: Send, receive: Receive, write_now: WriteNow | None = None,
                        loop: asyncio.AbstractEventLoop | None = None) -> None:
        body = asyncio.current_task(loop)
        assert body is not None
        watcher = body.get_loop().create_task(_cancel_on_disconnect(receive, body))
        try:
            await (self._stream(send) if write_now is None else self._write_stream(send, write_now))
        except asyncio.CancelledError:
            # the client left (the watcher cancelled this task), unless something else cancels too
            if not watcher.done() or watcher.cancelled() or body.uncancel() > 0:
                raise
        finally:
            watcher.cancel()

    async def _write_stream(self, send: Send, write_now: WriteNow) -> None:
        """``_stream``, but each chunk is written at once (with the response's head, for the first),
        not at the end of the loop's turn: one turn less before the client has it. A chunk the
        writer cannot take now (a full client buffer) goes through ``send``, which waits.

        An iterator whose ``last_event`` is the chunk it ends with (``SSERelay``'s ``[DONE]``) has
        that chunk sent with the end of the body, in the same system call: it is held until the
        iterator stops, which it does at once."""
        last = getattr(self.iterator, "last_event", None)
        held = b""
        async for chunk in self.iterator:
            data = chunk if isinstance(chunk, bytes) else chunk.encode(self.encoding)
            if held:  # not the last after all
                await _write(send, write_now, held)
                held = b""
            if data == last:
                held = data
            else:
                await _write(send, write_now, data)
        end: HTTPResponseBodyEvent = {"type": "http.response.body", "body": held, "more_body": False}
        await send(end)


async def _write(send: Send, write_now: WriteNow, data: bytes) -> None:
    if not write_now(data):
        event: HTTPResponseBodyEvent = {"type": "http.response.body", "body": data, "more_body": True}
        await send(event)


async def _cancel_on_disconnect(receive: Receive, body: asyncio.Task[Any]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    body.cancel()
