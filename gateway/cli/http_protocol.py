"""uvicorn's httptools protocol with deadlines on each request head and body, and a cap on the
connections one client address may hold open (slow-loris guards).

uvicorn times out idle keep-alive connections but not a client that sends its request line and
headers a byte at a time: such connections would stay open for ever. Here a connection whose
request head is not complete ``$SWITCHYARD_HEADER_TIMEOUT`` seconds (default 10) after it began
is closed. A request body not complete ``$SWITCHYARD_BODY_TIMEOUT`` seconds (default 30) after
its head is answered 408 (if no response has started) and the connection closed, however slowly
it trickles in. A client address holding ``$SWITCHYARD_MAX_CONNECTIONS_PER_CLIENT`` connections
(default 256; 0: no cap) gets its next one answered 429 and closed. That address is the TCP
peer's, a trusted proxy's too: the cap acts before any request (and its ``X-Forwarded-For``) is
read, and a proxy's connection carries many clients' requests in turn (``gateway.trusted_proxies``).
The settings travel by environment so that worker processes see them too (``server.*`` in the config).

A request head is bounded too: the parser keeps an incomplete header value (and uvicorn the
request line) whole, copying it again on each read, so a head still incomplete after
``MAX_HEAD_BYTES`` (64 KiB) is answered 431 and the connection closed; so is a chunked body whose
framing and trailer fields (kept as a head's are) pass it. A request the parser cannot
read at all is answered 400, as uvicorn does, but in OpenAI's error shape. A body in a transfer
coding other than chunked (``Transfer-Encoding: gzip, chunked``), which the parser would pass on still
coded, is answered 501 (RFC 9112 §6.1) and the connection closed; so is, with a 400 (RFC 9112 §3.2), an
HTTP/1.1 request without a ``Host`` header, and any request with more than one (HTTP/1.0 may leave it
out). Each of these refusals follows the answers to the requests pipelined before the one refused,
in order, as every answer does.

Writes are coalesced per event-loop turn (``CoalescedWrites``): uvicorn writes a response's head
and its body separately, two system calls where one does; a stream's chunks, each written in a
turn of its own, still leave as they come. A response's end is written as soon as it is sent when
it is the first to end in its turn, and with the turn's other ends at the turn's end otherwise
(``bench.gateway_ab --phases ab``, 8 rounds: (a) 0.217 to 0.200 ms of CPU per request, 4,536 to
4,929 requests/s; (b)'s added latency unchanged). A streamed (chunked) response's end, its last
event, is written as soon as it is sent, as its other chunks are (``--phases c``, three runs of 16
to 20 rounds: 1.169 to 1.121, 1.094 to 1.049 and 1.120 to 1.115 ms of CPU per stream; time to first
chunk added at p90 6.20 to 4.87, 3.99 to 3.43 and 3.92 to 3.75 ms).

A client that leaves before its response has begun (a long answer it stopped waiting for) has its
request's task cancelled at once: the upstream call is abandoned, and the request settles as
``client_disconnected`` and frees its limits' slots then, not when the upstream would have answered.
After the response began, a stream notices the client leaving itself (``gateway.event_stream``).

A request offering to switch to a protocol other than WebSocket (``Upgrade: h2c``) is answered in
HTTP/1.1, its body read as any request's (``gateway.cli.declined_upgrade``); a WebSocket upgrade is
uvicorn's as before.

An HTTP/1.0 request's response without a length goes out close-delimited, not chunked
(``gateway.cli.http10``).

Each request's scope also gets a synchronous body writer (``gateway.event_stream.WRITE_NOW``), which
a relayed stream uses to write its chunks from the upstream's callbacks, and the serving loop
(``gateway.event_stream.LOOP``), which it would otherwise look up with a ``getpid`` system call.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import weakref
from functools import partial
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from backends.turn_writes import Turn
from gateway.cli.declined_upgrade import fresh_parser, head_without_upgrade
from gateway.cli.http10 import as_http10
from gateway.event_stream import CLIENT_LEFT, LOOP, WRITE_NOW

HEADER_TIMEOUT_ENV = "SWITCHYARD_HEADER_TIMEOUT"
BODY_TIMEOUT_ENV = "SWITCHYARD_BODY_TIMEOUT"
MAX_CONNECTIONS_ENV = "SWITCHYARD_MAX_CONNECTIONS_PER_CLIENT"
DEFAULT_SECONDS = 10.0
DEFAULT_BODY_SECONDS = 30.0
LINGER_SECONDS = 1.0  # how long a connection answered 408 or 431 still reads (and drops) before closing
DEFAULT_MAX_CONNECTIONS = 256
MAX_HEAD_BYTES = 64 * 1024  # a request line and headers, counted over the reads since the one it began in

_open_by_client: dict[str, int] = {}  # per worker process; the event loop is single-threaded
_answer_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Turn] = weakref.WeakKeyDictionary()


def _raw_error(status: int, reason: str, message: str, code: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": code}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\nx-content-type-options: nosniff\r\n")
    if status == 429:
        head += "retry-after: 1\r\n"
    return head.encode() + b"\r\n" + body


class _HeadRefused(Exception):
    """Raised from the parser's callback to stop it at a head that is refused (``_head_refusal``)."""


