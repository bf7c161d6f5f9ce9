"""A small pipelining Redis client for the quota scripts: RESP over one asyncio connection.

Commands issued in one turn of the event loop go out in one write at the end of that turn, and
replies are matched in order (Redis answers each connection in order), so concurrent requests
share one connection and their round trips overlap with no pool to check out of; replies are
parsed by hiredis (C). This costs about a tenth of redis-py's asyncio client per command, and the
quota store issues two commands per request: admit, and settle, which the request path sends
without waiting for its reply (``submit``).

Failure model: a command waits at most ``timeout`` seconds (one timer per connection, for the
oldest command waiting: a timer per command cost about as much as the rest of the client); a timeout
or a broken connection aborts the connection, fails every command waiting on it with
``RedisUnavailable``, and the next command reconnects. Error replies raise ``RedisError``. From a
timeout (a command's, or a connect's) until Redis answers a PING again (sent in the background,
``RECOVERY_INTERVAL`` apart), every command fails at once (``RedisUnavailable``): a Redis gone silent
costs the requests already waiting the timeout, not every request after them. A refused or lost
connection fails fast by itself, and the next command simply reconnects (a restarted Redis is used
again at once).
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import hiredis

Arg = str | bytes | int | float


class RedisError(Exception):
    """Redis answered with an error reply."""


class RedisUnavailable(ConnectionError):
    """No connection to Redis, or it broke or timed out while a command waited."""


# The RESP bulk strings of recent str and int arguments: a quota script's keys, limits and SHA-1
# repeat from request to request (about half of encoding an admission's 29 arguments). Bounded:
# emptied when full. Floats, bools and bytes are never kept (1 == 1.0 == True as dict keys).
_BULK_CACHE: dict[str | int, bytes] = {}
_BULK_CACHE_SIZE = 8192


def _bulk(arg: Arg) -> bytes:
    data = arg if type(arg) is bytes else (repr(arg) if type(arg) is float else str(arg)).encode()
    return b"$%d\r\n%b\r\n" % (len(data), data)


def encode_command(args: tuple[Arg, ...]) -> bytes:
    cache = _BULK_CACHE
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if type(arg) is str or type(arg) is int:
            chunk = cache.get(arg)
            if chunk is None:
                if len(cache) >= _BULK_CACHE_SIZE:
                    cache.clear()
                chunk = cache[arg] = _bulk(arg)
        else:
            chunk = _bulk(arg)
        out.append(chunk)
    return b"".join(out)


RECOVERY_INTERVAL = 0.5  # seconds between the PINGs that find out whether a silent Redis is back

# Commands written and not yet answered beyond which a command that is waited for (an admission)
# leaves with the loop's turn, not at once: Redis is behind, and each write is a system call and a
# loopback packet. Measured against writing every admission at once (bench.gateway_ab, 16 rounds):
# at 64 connections with no upstream latency ((a)) the gateway spent 9 % less CPU per request;
# with 64 streams kept up ((c)) the first chunk's added p50 and p90 stayed the same. With 3, and
# commands merely queued for the turn's end counted too, (c)'s p90 grew by a millisecond.
PIPELINE_BEYOND = 16


class _Protocol(asyncio.Protocol):
    """One connection: commands written in order, their replies matched to them in order.

    A reply not in ``timeout`` after its command was sent fails that command and drops the
    connection (the replies after it could no longer be matched). Replies come in order, so one
    timer, for the oldest command waiting, watches them all."""

    def __init__(self, timeout: float, on_timeout: Callable[[], None] = lambda: None) -> None:
        self.loop = asyncio.get_running_loop()  # kept: each lookup is a system call on Python 3.11
        self.timeout = timeout
        self.on_timeout = on_timeout
        self.transport: asyncio.Transport | None = None
        self.reader = hiredis.Reader()
        self.waiting: deque[asyncio.Future[object]] = deque()
        self.sent_at: deque[float] = deque()  # the loop time each waiting command was sent
        self.outgoing: list[bytes] = []  # commands nobody waits on: written together when the turn ends
        self.scripts: set[str] = set()  # SHA-1s of the scripts sent SCRIPT LOAD on this connection
        self.lost = False
        self._watch: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            future = self.waiting.popleft()
            self.sent_at.popleft()
            if future.done():  # a cancelled waiter leaves its slot, so replies stay in order
                continue
            if isinstance(reply, hiredis.ReplyError):
                future.set_exception(RedisError(str(reply)))
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lost:
            return  # a timeout ended it already (then the transport closed)
        self.lost = True
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        error = RedisUnavailable(f"connection to Redis lost ({exc or 'closed'})")
        self.sent_at.clear()
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(error)

    def send(self, payload: bytes, at_once: bool = True) -> asyncio.Future[object]:
        """Send a command: at once (with the commands this turn left for its end, in order, in one
        system call), or when the loop's turn ends, with the others left so: with
        ``at_once=False``, or while more than ``PIPELINE_BEYOND`` commands written await their
        replies (Redis is behind, and the command's reply would come after theirs; a busy loop
        then writes many commands in one call)."""
        loop = self.loop
        future = loop.create_future()
        now = loop.time()
        self.waiting.append(future)
        self.sent_at.append(now)
        if self._watch is None:
            self._watch = loop.call_at(now + self.timeout, self._check)
        self.outgoing.append(payload)
        if at_once and len(self.waiting) - len(self.outgoing) <= PIPELINE_BEYOND:  # written and unanswered
            self._flush()
        elif len(self.outgoing) == 1:
            loop.call_soon(self._flush)
        return future

    def _check(self) -> None:
        """The oldest command's deadline: passed, it fails and the connection goes; else wait for it."""
        self._watch = None
        if not self.waiting or self.lost:
            return
        due = self.sent_at[0] + self.timeout
        if self.loop.time() < due:
            self._watch = self.loop.call_at(due, self._check)
            return
        self.on_timeout()
        if not (oldest := self.waiting[0]).done():
            oldest.set_exception(RedisUnavailable(f"Redis did not answer within {self.timeout} s"))
        if self.transport is not None:
            self.transport.abort()
        self.connection_lost(RedisUnavailable("timed out"))

    def _flush(self) -> None:
        if not self.outgoing:
            return
        data, self.outgoing = b"".join(self.outgoing), []
        if self.transport is not None and not self.lost:
            self.transport.write(data)


