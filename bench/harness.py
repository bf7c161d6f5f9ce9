"""The processes and data a gateway benchmark runs against: loopback upstreams, a served gateway
(``switchyard serve`` on a config), a fresh PostgreSQL database with a tenant key, CPU and RSS
readings, and the table printer. Shared by ``bench.gateway``, ``bench.gateway_floor``, ``bench.soak``
and ``bench.gguf_default``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
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


ECHO = "backends.dev.echo_server"  # the dev echo upstream (ASGI under uvicorn)
LEAN = "bench.lean_upstream"  # the same answers for the benchmarks' requests, at a fraction of the CPU
UPSTREAMS = {"echo": ECHO, "lean": LEAN}


def start_upstream(*args: str, cpus: str | None = None, module: str = ECHO) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [
        *(["taskset", "-c", cpus] if cpus else []),
        sys.executable,
        "-m",
        module,
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


def cpu_seconds(pid: int, *, kernel_only: bool = False) -> float:
    """User + system CPU time the process has used so far (``kernel_only``: the system time alone,
    its system calls and the network stack's work done for them)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[12]) if kernel_only else int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


SERVICES = ("redis-server", "postgres")  # process names of the stores a gateway under test uses


def processes_named(names: tuple[str, ...]) -> Iterator[tuple[str, Path]]:
    """(name, /proc/<pid>) of each running process whose name is one of ``names``."""
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and (name := (proc / "comm").read_text().strip()) in names:
                yield name, proc


def postgres_cpu_seconds() -> float:
    """User + system CPU time of every PostgreSQL process now running (the postmaster, its
    background workers and the backends; a backend that exits takes its time with it)."""
    total = 0.0
    for _, proc in processes_named(("postgres",)):
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += cpu_seconds(int(proc.name))
    return total


@contextlib.contextmanager
def services_on(cpus: set[int] | None) -> Iterator[list[str]]:
    """Redis and PostgreSQL (every thread, and the backends the postmaster forks later) moved to
    ``cpus`` for the block, so that a gateway pinned elsewhere has its core to itself, as it would
    beside stores on other machines; their affinities are restored afterwards. Yields what was
    moved ("name pid"); processes this user may not move are left where they are."""
    saved: dict[int, set[int]] = {}
    moved: list[str] = []
    if cpus:
        for name, proc in processes_named(SERVICES):
            with contextlib.suppress(OSError):
                for task in (proc / "task").iterdir():
                    tid = int(task.name)
                    before = os.sched_getaffinity(tid)
                    os.sched_setaffinity(tid, cpus)
                    saved[tid] = before
                moved.append(f"{name} {proc.name}")
    try:
        yield moved
    finally:
        for tid, before in saved.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, before)


def worker_pids(pid: int) -> list[int]:
    """The processes serving requests: the children of a multi-worker supervisor, else ``pid``."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            children += [int(c) for c in (task / "children").read_text().split()]
    # uvicorn's multiprocessing start method also forks a resource tracker: it serves nothing.
    workers = [c for c in children if b"resource_tracker" not in _cmdline(c)]
    return workers or [pid]


def _cmdline(pid: int) -> bytes:
    """``pid``'s command line; empty once it has exited."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return b""


def connections_per_worker(pids: list[int], port: int) -> list[int]:
    """How many established TCP connections to ``port`` each process in ``pids`` holds (the
    keep-alive connections each worker accepted from a shared listening socket), in order."""
    established = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":  # local port, ESTABLISHED
            established.add(f"socket:[{fields[9]}]")
    counts = []
    for pid in pids:
        held = 0
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                held += os.readlink(fd) in established
        counts.append(held)
    return counts


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


def report_if_exited(gw: Gateway, lines: int = 40) -> None:
    """If the gateway has exited without being stopped, say so on stderr with its exit code (a
    negative one is a signal) and the last ``lines`` lines of its log that are not access lines: a
    load generator sees only refused connections, and the log goes with the run's temporary files."""
    code = gw.proc.poll()
    if code is None:
        return
    kept = [line for line in gw.log.read_text(errors="replace").splitlines() if "switchyard.access" not in line]
    tail = "\n".join(kept[-lines:])
    print(f"the gateway at {gw.url} exited by itself (code {code}); the end of its log:\n{tail}", file=sys.stderr)


