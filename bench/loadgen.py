"""The benchmarks' load generator: prepared HTTP/1.1 requests on keep-alive connections, closed
loop (fixed connections), open loop (a fixed offered rate, latency from the scheduled send) and
bursts; ``wrk`` where it is installed."""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec

P = ParamSpec("P")

# ---------------------------------------------------------------- the load generator


@dataclass
class Result:
    status: int
    first: float  # seconds from send to the first body byte
    total: float  # seconds from send to the end of the body


class Conn:
    """One keep-alive HTTP/1.1 connection that sends a prepared request and reads the answer
    (content-length or chunked), timing the first body chunk and the end."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> Conn:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        return cls(reader, writer)

    async def request(self, raw: bytes, t0: float | None = None) -> Result:
        """Send ``raw`` and read the answer; times count from ``t0`` (default: now)."""
        t0 = time.perf_counter() if t0 is None else t0
        self.writer.write(raw)
        reader = self.reader
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        first: float | None = None
        if b"transfer-encoding: chunked" in lower:
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await reader.readexactly(size + 2)
                if size == 0:
                    break
                if first is None:
                    first = time.perf_counter() - t0
        else:
            at = lower.find(b"content-length:")
            length = int(lower[at + 15 : lower.find(b"\r\n", at)]) if at >= 0 else 0
            await reader.readexactly(length)
        total = time.perf_counter() - t0
        return Result(status, total if first is None else first, total)

    def close(self) -> None:
        self.writer.close()


Target = tuple[str, int, bytes]  # host, port, the raw request


def http_request(url: str, path: str, body: dict[str, Any], key: str | None) -> Target:
    host_port = url.removeprefix("http://")
    host, port = host_port.split(":")
    data = json.dumps(body).encode()
    auth = f"authorization: Bearer {key}\r\n" if key else ""
    raw = (
        f"POST {path} HTTP/1.1\r\nhost: {host_port}\r\ncontent-type: application/json\r\n{auth}"
        f"content-length: {len(data)}\r\n\r\n"
    ).encode() + data
    return host, int(port), raw


@dataclass
class Run:
    results: list[Result] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> list[Result]:
        return [r for r in self.results if r.status == 200]

    def pct(self, q: float, what: str = "total") -> float:
        values = sorted(getattr(r, what) for r in self.ok)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(q * len(values)))] * 1000


def _collector_paused(run: Callable[P, Awaitable[Run]]) -> Callable[P, Awaitable[Run]]:
    """The cycle collector off while a run sends (collected before): here a full collection over
    the results of the runs before took about 50 ms, and every request scheduled in such a pause
    counted it as the server's latency (``bench.gateway`` (b)'s p99, direct or through the gateway,
    whichever slice it fell in)."""

    @functools.wraps(run)
    async def measured(*args: P.args, **kwargs: P.kwargs) -> Run:
        outermost = gc.isenabled()
        gc.collect()
        gc.disable()
        try:
            return await run(*args, **kwargs)
        finally:
            if outermost:
                gc.enable()

    return measured


@_collector_paused
async def closed_loop(target: Target, connections: int, seconds: float, stagger: float = 0.0) -> Run:
    """``connections`` clients, each sending its next request as soon as the last one is answered;
    their first requests spread evenly over ``stagger`` seconds (else all at once, and requests
    of equal length stay in step, arriving in bursts)."""
    host, port, raw = target
    run = Run()
    stop_at = time.perf_counter() + seconds

    async def client(i: int) -> None:
        conn = await Conn.open(host, port)
        await asyncio.sleep(stagger * i / connections)
        try:
            while time.perf_counter() < stop_at:
                try:
                    run.results.append(await conn.request(raw))
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    run.errors += 1
                    conn.close()
                    conn = await Conn.open(host, port)
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(connections)))
    run.seconds = time.perf_counter() - t0
    return run


@_collector_paused
async def open_loop(target: tuple[str, int, bytes], rate: float, seconds: float, pool: int = 200) -> Run:
    """Requests sent on a fixed schedule (``rate`` per second), whatever the answers' speed, over at
    most ``pool`` keep-alive connections (as a client's pool; the gateway refuses more than 256 from
    one address). Times count from each request's scheduled send, so a server that falls behind
    shows its queueing."""
    host, port, raw = target
    run = Run()
    idle: asyncio.Queue[Conn] = asyncio.Queue()
    opened = 0

    async def one(scheduled: float) -> None:
        nonlocal opened
        if idle.empty() and opened < pool:
            opened += 1
            conn = await Conn.open(host, port)
        else:
            conn = await idle.get()
        try:
            result = await conn.request(raw, scheduled)
            run.results.append(result)
            idle.put_nowait(conn)
        except (OSError, asyncio.IncompleteReadError, ValueError, RuntimeError):
            run.errors += 1
            conn.close()
            opened -= 1

    for _ in range(min(64, int(rate))):  # warm connections, as a client's pool would have
        idle.put_nowait(await Conn.open(host, port))
        opened += 1
    tasks = []
    t0 = time.perf_counter()
    for i in range(int(rate * seconds)):
        scheduled = t0 + i / rate
        if (delay := scheduled - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(scheduled)))
    await asyncio.gather(*tasks)
    run.seconds = time.perf_counter() - t0
    while not idle.empty():
        idle.get_nowait().close()
    return run


@_collector_paused
async def bursts(target: tuple[str, int, bytes], concurrency: int, rounds: int) -> Run:
    """``rounds`` times: ``concurrency`` requests at once (each on its own connection)."""
    host, port, raw = target
    run = Run()
    conns = [await Conn.open(host, port) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for _ in range(rounds):
        for outcome in await asyncio.gather(*(c.request(raw) for c in conns), return_exceptions=True):
            if isinstance(outcome, Result):
                run.results.append(outcome)
            else:
                run.errors += 1
    run.seconds = time.perf_counter() - t0
    for conn in conns:
        conn.close()
    return run


def wrk_rps(url: str, path: str, body: dict[str, Any], key: str, connections: int, seconds: float) -> tuple[float, int]:
    """(requests/s, non-2xx count) from Debian's wrk."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(
            f'wrk.method = "POST"\nwrk.body = {json.dumps(json.dumps(body))}\n'
            f'wrk.headers["content-type"] = "application/json"\n'
            f'wrk.headers["authorization"] = "Bearer {key}"\n'
        )
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "-s", script.name, url + path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    os.unlink(script.name)
    rps = next(float(line.split()[1]) for line in out.splitlines() if line.startswith("Requests/sec:"))
    bad = next((int(line.split()[-1]) for line in out.splitlines() if "Non-2xx" in line), 0)
    return rps, bad