_CODING_REFUSED = _raw_error(501, "Not Implemented", "Transfer-Encoding other than chunked is not supported: "
                             "send the body by length or in chunks", "unsupported_transfer_encoding")
_HOST_REFUSED = _raw_error(400, "Bad Request", "An HTTP/1.1 request must have exactly one Host header, and no "
                           "request more than one (RFC 9112 section 3.2).", "invalid_host_header")


def _head_refusal(headers: list[tuple[bytes, bytes]], parser: httptools.HttpRequestParser) -> bytes | None:
    """The answer to a request head that is refused, in one pass over ``headers`` (names in lower
    case): a ``Transfer-Encoding`` naming a coding other than chunked (the parser undoes the chunks
    and nothing else), or not exactly one ``Host`` (an HTTP/1.0 request may send none). None: taken."""
    hosts = 0
    for name, value in headers:
        if name == b"host":
            hosts += 1
        elif name == b"transfer-encoding" and any(coding.strip() not in (b"", b"chunked")
                                                  for coding in value.lower().split(b",")):
            return _CODING_REFUSED
    if hosts == 1 or (not hosts and parser.get_http_version() == "1.0"):
        return None
    return _HOST_REFUSED


def _pending_head_bytes(url: bytes, headers: list[tuple[bytes, bytes]], data: bytes) -> int:
    """About how many bytes of ``data``, the read a still incomplete request head began in, are that
    head's: its target and header lines as parsed so far, and the line it ends in. Until its request
    line is complete (the target is in that line), the line holds nothing else of the head."""
    tail = data[data.rfind(b"\n") + 1:]
    parsed = len(url) + sum(len(name) + len(value) + 4 for name, value in headers)
    return parsed + len(tail) if headers or url not in tail else parsed