class _Subscriber(asyncio.Protocol):
    """A connection in pub/sub mode: the data of each message on its channel goes to ``on_message``."""

    def __init__(self, on_message: Callable[[bytes], None]) -> None:
        loop = asyncio.get_running_loop()
        self.on_message = on_message
        self.reader = hiredis.Reader()
        self.transport: asyncio.Transport | None = None
        self.subscribed: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            if isinstance(reply, list) and reply[:1] == [b"message"]:
                self.on_message(reply[2])
            elif isinstance(reply, list) and reply[:1] == [b"subscribe"] and not self.subscribed.done():
                self.subscribed.set_result(None)
            elif isinstance(reply, hiredis.ReplyError) and not self.subscribed.done():
                self.subscribed.set_exception(RedisError(str(reply)))  # AUTH (or SUBSCRIBE) refused

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.subscribed.done():
            self.subscribed.set_exception(RedisUnavailable(f"connection to Redis lost ({exc or 'closed'})"))
        if not self.closed.done():
            self.closed.set_result(None)


class Subscription:
    """A channel followed on a connection of its own (``RespClient.subscribe``)."""

    def __init__(self, protocol: _Subscriber) -> None:
        self._protocol = protocol
        self.closed: asyncio.Future[None] = protocol.closed  # done when the connection is lost

    def close(self) -> None:
        if self._protocol.transport is not None:
            self._protocol.transport.close()


