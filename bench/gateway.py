"""What the gateway adds to every request, measured against the same upstream hit directly.

Starts, each in its own process on loopback: three echo upstreams (no latency; 20 ms latency; 20
chunks 5 ms apart), and the gateway (``switchyard serve`` settings: uvicorn + uvloop + httptools,
one worker unless ``--workers``) on the full production path: SQL API keys (PostgreSQL), Redis
quotas with high limits, usage metered into PostgreSQL. A fresh PostgreSQL database is created and
dropped. Load comes from a small raw-HTTP/1.1 asyncio client on keep-alive connections (or ``wrk``
for (a) with ``--wrk``).

    .venv/bin/python -m bench.gateway [--seconds 8] [--rates 500,1000] [--workers 1] [--no-pin]
                                      [--wrk] [--profile prof.txt --profile-phase a]

Pinning (the default on a machine with at least two CPUs): the gateway (all its workers) runs on
the first ``--workers`` CPUs with ``taskset``; this process (the load generator) and the echo
upstreams on the others (PostgreSQL and Redis are not pinned). Each figure is measured in the same
run against the upstream hit directly, so ratios hold better than absolute numbers on a busy host.

(a) non-streaming requests/s at 64 concurrent connections, zero upstream latency, and its ratio
    to the direct upstream's rate; the gateway's CPU time per request
(b) added latency p50/p99 at fixed offered rates (default 500 and 1,000 requests/s), 20 ms upstream
    latency; the rate actually served
(c) 64 concurrent streams of 20 chunks 5 ms apart: added time to first chunk and total p50/p99;
    streams completed per second, and their ratio to the direct upstream's
(d) each gateway worker's RSS after the run; and usage rows in PostgreSQL = requests sent.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
ADMIN_KEY = "sk-bench-admin"
REDIS_URL = os.environ.get("SWITCHYARD_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
HIGH = {"requests_per_minute": 100_000_000, "tokens_per_minute": 2_000_000_000, "max_concurrency": 100_000}


# ---------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def start_upstream(*args: str, cpus: str | None = None) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [
        *(["taskset", "-c", cpus] if cpus else []),
        sys.executable,
        "-m",
        "backends.dev.echo_server",
        "--port",
        str(port),
        *args,
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/v1/models", proc)
    return proc, url


def stop(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker_pids(pid: int) -> list[int]:
    """The processes serving requests: the children of a multi-worker supervisor, else ``pid``."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            children += [int(c) for c in (task / "children").read_text().split()]
    # uvicorn's multiprocessing start method also forks a resource tracker: it serves nothing.
    workers = [c for c in children if b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()]
    return workers or [pid]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Gateway:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path


