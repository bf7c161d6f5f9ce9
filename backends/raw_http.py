"""A small HTTP/1.1 client for the upstreams: keep-alive connections to one origin, answers parsed
by httptools (the parser uvicorn serves with), whole (``post``) or streamed (``open_stream``).

aiohttp cost about 0.1 ms of CPU per request in the gateway (bench/gateway_floor.py: a Litestar
route forwarding with aiohttp served a third of what the route alone did); a request here is one
write (the requests of a busy event-loop turn written together: ``backends.turn_writes``) and the
reads of its answer, and a stream's body is read by line from one buffer (``backends.raw_stream``).

What it does not do, and needs not for an API upstream: redirects, proxies from the environment,
cookies, ``Expect: 100-continue``, compression other than gzip/deflate on a whole answer (it asks
for none; one is inflated up to ``MAX_DECODED`` bytes). Deadlines are the caller's (a timeout
scope, or ``RawStream.set_exception``); connect has its own. A request goes again, once, on a new
connection only when its kept-alive one closed before any byte of the answer, at once
(``_Connection.unanswered``). A head is read up to ``MAX_HEAD`` bytes.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httptools

from backends.config import without_password
from backends.raw_stream import RawStream
from backends.turn_writes import TurnWrites

USER_AGENT = "switchyard"
MAX_HEAD = 1 << 20  # an answer's head (its status line and headers, 1xx answers' too) past this is an error
MAX_DECODED = 64 << 20  # a whole answer inflated (gzip, deflate) past this many bytes is an error
# A kept-alive connection that ends answerless this soon after its request went was closed idle by the
# upstream as the request came (its FIN or RST already on the way): the request goes again on a new one.
STALE_CLOSE = 0.5  # seconds
DNS_SECONDS = 300.0  # how long a host's resolved addresses are used


class ProtocolError(OSError):
    """The upstream's answer was not HTTP/1.1 we can read, or the connection ended mid-answer."""


class OversizedBody(ProtocolError):
    """A whole answer's compressed body inflates past ``MAX_DECODED`` bytes."""


@dataclass
class RawAnswer:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes


class _Connection(asyncio.Protocol):
    """One keep-alive connection, used by one request at a time; its requests go out through
    ``writes``, its client's for the running loop."""

    def __init__(self, writes: TurnWrites) -> None:
        self.loop = asyncio.get_running_loop()  # kept: each lookup is a system call on Python 3.11
        self.writes = writes
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.reused = False  # it carried an answer before this one (kept alive in the pool)
        self._head_bytes = 0  # bytes of this answer read before its head was whole
        self._sent_at = self._lost_at = 0.0  # the loop's clock: when the request went, when the connection ended
        self._parser = httptools.HttpResponseParser(self)
        self._answer: asyncio.Future[RawAnswer] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._headers_done = False
        self._length_known = False
        self._keep_alive = False
        self._interim = False  # the message being read is a 1xx answer, which the final one follows
        self._stream: RawStream | None = None  # a streamed answer's body goes there as it arrives

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport, from create_connection

    def data_received(self, data: bytes) -> None:
        if not self._headers_done:  # every byte before this read was the head's
            if self._head_bytes > MAX_HEAD:
                self._fail(ProtocolError(f"an answer head longer than {MAX_HEAD} bytes"))
                return
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ProtocolError(f"invalid HTTP answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed, self._lost_at = True, self.loop.time()
        if self._headers_done and not self._length_known:  # a body delimited by the end of the connection
            if self._stream is not None:
                self._stream.end()
            self._complete()
        self._fail(ProtocolError("the upstream closed the connection"))

    # ------------------------------------------------------------ httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self._parser.get_status_code() < 200:  # an interim answer (100 Continue, 103 Early Hints)
            self._headers, self._interim = {}, True  # its headers are not the answer's: the answer follows
            return
        self._headers_done = True
        h = self._headers
        self._length_known = "content-length" in h or "chunked" in h.get("transfer-encoding", "").lower()
        if self._stream is not None:
            self._complete()  # a stream's caller goes on with the status and headers

    def on_body(self, body: bytes) -> None:
        if self._stream is not None:
            self._stream.feed(body)
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._keep_alive = self._parser.should_keep_alive()  # only known inside this callback
        if self._stream is not None:
            self._stream.end()
        self._complete()

    # ------------------------------------------------------------ one exchange

    async def exchange(self, request: bytes, stream: RawStream | None = None,
                       deadline: float | None = None) -> RawAnswer:
        """Send ``request``; the whole answer, or with ``stream`` its status and headers as soon as
        they arrive (an empty body: the body goes to ``stream``). ``deadline`` (the loop's clock):
        TimeoutError if the answer is not in by then."""
        if self.closed or self.transport is None:
            raise ProtocolError("the upstream closed the connection")
        answer = self._answer = self.loop.create_future()
        self._headers, self._body, self._headers_done, self._length_known = {}, [], False, False
        self._keep_alive, self._interim, self._stream, self._head_bytes = False, False, stream, 0
        self._sent_at = self.loop.time()
        self.writes.write(self.transport, request)
        if deadline is None:
            return await answer
        timer = self.loop.call_at(deadline, _time_out, answer)
        try:
            return await answer
        finally:
            timer.cancel()

    @property
    def reusable(self) -> bool:
        return not self.closed and self._keep_alive

    @property
    def unanswered(self) -> bool:
        """Kept alive, it ended before any byte of its answer and at once (within ``STALE_CLOSE``): the
        upstream closed it idle as the request went, so it never read it. One that ends later, answerless,
        may have run the request (then crashed): it is not sent again, never to run one twice."""
        return self.reused and self._head_bytes == 0 and self._lost_at - self._sent_at < STALE_CLOSE

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()  # mid-answer (cancelled, timed out): the upstream sees us go

    def _complete(self) -> None:
        answer = self._answer
        if answer is not None and not answer.done():
            status = self._parser.get_status_code()
            answer.set_result(RawAnswer(status, self._headers, b"".join(self._body)))

    def _fail(self, exc: Exception) -> None:
        self.closed = True
        answer = self._answer
        if answer is not None and not answer.done():
            answer.set_exception(exc)
        if self._stream is not None:
            self._stream.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


def _time_out(answer: asyncio.Future[RawAnswer]) -> None:
    if not answer.done():
        answer.set_exception(TimeoutError())


class RawHTTP:
    """Keep-alive connections to the origin of ``base`` (``http://`` or ``https://``); ``headers``
    go with every request (e.g. the upstream's authorization); at most ``limit`` connections at
    once (more requests wait for one); idle ones are dropped after ``idle_seconds``."""

    def __init__(self, base: str, headers: Mapping[str, str], *, connect_timeout: float,
                 idle_seconds: float = 4.0, limit: int = 256) -> None:
        url = urlsplit(base)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {without_password(base)!r}")
        self.connect_timeout, self.idle_seconds, self.limit = connect_timeout, idle_seconds, limit
        self._tls = ssl.create_default_context() if url.scheme == "https" else None
        self._host = url.hostname
        self._port = url.port or (443 if self._tls else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        authority = host if self._port == (443 if self._tls else 80) else f"{host}:{self._port}"
        self._prefix = url.path.rstrip("/")
        self._query = f"?{url.query}" if url.query else ""  # after each request's path (Azure's api-version)
        self._fixed = _header_lines({"host": authority, "user-agent": USER_AGENT, "accept": "*/*",
                                     **headers})
        self._idle: list[_Connection] = []
        self._slots: asyncio.Semaphore | None = None  # made in the running loop, on first use
        self._resolved: list[tuple[int, tuple[Any, ...]]] = []
        self._resolved_at = -DNS_SECONDS
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writes: TurnWrites | None = None  # for the connections of one loop (the last one used)

    def clock(self) -> float:
        """The running loop's time, what a ``deadline`` is on (the loop kept, as ``_Connection`` does)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop.time()

    async def post(self, path: str, body: bytes, headers: Mapping[str, str] | None = None, *,
                   deadline: float | None = None, method: str = "POST") -> RawAnswer:
        """POST ``body`` (JSON) to ``base + path``; the answer whatever its status. ``deadline``
        (the loop's clock) bounds it all: TimeoutError past it.

        One timer on the answer when a connection is free (``asyncio.timeout`` costs about 3 µs
        and, on Python 3.11, three ``getpid`` calls); ``asyncio.timeout`` when the request must
        wait for a connection slot or open a connection."""
        slots = self._slots_now()
        if deadline is not None and (slots.locked() or not self._idle):
            async with asyncio.timeout_at(deadline):
                return await self.post(path, body, headers, method=method)
        request = self._request(path, body, headers, method)
        async with slots:
            conn = await self._connection()
            try:
                try:
                    answer = await conn.exchange(request, deadline=deadline)
                except ProtocolError:
                    if not conn.unanswered:
                        raise
                    async with asyncio.timeout_at(deadline):  # a new one: the pool's may have gone stale alike
                        conn = await self._connection(pooled=False)
                    answer = await conn.exchange(request, deadline=deadline)
            except BaseException:
                conn.close()
                raise
            self._release(conn)
        return _decoded(answer)

    async def open_stream(self, path: str, body: bytes, headers: Mapping[str, str] | None = None, *,
                          deadline: float | None = None, method: str = "POST") -> RawStream:
        """POST ``body`` (or ``method``, as ``post``'s) and return once the answer's status and headers
        are in (by ``deadline``, as ``post``'s); its body is read from the stream as it arrives. The
        caller must ``close()`` the stream."""
        slots = self._slots_now()
        if deadline is not None and (slots.locked() or not self._idle):
            async with asyncio.timeout_at(deadline):
                return await self.open_stream(path, body, headers, method=method)
        request = self._request(path, body, headers, method)
        await slots.acquire()
        stream: RawStream | None = None
        try:
            conn = await self._connection()
            stream = RawStream(conn, self, slots)
            try:
                answer = await conn.exchange(request, stream, deadline)
            except ProtocolError:
                if not conn.unanswered:
                    raise
                async with asyncio.timeout_at(deadline):  # as ``post``'s
                    conn = await self._connection(pooled=False)
                stream = RawStream(conn, self, slots)
                answer = await conn.exchange(request, stream, deadline)
        except BaseException:
            if stream is not None:
                stream.close()
            else:
                slots.release()
            raise
        # an error answer's body is read whole, and inflated (``decoded_body``), as ``post``'s is
        if answer.status < 300 and answer.headers.get("content-encoding", "identity").lower() not in ("identity", ""):
            stream.close()
            raise ProtocolError("a compressed stream (content-encoding) was not asked for")
        stream.status, stream.headers = answer.status, answer.headers
        return stream

    def _request(self, path: str, body: bytes, headers: Mapping[str, str] | None, method: str = "POST") -> bytes:
        """The request's bytes; a ``path`` with a query of its own has the base URL's query after it."""
        query = self._query if not self._query or "?" not in path else "&" + self._query[1:]
        return b"".join((
            f"{method} {self._prefix}{path}{query} HTTP/1.1\r\n".encode(), self._fixed,
            _header_lines(headers) if headers else b"",
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body), body,
        ))  # fmt: skip

    def _slots_now(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        return self._slots

    def _release(self, conn: _Connection) -> None:
        """Back to the idle list if the answer ended and the connection may carry another."""
        if conn.reusable:
            conn.idle_since, conn.reused = time.monotonic(), True
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def _connection(self, pooled: bool = True) -> _Connection:
        """An idle connection the upstream has not closed and that is not about to be dropped (idle
        past ``idle_seconds``: servers drop theirs after about 5 s), else (or not ``pooled``) a new one."""
        now = time.monotonic()
        while pooled and self._idle:
            conn = self._idle.pop()
            if not conn.closed and now - conn.idle_since < self.idle_seconds:
                return conn
            conn.close()
        loop = asyncio.get_running_loop()
        if self._writes is None or self._writes.loop is not loop:
            self._writes = TurnWrites(loop)
        writes = self._writes
        async with asyncio.timeout(self.connect_timeout):
            addresses = await self._addresses(loop)
            for i, (family, address) in enumerate(addresses):
                try:
                    _, conn = await loop.create_connection(
                        lambda: _Connection(writes), address[0], address[1], family=family, ssl=self._tls,
                        server_hostname=self._host if self._tls else None)
                    return conn
                except OSError:
                    self._resolved_at = -DNS_SECONDS  # resolve again next time
                    if i == len(addresses) - 1:
                        raise
        raise OSError(f"no address for {self._host}")

    async def _addresses(self, loop: asyncio.AbstractEventLoop) -> list[tuple[int, tuple[Any, ...]]]:
        """The host's addresses, resolved at most every ``DNS_SECONDS`` (a burst of new connections
        would otherwise each ask the resolver, in a thread)."""
        if time.monotonic() - self._resolved_at >= DNS_SECONDS or not self._resolved:
            infos = await loop.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM)
            self._resolved = [(family, address) for family, _, _, _, address in infos]
            self._resolved_at = time.monotonic()
        return self._resolved


def _header_lines(headers: Mapping[str, str]) -> bytes:
    lines = []
    for name, value in headers.items():
        if any(c in name or c in value for c in "\r\n\0"):
            raise ValueError(f"a header ({name!r}) holds a line break or NUL")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines).encode("latin-1")


def _decoded(answer: RawAnswer) -> RawAnswer:
    """The answer without a gzip/deflate content-encoding (an upstream may use one unasked)."""
    body = decoded_body(answer.headers, answer.body)
    return answer if body is answer.body else RawAnswer(answer.status, answer.headers, body)


def decoded_body(headers: Mapping[str, str], body: bytes) -> bytes:
    """A whole body without its gzip/deflate content-encoding: ``body`` itself when it has none;
    ``OversizedBody`` past ``MAX_DECODED`` bytes inflated (a small body may inflate to gigabytes)."""
    encoding = headers.get("content-encoding", "identity").lower()
    if encoding in ("identity", ""):
        return body
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise ProtocolError(f"unsupported content-encoding {encoding!r}")
    try:
        if encoding != "deflate":
            return _inflated(body, 47, encoding)
        try:
            return _inflated(body, 15, encoding)  # zlib-wrapped, as RFC 9110 says
        except zlib.error:
            return _inflated(body, -15, encoding)  # raw deflate, as some servers send
    except zlib.error as exc:
        raise ProtocolError(f"invalid {encoding} body: {exc}") from None


def _inflated(body: bytes, wbits: int, encoding: str) -> bytes:
    inflater = zlib.decompressobj(wbits)
    data = inflater.decompress(body, MAX_DECODED)
    if inflater.unconsumed_tail or (len(data) == MAX_DECODED and not inflater.eof):  # the limit reached, not the end
        raise OversizedBody(f"a {encoding} body that inflates past {MAX_DECODED} bytes")
    if not inflater.eof:
        raise zlib.error("incomplete or truncated stream")
    return data
