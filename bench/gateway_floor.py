"""What bounds bench/gateway.py's throughput (a): the same load against servers that each add one
layer of the gateway's stack (``bench/floor_apps.py``), then the gateway itself, on one worker.

    .venv/bin/python -m bench.gateway_floor [--seconds 8] [--granian]

Rows: requests/s at 64 keep-alive connections (the load generator of bench.gateway) and the
server's CPU milliseconds per request. The gateway row is the full production path (PostgreSQL
keys and usage, Redis quotas); the difference between rows is what each layer costs. ``--granian``
adds the bare app served by granian (a Rust HTTP server), the alternative to uvicorn measured.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.gateway import CHAT, gateway_config
from bench.harness import (
    ROOT,
    cpu_seconds,
    free_port,
    fresh_database,
    make_tenant_key,
    print_table,
    running_gateway,
    start_upstream,
    stop,
    wait_http,
    worker_pids,
)
from bench.loadgen import closed_loop, http_request


def start_floor(factory: str, upstream: str, server: str = "uvicorn") -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    if server == "granian":  # its Rust HTTP server, one worker, one runtime thread, the same loop
        cmd = [sys.executable, "-m", "granian", "--interface", "asgi", "--factory", "--port", str(port),
               "--loop", "uvloop", "--http", "1", "--workers", "1", "--runtime-threads", "1", "--no-ws",
               "--log-level", "warning", f"bench.floor_apps:{factory}"]
    else:
        cmd = [sys.executable, "-m", "uvicorn", f"bench.floor_apps:{factory}", "--factory", "--port", str(port),
               "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=os.environ | {"FLOOR_UPSTREAM": upstream + "/v1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/", proc)
    return proc, url


def measure(pid: int, target: tuple[str, int, bytes], seconds: float) -> list[str]:
    """The rate, and the CPU of the server process and its workers (granian serves from a child)."""
    asyncio.run(closed_loop(target, 16, 1.0))  # warm-up
    pids = {pid, *worker_pids(pid)}
    cpu0 = sum(cpu_seconds(p) for p in pids)
    run = asyncio.run(closed_loop(target, 64, seconds))
    cpu = sum(cpu_seconds(p) for p in pids) - cpu0
    errors = run.errors + len(run.results) - len(run.ok)
    return [f"{len(run.ok) / run.seconds:,.0f}", f"{cpu * 1000 / max(1, len(run.results)):.3f}", f"{errors}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--granian", action="store_true",
                        help="Also serve the bare app with granian (pip install granian first: not a dependency).")
    args = parser.parse_args()
    rows: list[list[str]] = []
    upstream_proc, upstream = start_upstream()
    try:
        body = CHAT | {"model": "echo"}
        rows.append(
            [
                "echo upstream, direct",
                *measure(upstream_proc.pid, http_request(upstream, "/v1/chat/completions", body, None), args.seconds),
            ]
        )
        floors = [
            ("raw_app", "uvicorn", "bare ASGI app (uvicorn, httptools, uvloop)"),
            ("litestar_app", "uvicorn", "+ Litestar route, body decoded"),
            ("proxy_app", "uvicorn", "+ forwarded with the gateway's HTTP client"),
        ]
        if args.granian:
            floors.insert(1, ("raw_app", "granian", "bare ASGI app (granian: 1 worker, 1 runtime thread, uvloop)"))
        for factory, server, label in floors:
            proc, url = start_floor(factory, upstream, server)
            try:
                rows.append(
                    [label, *measure(proc.pid, http_request(url, "/v1/chat/completions", body, None), args.seconds)]
                )
            finally:
                stop(proc)
        with tempfile.TemporaryDirectory() as tmp, fresh_database() as db_url:
            config = gateway_config(db_url, upstream, upstream, upstream, Path(tmp) / "journal")
            with running_gateway(config, Path(tmp)) as gw:
                key = make_tenant_key(gw.url)
                target = http_request(gw.url, "/v1/chat/completions", CHAT | {"model": "fast"}, key)
                rows.append(
                    [
                        "the gateway (auth, Redis quotas, routing, metering to PostgreSQL)",
                        *measure(gw.proc.pid, target, args.seconds),
                    ]
                )
    finally:
        stop(upstream_proc)
    print_table(rows, ["server", "req/s @64 conns", "server CPU ms/request", "errors"])


if __name__ == "__main__":
    main()
