"""A small HTTP/1.1 client for whole (non-streaming) upstream answers: keep-alive connections to one
origin, responses parsed by httptools (the parser uvicorn serves with).

aiohttp cost about 0.1 ms of CPU per request in the gateway (bench/gateway_floor.py: a Litestar
route forwarding with aiohttp served a third of what the route alone did); a request here is one
write and the reads of its answer. Streams stay on aiohttp (``backends.http_upstream``).

What it does not do, and needs not for an API upstream: redirects, proxies from the environment,
cookies, ``Expect: 100-continue``, compression other than gzip/deflate (it asks for none).
Deadlines are the caller's (a timeout scope around ``request``); connect has its own.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

USER_AGENT = "switchyard"


class ProtocolError(OSError):
    """The upstream's answer was not HTTP/1.1 we can read, or the connection ended mid-answer."""


@dataclass
class RawAnswer:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes


class _Connection(asyncio.Protocol):
    """One keep-alive connection, used by one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._answer: asyncio.Future[RawAnswer] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._headers_done = False
        self._length_known = False
        self._keep_alive = False

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport, from create_connection

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ProtocolError(f"invalid HTTP answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._headers_done and not self._length_known:  # a body delimited by the end of the connection
            self._complete()
        self._fail(ProtocolError("the upstream closed the connection"))

    # ------------------------------------------------------------ httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._headers_done = True
        h = self._headers
        self._length_known = "content-length" in h or "chunked" in h.get("transfer-encoding", "").lower()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._keep_alive = self._parser.should_keep_alive()  # only known inside this callback
        self._complete()

    # ------------------------------------------------------------ one exchange

    async def exchange(self, request: bytes) -> RawAnswer:
        if self.closed or self.transport is None:
            raise ProtocolError("the upstream closed the connection")
        self._answer = asyncio.get_running_loop().create_future()
        self._headers, self._body, self._headers_done, self._length_known = {}, [], False, False
        self._keep_alive = False
        self.transport.write(request)
        return await self._answer

    @property
    def reusable(self) -> bool:
        return not self.closed and self._keep_alive

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
        if self.transport is not None:
            self.transport.close()


class RawHTTP:
    """Keep-alive connections to the origin of ``base`` (``http://`` or ``https://``); ``headers``
    go with every request (e.g. the upstream's authorization); at most ``limit`` connections at
    once (more requests wait for one); idle ones are dropped after ``idle_seconds``."""

    def __init__(self, base: str, headers: Mapping[str, str], *, connect_timeout: float,
                 idle_seconds: float = 4.0, limit: int = 256) -> None:
        url = urlsplit(base)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base!r}")
        self.connect_timeout, self.idle_seconds, self.limit = connect_timeout, idle_seconds, limit
        self._tls = ssl.create_default_context() if url.scheme == "https" else None
        self._host = url.hostname
        self._port = url.port or (443 if self._tls else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        authority = host if self._port == (443 if self._tls else 80) else f"{host}:{self._port}"
        self._prefix = url.path.rstrip("/")
        self._fixed = _header_lines({"host": authority, "user-agent": USER_AGENT, "accept": "application/json",
                                     **headers})
        self._idle: list[_Connection] = []
        self._slots: asyncio.Semaphore | None = None  # made in the running loop, on first use

    async def post(self, path: str, body: bytes, headers: Mapping[str, str] | None = None) -> RawAnswer:
        """POST ``body`` (JSON) to ``base + path``; the answer whatever its status."""
        request = b"".join((
            f"POST {self._prefix}{path} HTTP/1.1\r\n".encode(), self._fixed,
            _header_lines(headers) if headers else b"",
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body), body,
        ))  # fmt: skip
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        async with self._slots:
            conn = await self._connection()
            try:
                answer = await conn.exchange(request)
            except BaseException:
                conn.close()
                raise
            if conn.reusable:
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
            else:
                conn.close()
        return _decoded(answer)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def _connection(self) -> _Connection:
        """An idle connection the upstream has not closed and that is not about to be dropped (idle
        past ``idle_seconds``: servers drop theirs after about 5 s), else a new one."""
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and now - conn.idle_since < self.idle_seconds:
                return conn
            conn.close()
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout):
            _, conn = await loop.create_connection(_Connection, self._host, self._port, ssl=self._tls)
        return conn


def _header_lines(headers: Mapping[str, str]) -> bytes:
    lines = []
    for name, value in headers.items():
        if any(c in name or c in value for c in "\r\n\0"):
            raise ValueError(f"a header ({name!r}) holds a line break or NUL")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines).encode("latin-1")


def _decoded(answer: RawAnswer) -> RawAnswer:
    """The body without a gzip/deflate content-encoding (an upstream may use one unasked)."""
    encoding = answer.headers.get("content-encoding", "identity").lower()
    if encoding in ("identity", ""):
        return answer
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise ProtocolError(f"unsupported content-encoding {encoding!r}")
    try:
        body = zlib.decompress(answer.body, 47) if encoding != "deflate" else _inflate(answer.body)
    except zlib.error as exc:
        raise ProtocolError(f"invalid {encoding} body: {exc}") from None
    return RawAnswer(answer.status, answer.headers, body)


def _inflate(body: bytes) -> bytes:
    try:
        return zlib.decompress(body)  # zlib-wrapped, as RFC 9110 says
    except zlib.error:
        return zlib.decompress(body, -15)  # raw deflate, as some servers send
