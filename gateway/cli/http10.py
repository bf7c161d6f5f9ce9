"""Answers to HTTP/1.0 requests: a response without a length goes out close-delimited.

uvicorn frames a response that gives no ``content-length`` (a stream) with chunked
transfer-encoding whatever the request's version; HTTP/1.0 has no chunked encoding, and a 1.0
client reads the chunk-size lines as body. uvicorn already answers a 1.0 request with
``connection: close``; here such a response's body goes out as it is, ended by closing the
connection. A response with a length is uvicorn's as before. The framing is decided once per
response, at its start; HTTP/1.1 requests never see this class. A 1.0 request's ``Expect:
100-continue`` gets no ``100 Continue`` (which a 1.0 client would take for its answer), as RFC 9110
§10.1.1 asks.
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import cast

from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.event_stream import WriteNow

_LENGTHLESS_STATUSES = (204, 304)  # bodiless by definition: uvicorn frames them with nothing
_FRAMING = {b"content-length", b"transfer-encoding"}  # an app that frames its body itself is left to uvicorn


class Http10Cycle(RequestResponseCycle):
    """uvicorn's request-response cycle for an HTTP/1.0 request (``as_http10``)."""

    close_delimited = False  # the response gives no length: its body ends with the connection

    async def send(self, message: ASGISendEvent) -> None:
        if not self.close_delimited:
            if not self.response_started and message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers", [])}
                if (not names & _FRAMING and self.scope["method"] != "HEAD"
                        and message["status"] not in _LENGTHLESS_STATUSES):
                    self.close_delimited = True
                    self.chunked_encoding = False  # uvicorn adds no transfer-encoding then
            await super().send(message)
            return
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if message["type"] != "http.response.body" or self.response_complete:
            raise RuntimeError(f"Unexpected ASGI message '{message['type']}' sent.")
        if body := message.get("body", b""):
            self.transport.write(body)
        if not message.get("more_body", False):
            self.response_complete = True
            self.message_event.set()
            self.transport.close()  # the body's end
            self.on_response()


def as_http10(cycle: RequestResponseCycle) -> WriteNow:
    """Make uvicorn's fresh ``cycle`` (its task not yet run) an ``Http10Cycle``; return its
    synchronous body writer."""
    cycle.__class__ = Http10Cycle  # same state: only ``send`` differs
    cycle.waiting_for_100_continue = False  # HTTP/1.0 has no 1xx answers: the expectation is ignored (RFC 9110 §10.1.1)
    return partial(_write_unframed_now, weakref.ref(cast(Http10Cycle, cycle)))


def _write_unframed_now(request: weakref.ref[Http10Cycle], data: bytes) -> bool:
    """``gateway.event_stream.WriteNow`` for an HTTP/1.0 request: as
    ``gateway.cli.http_protocol``'s chunked writer, with the body's bytes as they are."""
    cycle = request()
    if (cycle is None or cycle.disconnected or cycle.flow.write_paused or cycle.response_complete
            or not cycle.close_delimited):
        return False
    if data:
        cycle.transport.write_now(data)  # type: ignore[attr-defined]  # CoalescedWrites
    return True