class CoalescedWrites:
    """A connection's transport whose writes of one event-loop turn go out as one, at the turn's
    end; closing sends what is pending first. Everything else is the transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def write_now(self, data: bytes) -> None:
        """Write ``data`` at once, after what is pending, in one system call."""
        if self._pending:
            self._pending.append(data)
            self.flush()
        elif not self._transport.is_closing():  # as flush: a closing transport takes no more
            self._transport.write(data)

    def flush(self) -> None:
        if self._pending:
            data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _write_body_now(request: weakref.ref[RequestResponseCycle], data: bytes) -> bool:
    """What ``cycle.send`` does with ``{"type": "http.response.body", "body": data, "more_body":
    True}`` for a chunked response, when it need not wait (``gateway.event_stream.WriteNow``)."""
    cycle = request()
    if (cycle is None or cycle.disconnected or cycle.flow.write_paused or not cycle.response_started
            or cycle.response_complete or not cycle.chunked_encoding):
        return False
    if data:
        cycle.transport.write_now(b"%x\r\n%b\r\n" % (len(data), data))  # type: ignore[attr-defined]  # CoalescedWrites
    return True


class HeadDeadlineProtocol(HttpToolsProtocol):
    """The deadlines' timers are armed only for a head or body still incomplete when a read has been
    parsed: a request that comes whole in one read (most do) costs no timer."""

    _head_timer: asyncio.TimerHandle | None = None
    _head_since: float | None = None  # loop time the pending request head began (None: none pending)
    _body_timer: asyncio.TimerHandle | None = None
    _body_since: float | None = None  # loop time the pending request body began
    _client_host: str | None = None
    _discarding = False  # answered and half-closed: what still arrives is dropped
    _request_task: asyncio.Task[None] | None = None  # the task of the connection's current request
    _head_bytes = 0  # bytes of the reads since the pending head began
    _head_marks = 0  # heads begun and completed: a read that saw one held more than one head's bytes
    _body_marks = 0  # pieces of request bodies parsed
    _framing_bytes = 0  # bytes of the reads since the pending body's last data: chunk framing, trailer fields
    _declined: bytes | None = None  # the head of a request whose upgrade is declined, to be parsed again
    _head_refused: bytes | None = None  # the answer to the pending request's head, refused (``_head_refusal``)
    _refusal: bytes | None = None  # the answer to a refused request, held until those before it are answered

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timeout = float(os.environ.get(HEADER_TIMEOUT_ENV) or DEFAULT_SECONDS)
        self._body_timeout = float(os.environ.get(BODY_TIMEOUT_ENV) or DEFAULT_BODY_SECONDS)
        cap = int(os.environ.get(MAX_CONNECTIONS_ENV) or DEFAULT_MAX_CONNECTIONS)
        transport = CoalescedWrites(transport, self.loop)  # type: ignore[assignment]  # quacks as a Transport
        self._answers = _answer_turns.get(self.loop) or _answer_turns.setdefault(self.loop, Turn(self.loop))
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else None
        if host is not None and cap > 0 and _open_by_client.get(host, 0) >= cap:
            transport.write(_raw_error(429, "Too Many Requests", "too many open connections from your address",
                                       "too_many_connections"))
            transport.close()
            return
        if host is not None:
            self._client_host = host
            _open_by_client[host] = _open_by_client.get(host, 0) + 1
        self._head_since = self.loop.time()
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_marks += 1
        if self._head_since is None:  # the next request on a kept-alive connection
            self._head_since = self.loop.time()

    def on_headers_complete(self) -> None:
        self._head_since, self._body_since = None, self.loop.time()
        self._head_marks += 1
        if (refusal := _head_refusal(self.headers, self.parser)) is not None:
            self._body_since, self._head_refused = None, refusal
            raise _HeadRefused  # stops the parser; ``_parse`` answers
        parser = self.parser
        if parser.should_upgrade() and parser.get_method() != b"CONNECT" and not self._should_upgrade():
            self._declined = head_without_upgrade(parser.get_method(), self.url, parser.get_http_version(),
                                                  self.headers)
            return  # the request is taken when parsed again (``_parse``)
        super().on_headers_complete()
        if (cycle := self.cycle) is not None and cycle.scope is self.scope:  # a request, not an upgrade
            # By weak reference: the scope is the cycle's, and a cycle kept alive by a cycle waits for the
            # garbage collector (gateway.app.GatewayApp says why that matters).
            writer = (as_http10(cycle) if self.scope["http_version"] == "1.0"  # no chunked encoding
                      else partial(_write_body_now, weakref.ref(cycle)))
            self.scope[WRITE_NOW] = writer  # type: ignore[literal-required]  # our key
            self.scope[LOOP] = self.loop  # type: ignore[literal-required]  # our key

    def on_body(self, body: bytes) -> None:
        self._body_marks += 1
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._body_since = None
        if self._declined is None:  # else the parser skipped the body: the request ends when parsed again
            super().on_message_complete()

    def on_response_complete(self) -> None:
        # The first answer to end in a turn leaves now, not after what the app still does in this
        # turn (its after-response hooks, the access log): it is the client's latency. The later
        # ones leave together at the turn's end (their writes' flush), as ``backends.turn_writes``
        # gathers the upstream requests: a client on the same host is woken once, not per answer.
        # A stream's end is its last event: it leaves now, as the stream's other chunks do.
        if self.cycle.chunked_encoding or self._answers.first():
            self.transport.flush()  # type: ignore[attr-defined]  # CoalescedWrites
        last = not self.pipeline  # no request waits to be run after this one
        super().on_response_complete()
        if self._refusal is not None and last:  # the last request before the refused one is answered
            answer, self._refusal = self._refusal, None
            self._answer_and_close(answer)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        """uvicorn's, keeping the connection's request task (``self.tasks`` is the whole server's)."""
        run = cycle.run_asgi(app)
        fresh = getattr(self.config, "reset_contextvars", False)
        task = self.loop.create_task(run, context=contextvars.Context()) if fresh else self.loop.create_task(run)
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)
        self._request_task = task

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_body()
        task, self._request_task = self._request_task, None
        if (task is not None and not task.done() and (cycle := self.cycle) is not None and not cycle.response_started
                and cycle.scope.get(CLIENT_LEFT) is False):  # an app that ends such a request quietly
            cycle.scope[CLIENT_LEFT] = True  # type: ignore[literal-required]  # our key
            task.cancel()  # still working on an answer nobody will read
        if self._client_host is not None:
            left = _open_by_client.get(self._client_host, 1) - 1
            if left > 0:
                _open_by_client[self._client_host] = left
            else:
                _open_by_client.pop(self._client_host, None)
            self._client_host = None
        super().connection_lost(exc)

    def _disarm_body(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_too_slow(self) -> None:
        self._body_timer = self._body_since = None
        cycle = getattr(self, "cycle", None)
        if cycle is not None and cycle.response_started:
            self.transport.close()
            return
        self._answer_and_close(_raw_error(408, "Request Timeout", "the request body was not sent in time",
                                          "body_timeout"))

    def _answer_and_close(self, answer: bytes) -> None:
        """A lingering close: send ``answer`` and our FIN, then read and drop what the client still
        sends for a moment. Closing at once with its bytes unread would reset the connection, and
        a reset can destroy the answer before the client reads it."""
        self.transport.write(answer)
        if not self.transport.can_write_eof():  # TLS: no half-close
            self.transport.close()
            return
        self._discarding = True
        self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def _refuse(self, answer: bytes) -> None:
        """``_answer_and_close`` once the requests pipelined before the one refused are answered, in
        order. A request whose body could not be read is itself the one refused: it is never run."""
        self._head_since = self._body_since = None  # the connection takes nothing more: no deadline is pending
        self._disarm()
        self._disarm_body()
        cycle = self.cycle
        if cycle is not None and cycle.more_body:  # the body of the last request parsed is what failed
            if self.pipeline and self.pipeline[0][0] is cycle:  # not started: those before it still answer
                self.pipeline.popleft()
                self._discarding, self._refusal = True, answer
            elif cycle.response_started and not cycle.response_complete:
                self.transport.close()  # its answer has begun: no room for another
            else:
                self._answer_and_close(answer)
        elif cycle is None or cycle.response_complete:
            self._answer_and_close(answer)
        else:  # what still arrives is dropped meanwhile
            self._discarding, self._refusal = True, answer

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes its parser refuses, in OpenAI's error shape, after the answers
        to the requests before them (uvicorn's would take the place of the first still unanswered)."""
        self._refuse(_raw_error(400, "Bad Request", "The request is not valid HTTP/1.1.", "invalid_http_request"))

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        marks, bodies = self._head_marks, self._body_marks
        self._parse(data)
        if self._body_since is not None and not self._discarding and not self.transport.is_closing():
            # a read of a pending body with no data in it (nor a head) is framing: a chunked body's
            # trailer fields, which the parser and uvicorn keep as they keep a head's, are bounded as one
            self._framing_bytes = (self._framing_bytes + len(data)
                                   if marks == self._head_marks and bodies == self._body_marks else 0)
            if self._framing_bytes > MAX_HEAD_BYTES:
                self._framing_bytes = 0
                self._fields_too_large("The request's chunk framing and trailer fields")
                return
        if self._head_since is not None and not self._discarding and not self.transport.is_closing():
            # a read in which no head began or ended was all head; of the one a head began in, what
            # came before the head (requests pipelined before it) does not count
            self._head_bytes = (self._head_bytes + len(data) if marks == self._head_marks
                                else _pending_head_bytes(self.url, self.headers, data))
            if self._head_bytes > MAX_HEAD_BYTES:
                self._head_bytes = 0
                self._fields_too_large("The request line and headers")
                return
        self._arm()

    def _fields_too_large(self, what: str) -> None:
        self._refuse(_raw_error(431, "Request Header Fields Too Large", f"{what} are over {MAX_HEAD_BYTES} bytes.",
                                "request_header_fields_too_large"))

    def _parse(self, data: bytes) -> None:
        """uvicorn's ``data_received``, but a request whose upgrade is declined is parsed again
        without it, with the bytes after its head, by a fresh parser: the connection's from then on."""
        self._unset_keepalive_if_required()
        while True:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                if self._head_refused is not None:
                    self._refuse(self._head_refused)
                    return
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
            except httptools.HttpParserUpgrade as stop:
                if self._declined is not None:
                    data, self._declined = self._declined + data[stop.args[0]:], None
                    self.parser = fresh_parser(self)
                    continue
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:  # CONNECT
                    self._unsupported_upgrade_warning()
            return

    def _arm(self) -> None:
        """Timers for what is pending after this read, none for what is not."""
        if self._head_since is None:
            self._disarm()
        elif self._head_timer is None:
            self._head_timer = self.loop.call_at(self._head_since + self._head_timeout, self._too_slow)
        if self._body_since is None:
            self._disarm_body()
        elif self._body_timer is None:
            self._body_timer = self.loop.call_at(self._body_since + self._body_timeout, self._body_too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _too_slow(self) -> None:
        self._head_timer = self._head_since = None
        self.transport.close()