class Script:
    """A Lua script run by its SHA-1 (EVALSHA). Each connection is sent ``SCRIPT LOAD`` ahead of
    the script's first EVALSHA on it: Redis runs a connection's commands in order, so the script is
    known when its EVALSHA arrives, on a new server or one restarted (an empty script cache). Were
    the EVALSHA answered NOSCRIPT instead, the script would go again whole (EVAL) behind the commands
    sent in the meantime: a settlement sent without waiting would run after the next admission.
    That fallback stays for a cache flushed while the connection is open (``SCRIPT FLUSH``)."""

    def __init__(self, client: RespClient, source: str) -> None:
        self.client = client
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(self, keys: list[str], args: list[Arg]) -> object:
        self.client.check_available()
        protocol = self.client.open_connection() or await self.client.connect()
        self._load_on(protocol)
        try:
            return await protocol.send(encode_command(("EVALSHA", self.sha, len(keys), *keys, *args)))
        except RedisError as exc:
            if not _unknown_script(exc):
                raise
        return await self.client.execute("EVAL", self.source, len(keys), *keys, *args)

    def submit(self, keys: list[str], args: list[Arg]) -> asyncio.Future[object]:
        """Run the script without waiting: sent with this turn's other commands, its reply in the
        future returned (within the client's timeout, as every command is). With no connection
        open it is sent once one is, as ``__call__`` sends it."""
        protocol = self.client.open_connection()
        if protocol is None or self.client.failing:
            return asyncio.ensure_future(self(keys, args))
        self._load_on(protocol)
        sent = protocol.send(encode_command(("EVALSHA", self.sha, len(keys), *keys, *args)), at_once=False)
        result: asyncio.Future[object] = sent.get_loop().create_future()

        def on_reply(reply: asyncio.Future[object]) -> None:
            if not reply.cancelled() and _unknown_script(reply.exception()):
                reply = self.client.submit("EVAL", self.source, len(keys), *keys, *args)
                reply.add_done_callback(partial(_copy_outcome, result))
            else:
                _copy_outcome(result, reply)

        sent.add_done_callback(on_reply)
        return result

    def _load_on(self, protocol: _Protocol) -> None:
        """Queue ``SCRIPT LOAD`` on ``protocol`` unless it had it. Its reply is not needed: a script
        Redis refuses to load is answered NOSCRIPT, and its EVAL then raises Redis's reason."""
        if self.sha not in protocol.scripts:
            protocol.scripts.add(self.sha)
            protocol.send(encode_command(("SCRIPT", "LOAD", self.source)), at_once=False).add_done_callback(_ignore)


def _unknown_script(exc: BaseException | None) -> bool:
    return isinstance(exc, RedisError) and str(exc).startswith("NOSCRIPT")


def _ignore(reply: asyncio.Future[object]) -> None:
    if not reply.cancelled():
        reply.exception()  # retrieved, so that asyncio does not log it as never retrieved


def _copy_outcome(result: asyncio.Future[object], reply: asyncio.Future[object]) -> None:
    if result.done():
        return
    if reply.cancelled():
        result.cancel()
    elif (exc := reply.exception()) is not None:
        result.set_exception(exc)
    else:
        result.set_result(reply.result())