def start_gateway(config: dict[str, Any], workdir: Path, workers: int = 1, cpus: str | None = None) -> Gateway:
    """``switchyard serve`` with ``workers`` workers, as a separate process (on ``cpus`` with taskset)."""
    path = workdir / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD")}
    log = workdir / "gateway.log"
    cmd = [
        *(["taskset", "-c", cpus] if cpus else []),
        str(Path(sys.executable).parent / "switchyard"),
        "serve",
        "--config",
        str(path),
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/healthz", proc)
    except RuntimeError:
        stop(proc)
        raise RuntimeError(f"the gateway did not start:\n{log.read_text()[-3000:]}") from None
    return Gateway(proc, url, log)


# ---------------------------------------------------------------- PostgreSQL


async def _pg_connect(database: str) -> Any:
    import asyncpg

    for user in (os.environ.get("SWITCHYARD_TEST_PG_USER"), "postgres", "root"):
        if user:
            with contextlib.suppress(Exception):
                return user, await asyncpg.connect(host="127.0.0.1", port=5432, user=user, database=database)
    raise RuntimeError("cannot connect to PostgreSQL at 127.0.0.1:5432 (run tests/start_services.sh)")


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    """A new, migrated PostgreSQL database (dropped afterwards); yields its SQLAlchemy URL."""
    from gateway.db import migrate

    name = f"sybench_{uuid.uuid4().hex[:10]}"

    async def run(sql: str) -> str:
        user, conn = await _pg_connect("test")
        try:
            await conn.execute(sql)
        finally:
            await conn.close()
        return user

    user = asyncio.run(run(f'CREATE DATABASE "{name}" TEMPLATE template0'))
    url = f"postgresql+asyncpg://{user}@127.0.0.1:5432/{name}"
    try:
        migrate.upgrade(url)
        yield url
    finally:
        asyncio.run(run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def count_usage_rows(url: str) -> int:
    _, conn = await _pg_connect(url.rsplit("/", 1)[1])
    try:
        return int(await conn.fetchval("SELECT count(*) FROM usage_records"))
    finally:
        await conn.close()


def make_tenant_key(gateway_url: str) -> str:
    """A tenant and an API key with high limits on both, through the admin API."""
    with httpx.Client(base_url=gateway_url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10) as admin:
        tenant = admin.post("/admin/v1/tenants", json={"name": f"bench-{uuid.uuid4().hex[:6]}"}).json()["id"]
        admin.put(f"/admin/v1/tenants/{tenant}/limits", json=HIGH).raise_for_status()
        created = admin.post("/admin/v1/keys", json={"tenant_id": tenant}).json()
        admin.put(f"/admin/v1/keys/{created['id']}/limits", json=HIGH).raise_for_status()
        return str(created["key"])


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


async def closed_loop(target: tuple[str, int, bytes], connections: int, seconds: float) -> Run:
    """``connections`` clients, each sending its next request as soon as the last one is answered."""
    host, port, raw = target
    run = Run()
    stop_at = time.perf_counter() + seconds

    async def client() -> None:
        conn = await Conn.open(host, port)
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
    await asyncio.gather(*(client() for _ in range(connections)))
    run.seconds = time.perf_counter() - t0
    return run


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


# ---------------------------------------------------------------- the benchmark


CHAT = {"messages": [{"role": "user", "content": "Say hello to the benchmark, please."}], "max_tokens": 16}


def gateway_config(db_url: str, fast: str, slow: str, streamy: str, journal: Path) -> dict[str, Any]:
    def group(name: str, url: str) -> dict[str, Any]:
        return {
            "name": name,
            "max_retries": 0,
            "deployments": [{"provider": "openai", "model": "echo", "api_base": url + "/v1", "api_key": "sk-upstream"}],
        }

    return {
        "auth": {"admin_key": ADMIN_KEY, "key_cache_seconds": 2},
        "database": {"url": db_url},
        "redis": {"url": REDIS_URL, "on_unavailable": "fail_closed"},
        "usage": {"journal_dir": str(journal)},
        "models": [group("fast", fast), group("slow", slow), group("streamy", streamy)],
        "prices": {"fast": {"input_per_million": 1, "output_per_million": 2}},
    }


def gateway_cpu(gw: Gateway) -> float:
    """CPU seconds used so far by the gateway: its workers and (with several) their supervisor."""
    pids = {gw.proc.pid, *worker_pids(gw.proc.pid)}
    return sum(cpu_seconds(pid) for pid in pids)


def errors_of(run: Run) -> int:
    return run.errors + len(run.results) - len(run.ok)


async def throughput(
    args: argparse.Namespace,
    gw: Gateway,
    key: str,
    upstream: str,
    upstream_pid: int,
    direct: tuple[str, int, bytes],
    via: tuple[str, int, bytes],
) -> tuple[list[list[str]], int]:
    """(a): requests/s at 64 connections, direct and through the gateway; the CPU time each server
    spends per request, and the rate that makes on one whole core (what a busy host cannot hide)."""
    rows: list[list[str]] = []
    if args.wrk and shutil.which("wrk"):
        d_rps, _ = wrk_rps(upstream, "/v1/chat/completions", CHAT | {"model": "echo"}, key, 64, args.seconds)
        g_rps, errors = wrk_rps(gw.url, "/v1/chat/completions", CHAT | {"model": "fast"}, key, 64, args.seconds)
        sent = int(g_rps * args.seconds)  # approximate: wrk does not report exact counts here
    else:
        d_cpu0 = cpu_seconds(upstream_pid)
        d = await closed_loop(direct, 64, args.seconds)
        d_cpu = (cpu_seconds(upstream_pid) - d_cpu0) / max(1, len(d.results))
        profiler = _profile(gw, args, "a")
        cpu0 = gateway_cpu(gw)
        g = await closed_loop(via, 64, args.seconds)
        cpu = gateway_cpu(gw) - cpu0
        _stop_profile(profiler)
        d_rps, g_rps, errors = len(d.ok) / d.seconds, len(g.ok) / g.seconds, errors_of(g)
        sent = len(g.results)
        g_cpu = cpu / max(1, len(g.results))
        rows.append(
            [
                "(a) server CPU per request (ms)",
                f"{d_cpu * 1000:.3f}",
                f"{g_cpu * 1000:.3f}",
                f"{(g_cpu - d_cpu) * 1000:+.3f}",
                "",
                f"gateway used {cpu / g.seconds:.0%} of a core",
            ]
        )
        rows.append(
            [
                "(a) req/s per whole core (1 / CPU per request)",
                f"{1 / d_cpu:,.0f}",
                f"{1 / g_cpu:,.0f}",
                f"{d_cpu / g_cpu:.1%} of direct",
                ">= 10% of direct",
                "",
            ]
        )
    rows.insert(
        0,
        [
            "(a) non-stream req/s @64 conns",
            f"{d_rps:,.0f}",
            f"{g_rps:,.0f}",
            f"{g_rps / d_rps:.1%} of direct",
            ">= 10% of direct",
            f"errors {errors}",
        ],
    )
    return rows, sent


async def latency(args: argparse.Namespace, gw: Gateway, direct: Target, via: Target) -> tuple[list[list[str]], int]:
    """(b): added latency at fixed offered rates (20 ms upstream), and the rate actually served."""
    rows: list[list[str]] = []
    sent = 0
    profiler = _profile(gw, args, "b")
    for rate in args.rates:
        d = await open_loop(direct, rate, args.seconds / 2)
        g = await open_loop(via, rate, args.seconds / 2)
        sent += len(g.results)
        for q, target in ((0.5, "<= 1 ms added"), (0.99, "<= 3 ms added")):
            added = g.pct(q) - d.pct(q)
            notes = f"served {len(g.ok) / g.seconds:,.0f}/s, errors {errors_of(g)}" if q == 0.5 else ""
            rows.append(
                [
                    f"(b) latency p{q * 100:.0f} @{rate:g} req/s (ms)",
                    f"{d.pct(q):.2f}",
                    f"{g.pct(q):.2f}",
                    f"{added:+.2f}",
                    target,
                    notes,
                ]
            )
    _stop_profile(profiler)
    return rows, sent


async def streams(args: argparse.Namespace, gw: Gateway, direct: Target, via: Target) -> tuple[list[list[str]], int]:
    """(c): 64 concurrent streams of 20 chunks: added time to first chunk and to the end; streams/s."""
    d = await bursts(direct, 64, args.rounds)
    profiler = _profile(gw, args, "c")
    cpu0 = gateway_cpu(gw)
    g = await bursts(via, 64, args.rounds)
    cpu = gateway_cpu(gw) - cpu0
    _stop_profile(profiler)
    rows: list[list[str]] = []
    for label, what, q, target in (
        ("TTFC p50", "first", 0.5, "<= 2 ms added"),
        ("TTFC p99", "first", 0.99, "<= 5 ms added"),
        ("total p50", "total", 0.5, ""),
        ("total p99", "total", 0.99, ""),
    ):
        rows.append(
            [
                f"(c) 64 streams x20 chunks: {label} (ms)",
                f"{d.pct(q, what):.2f}",
                f"{g.pct(q, what):.2f}",
                f"{g.pct(q, what) - d.pct(q, what):+.2f}",
                target,
                f"errors {errors_of(g)}" if label == "TTFC p50" else "",
            ]
        )
    rows.append(
        [
            "(c) gateway CPU per stream (ms)",
            "-",
            f"{cpu * 1000 / max(1, len(g.results)):.3f}",
            "-",
            "",
            f"gateway used {cpu / g.seconds:.0%} of a core",
        ]
    )
    d_sps, g_sps = len(d.ok) / d.seconds, len(g.ok) / g.seconds
    rows.append(
        [
            "(c) streams completed per second",
            f"{d_sps:,.0f}",
            f"{g_sps:,.0f}",
            f"{g_sps / d_sps:.1%} of direct",
            ">= 95% of direct",
            "",
        ]
    )
    return rows, len(g.results)


async def measure(
    args: argparse.Namespace, gw: Gateway, key: str, ups: dict[str, str], pids: dict[str, int]
) -> tuple[list[list[str]], int]:
    sent = 0

    def pair(model: str, stream: bool = False) -> tuple[Target, Target]:
        body = CHAT | {"model": model} | ({"stream": True} if stream else {})
        return (
            http_request(ups[model], "/v1/chat/completions", body | {"model": "echo"}, None),
            http_request(gw.url, "/v1/chat/completions", body, key),
        )

    rows: list[list[str]] = []
    direct, via = pair("fast")
    sent += len((await closed_loop(via, 16, 1.0)).results)  # warm-up: key cache, pools, lazy imports
    await closed_loop(direct, 16, 0.5)
    phases = (
        ("a", lambda: throughput(args, gw, key, ups["fast"], pids["fast"], direct, via)),
        ("b", lambda: latency(args, gw, *pair("slow"))),
        ("c", lambda: streams(args, gw, *pair("streamy", stream=True))),
    )
    for name, phase in phases:
        if name in args.phases:
            phase_rows, phase_sent = await phase()
            rows += phase_rows
            sent += phase_sent
    return rows, sent


def _profile(gw: Gateway, args: argparse.Namespace, phase: str) -> subprocess.Popen[bytes] | None:
    """py-spy on the gateway during ``phase`` when ``--profile`` names it (stopped by _stop_profile)."""
    if not args.profile or phase not in args.profile_phase or phase not in args.phases:
        return None
    cmd = [
        shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"),
        "record",
        "--pid",
        str(gw.proc.pid),
        "--format",
        "raw",
        "--rate",
        "200",
        *(["--subprocesses"] if args.workers > 1 else []),
        "--output",
        args.profile,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop_profile(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def print_table(rows: list[list[str]], header: list[str] | None = None) -> None:
    header = header or ["measurement", "direct", "via gateway", "added", "target", "notes"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def cpu_plan(workers: int, pin: bool) -> tuple[str | None, str | None]:
    """(the gateway's CPUs, the load generator's) as taskset lists, or (None, None) unpinned."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) <= workers:
        return None, None
    return ",".join(map(str, cpus[:workers])), ",".join(map(str, cpus[workers:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="Length of each timed phase.")
    parser.add_argument("--rounds", type=int, default=10, help="Rounds of 64 concurrent streams for (c).")
    parser.add_argument("--rates", default="500,1000", help="Offered requests/s of (b), comma-separated.")
    parser.add_argument("--workers", type=int, default=1, help="Gateway worker processes.")
    parser.add_argument("--no-pin", dest="pin", action="store_false", help="Do not pin processes to CPUs.")
    parser.add_argument("--wrk", action="store_true", help="Use wrk (Debian package) for (a).")
    parser.add_argument("--profile", help="py-spy raw (collapsed) profile of the gateway, written to this file.")
    parser.add_argument("--profile-phase", default="a", help="The phase --profile covers: a, b or c.")
    parser.add_argument("--phases", default="abc", help="Which of the phases (a) (b) (c) to run.")
    args = parser.parse_args()
    args.rates = [float(r) for r in args.rates.split(",") if r]
    gateway_cpus, load_cpus = cpu_plan(args.workers, args.pin)
    if load_cpus is not None:
        os.sched_setaffinity(0, {int(c) for c in load_cpus.split(",")})
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with tempfile.TemporaryDirectory() as tmp, fresh_database() as db_url:
        work = Path(tmp)
        procs = {}
        try:
            procs["fast"], fast = start_upstream(cpus=load_cpus)
            procs["slow"], slow = start_upstream("--latency", "0.02", cpus=load_cpus)
            procs["streamy"], streamy = start_upstream("--output-words", "20", "--chunk-delay", "0.005", cpus=load_cpus)
            config = gateway_config(db_url, fast, slow, streamy, work / "journal")
            gw = start_gateway(config, work, args.workers, gateway_cpus)
            try:
                key = make_tenant_key(gw.url)
                ups = {"fast": fast, "slow": slow, "streamy": streamy}
                pids = {name: proc.pid for name, proc in procs.items()}
                rows, sent = asyncio.run(measure(args, gw, key, ups, pids))
                rss = [rss_mib(pid) for pid in worker_pids(gw.proc.pid)]
            finally:
                code = stop(gw.proc)
            rows.append(
                [
                    "(d) RSS per gateway worker after the run (MiB)",
                    "-",
                    ", ".join(f"{r:.0f}" for r in rss),
                    "-",
                    "<= 150 MiB",
                    f"exit code {code} after SIGTERM",
                ]
            )
            rows_in_db = asyncio.run(count_usage_rows(db_url))
            rows.append(
                [
                    "usage rows in PostgreSQL",
                    "-",
                    f"{rows_in_db:,}",
                    "-",
                    f"= requests sent ({sent:,}" + (", approx. with --wrk" if args.wrk else "") + ")",
                    "",
                ]
            )
        finally:
            for proc in procs.values():
                stop(proc)
    pinning = f"gateway on CPUs {gateway_cpus}, load and upstreams on {load_cpus}" if gateway_cpus else "unpinned"
    print(f"{args.workers} gateway worker(s), {pinning}, {args.seconds:g} s phases")
    print_table(rows)


if __name__ == "__main__":
    main()