def start_gateway(config: dict[str, Any], workdir: Path, workers: int = 1, cpus: str | None = None,
                  venv: Path | None = None) -> Gateway:
    """``switchyard serve`` with ``workers`` workers, as a separate process (on ``cpus`` with taskset),
    from ``venv`` (default: this interpreter's). Returns once every worker has started: the workers
    share one listening socket, and keep-alive connections opened while one is still starting all
    stay with the others (two workers, 128 connections opened at the first answer: 128 and 0)."""
    path = workdir / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD")}
    log = workdir / "gateway.log"
    cmd = [
        *(["taskset", "-c", cpus] if cpus else []),
        str(venv / "bin" / "switchyard" if venv else Path(sys.executable).parent / "switchyard"),
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
        _wait_workers_started(log, workers, proc)
    except RuntimeError:
        stop(proc)
        raise RuntimeError(f"the gateway did not start:\n{log.read_text()[-3000:]}") from None
    return Gateway(proc, url, log)


@contextlib.contextmanager
def running_gateway(config: dict[str, Any], workdir: Path, workers: int = 1,
                    cpus: str | None = None) -> Iterator[Gateway]:
    """``start_gateway``'s gateway for the ``with`` block; then stopped, and first reported if it
    exited by itself (``report_if_exited``)."""
    gw = start_gateway(config, workdir, workers, cpus)
    try:
        yield gw
    finally:
        report_if_exited(gw)
        stop(gw.proc)


def _wait_workers_started(log: Path, workers: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Until uvicorn has logged each worker's "Application startup complete."."""
    deadline = time.monotonic() + timeout
    while log.read_text(errors="replace").count("Application startup complete.") < workers:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"not all {workers} gateway workers started")
        time.sleep(0.05)


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


async def usage_caught_up(url: str, sent: int, timeout: float = 120.0) -> float:
    """Wait until the usage rows in PostgreSQL number ``sent``, or stop growing for a second (``sent``
    is approximate with wrk): the gateway has written what a phase left buffered. The seconds it took."""
    t0 = time.perf_counter()
    rows, since = -1, t0
    while time.perf_counter() - t0 < timeout:
        now_rows = await count_usage_rows(url)
        if now_rows >= sent or (now_rows == rows and time.perf_counter() - since >= 1.0):
            break
        if now_rows != rows:
            rows, since = now_rows, time.perf_counter()
        await asyncio.sleep(0.2)
    return time.perf_counter() - t0


def make_tenant_key(gateway_url: str) -> str:
    """A tenant and an API key with high limits on both, through the admin API."""
    with httpx.Client(base_url=gateway_url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10) as admin:
        tenant = admin.post("/admin/v1/tenants", json={"name": f"bench-{uuid.uuid4().hex[:6]}"}).json()["id"]
        admin.put(f"/admin/v1/tenants/{tenant}/limits", json=HIGH).raise_for_status()
        created = admin.post("/admin/v1/keys", json={"tenant_id": tenant}).json()
        admin.put(f"/admin/v1/keys/{created['id']}/limits", json=HIGH).raise_for_status()
        return str(created["key"])


# Run in the interpreter described (it may be another virtual environment's): its version and path,
# which of the configure flags that make CPython faster it was built with, and whether the
# interpreter is in a shared libpython (position-independent code, calls between its own functions
# through the PLT) or in the executable.
_DESCRIBE = """
import os, sys, sysconfig
flags = [f for f in ("--enable-optimizations", "--with-lto") if f in (sysconfig.get_config_var("CONFIG_ARGS") or "")]
with open("/proc/self/maps") as maps:
    shared = any("libpython" in line for line in maps)
print(f"{sys.implementation.name} {sys.version.split()[0]} at {os.path.realpath(sys.executable)}; configure flags: "
      f"{', '.join(flags) or 'neither --enable-optimizations nor --with-lto'}; interpreter in "
      f"{'a shared libpython' if shared else 'the executable'}")
"""


def interpreter(python: Path | str = sys.executable) -> str:
    """One line on the Python a gateway runs on, for a benchmark's header: the same code costs
    about a tenth less CPU per request on one build of CPython 3.11 than on another
    (docs/deployment.md), so a reading means little without it."""
    try:
        done = subprocess.run([str(python), "-c", _DESCRIBE], capture_output=True, text=True, check=False)
    except OSError as exc:
        return f"{python} (not described: {exc})"
    return done.stdout.strip() if done.returncode == 0 else f"{python} (not described: {done.stderr.strip()[-200:]})"


def print_table(rows: list[list[str]], header: list[str] | None = None) -> None:
    header = header or ["measurement", "direct", "via gateway", "added", "target", "notes"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