class RespClient:
    def __init__(self, host: str = "127.0.0.1", port: int = 6379, *, db: int = 0, username: str | None = None,
                 password: str | None = None, tls: bool = False, timeout: float = 2.0,
                 unix_path: str | None = None) -> None:
        self.host, self.port, self.db = host, port, db
        self.unix_path = unix_path  # a Unix socket to connect to instead of host:port
        self.username, self.password, self.tls = username, password, tls
        self.timeout = timeout
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Lock | None = None
        self.failing = False  # a command or a connect timed out, and Redis has not answered a PING since
        self._recovery: asyncio.Task[None] | None = None  # while failing: the PINGs that find out

    @classmethod
    def from_url(cls, url: str, *, timeout: float = 2.0) -> RespClient:
        """``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS), or a Unix socket as
        redis-py writes it: ``unix://[[user]:password@]/path/to/redis.sock[?db=N]``."""
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"unsupported Redis URL scheme {parts.scheme!r} (use redis://, rediss:// or unix://)")
        username = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password else None
        if parts.scheme == "unix":
            if not parts.path:
                raise ValueError("a unix:// Redis URL needs the socket's path: unix:///path/to/redis.sock")
            db = parse_qs(parts.query).get("db", ["0"])[-1]
            return cls(db=int(db), username=username, password=password, timeout=timeout,
                       unix_path=unquote(parts.path))
        path = parts.path.strip("/")
        return cls(parts.hostname or "127.0.0.1", parts.port or 6379, db=int(path) if path else 0,
                   username=username, password=password, tls=parts.scheme == "rediss", timeout=timeout)

    @property
    def address(self) -> str:
        """Where Redis is, for messages."""
        return self.unix_path or f"{self.host}:{self.port}"

    async def _open(self, factory: Callable[[], asyncio.Protocol]) -> Any:
        """A new connection's protocol, over the Unix socket or TCP (TLS for rediss://)."""
        loop = asyncio.get_running_loop()
        if self.unix_path is not None:
            _, protocol = await loop.create_unix_connection(factory, self.unix_path)
        else:
            _, protocol = await loop.create_connection(
                factory, self.host, self.port, ssl=ssl.create_default_context() if self.tls else None)
        return protocol

    def register_script(self, source: str) -> Script:
        return Script(self, source)

    async def subscribe(self, channel: str, on_message: Callable[[bytes], None]) -> Subscription:
        """Follow ``channel`` on a new connection (SUBSCRIBE): ``on_message`` gets each message's
        data, from the time this returns until the subscription's ``closed`` is done."""
        commands: list[tuple[Arg, ...]] = []
        if self.password is not None:
            commands.append(("AUTH", self.username, self.password) if self.username else ("AUTH", self.password))
        commands.append(("SUBSCRIBE", channel))
        try:
            async with asyncio.timeout(self.timeout):
                protocol: _Subscriber = await self._open(lambda: _Subscriber(on_message))
                subscription = Subscription(protocol)
                protocol.transport.write(b"".join(encode_command(c) for c in commands))  # type: ignore[union-attr]
                try:
                    await protocol.subscribed
                except BaseException:
                    subscription.close()
                    raise
        except (OSError, TimeoutError) as exc:
            raise RedisUnavailable(f"cannot subscribe at {self.address} ({exc})") from None
        return subscription

    async def execute(self, *args: Arg) -> object:
        self.check_available()
        protocol = self.open_connection() or await self.connect()
        return await protocol.send(encode_command(args))

    def submit(self, *args: Arg) -> asyncio.Future[object]:
        """Send a command without waiting for its reply: on the open connection it leaves when this
        turn of the loop ends, with the turn's other such commands, in order; with none open it is
        sent once one is (``execute``). A command that is waited for (``execute``) leaves at once."""
        protocol = self.open_connection()
        if protocol is None or self.failing:
            return asyncio.ensure_future(self.execute(*args))
        return protocol.send(encode_command(args), at_once=False)

    def check_available(self) -> None:
        """Raise ``RedisUnavailable`` at once while Redis is silent (``failing``)."""
        if self.failing:
            raise RedisUnavailable("Redis did not answer in time; commands fail at once until it answers a PING")

    def _timed_out(self) -> None:
        if not self.failing:
            self.failing = True
            self._recovery = asyncio.get_running_loop().create_task(self._recover(), name="redis-recovery")

    async def _recover(self) -> None:
        """PING until Redis answers (any reply, an error included: it is there again)."""
        while True:
            try:
                protocol = self.open_connection() or await self.connect()
                await protocol.send(encode_command(("PING",)))
            except RedisUnavailable:
                await asyncio.sleep(RECOVERY_INTERVAL)
                continue
            except RedisError:
                pass
            self.failing = False
            self._recovery = None
            return

    def open_connection(self) -> _Protocol | None:
        """The connection, unless there is none or it is lost."""
        protocol = self._protocol
        return None if protocol is None or protocol.lost else protocol

    async def ping(self) -> bool:
        return await self.execute("PING") in (b"PONG", "PONG")

    async def aclose(self) -> None:
        if self._recovery is not None:
            self._recovery.cancel()
            self._recovery = None
            self.failing = False
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()

    async def connect(self) -> _Protocol:
        """A new connection (unless another caller just opened one)."""
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._protocol is not None and not self._protocol.lost:
                return self._protocol  # another caller connected while this one waited
            try:
                async with asyncio.timeout(self.timeout):
                    protocol: _Protocol = await self._open(lambda: _Protocol(self.timeout, self._timed_out))
                    await self._handshake(protocol)
            except (OSError, TimeoutError) as exc:
                if isinstance(exc, TimeoutError):
                    self._timed_out()
                raise RedisUnavailable(f"cannot connect to Redis at {self.address} ({exc})") from None
            self._protocol = protocol
            return protocol

    async def _handshake(self, protocol: _Protocol) -> None:
        commands: list[tuple[Arg, ...]] = []
        if self.password is not None:
            commands.append(("AUTH", self.username, self.password) if self.username else ("AUTH", self.password))
        if self.db:
            commands.append(("SELECT", self.db))
        for command in commands:
            try:
                await protocol.send(encode_command(command))
            except RedisError as exc:
                protocol.transport.close()  # type: ignore[union-attr]
                raise RedisError(f"{command[0]!r} failed: {exc}") from None
