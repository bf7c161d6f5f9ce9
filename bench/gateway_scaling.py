"""How ``workers: N`` scales across cores: non-streamed requests/s through the gateway with 1, 2, 4,
... workers, each worker on its own pinned CPU, on the full production path of ``bench.gateway``
(SQL API keys and usage in PostgreSQL, Redis quotas, one tenant key, routing).

    .venv/bin/python -m bench.gateway_scaling [--workers 1,2,4,8] [--seconds 8] [--loaders 4]
                                              [--upstreams 2] [--connections 64] [--no-credit]
                                              [--upstream lean|echo]

Each worker count gets a fresh gateway on CPUs 0..N-1 and ``--connections`` keep-alive connections
per worker, spread over ``--loaders`` load-generator processes; the load generators and the
``--upstreams`` upstreams (zero latency, one deployment each in the routed group; ``bench.lean_upstream``
unless ``--upstream echo`` takes the dev echo server, as in ``bench.gateway``) share the other CPUs.
Before the gateways, the same load generators hit the upstreams directly: the harness's
own ceiling, which every gateway figure must stay well under to mean anything. The running Redis
and PostgreSQL servers are moved to those other CPUs for the run (``harness.services_on``).
Reported per worker count: requests/s, requests/s per worker, scaling efficiency (rate / (N x the
one-worker rate)), gateway CPU per request, Redis CPU (its own ``INFO cpu``) per request and as a
share of a core, the same of PostgreSQL (all its processes: the usage inserts, the key lookups),
how the workers split the connections and the work (each one's keep-alive connections and share of
its core: uvicorn's workers accept from one shared socket, which need not split them evenly), and
each worker's RSS; at the end, usage rows in PostgreSQL = requests sent. The one key is busy enough
to be admitted on credit (``quotas.credit``: Redis counts it once a second per worker);
``--no-credit`` counts every request in Redis, as it counts the requests of keys too quiet for credit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from bench.gateway import CHAT, gateway_config, gateway_cpu
from bench.harness import (
    REDIS_URL,
    UPSTREAMS,
    connections_per_worker,
    count_usage_rows,
    cpu_seconds,
    fresh_database,
    interpreter,
    make_tenant_key,
    postgres_cpu_seconds,
    print_table,
    rss_mib,
    running_gateway,
    services_on,
    start_upstream,
    stop,
    worker_pids,
)
from bench.loadgen import Target, closed_loop, http_request
from gateway.quotas.redis_store import connect_redis


@dataclass
class Load:
    sent: int
    ok: int
    errors: int
    seconds: float


def _load_part(target: Target, connections: int, seconds: float, start_at: float) -> Load:
    """One load generator process: a closed loop from the shared start instant."""
    import uvloop

    async def go() -> Load:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        run = await closed_loop(target, connections, seconds)
        return Load(len(run.results), len(run.ok), run.errors + len(run.results) - len(run.ok), run.seconds)

    return uvloop.run(go())


def _pin(cpus: set[int]) -> None:
    os.sched_setaffinity(0, cpus)


def offer(pool: ProcessPoolExecutor, targets: list[Target], connections: int, seconds: float, loaders: int) -> Load:
    """``connections`` in all, spread over ``loaders`` processes (and round-robin over ``targets``)."""
    start_at = time.time() + 0.5
    shares = [connections // loaders + (i < connections % loaders) for i in range(loaders)]
    futures = [
        pool.submit(_load_part, targets[i % len(targets)], share, seconds, start_at)
        for i, share in enumerate(shares)
        if share
    ]
    parts = [f.result() for f in futures]
    return Load(
        sum(p.sent for p in parts),
        sum(p.ok for p in parts),
        sum(p.errors for p in parts),
        max(p.seconds for p in parts),
    )


def redis_cpu_seconds() -> float:
    """Redis's own user + system CPU seconds (``INFO cpu``)."""

    async def info() -> bytes:
        redis = connect_redis(REDIS_URL)
        try:
            reply = await redis.execute("INFO", "cpu")
        finally:
            await redis.aclose()
        assert isinstance(reply, bytes)
        return reply

    fields = dict(line.split(":", 1) for line in asyncio.run(info()).decode().splitlines() if ":" in line)
    return float(fields["used_cpu_sys"]) + float(fields["used_cpu_user"])


def scaling_config(db_url: str, upstreams: list[str], journal: Path, credit: bool = True) -> dict[str, Any]:
    config = gateway_config(db_url, upstreams[0], upstreams[0], upstreams[0], journal)
    config["quotas"] = {"credit": credit}
    config["models"] = [
        {
            "name": "fast",
            "max_retries": 0,
            "deployments": [
                {"provider": "openai", "model": "echo", "api_base": url + "/v1", "api_key": "sk-upstream"}
                for url in upstreams
            ],
        }
    ]
    # Every connection comes from 127.0.0.1: lift the per-client connection cap for the bench.
    config["server"] = {"max_connections_per_client": 0}
    return config


def _count_connections(into: list[int], workers: list[int], port: int) -> None:
    into.extend(connections_per_worker(workers, port))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2,4,8", help="Worker counts to measure, comma-separated.")
    parser.add_argument("--seconds", type=float, default=8.0, help="Length of each timed run.")
    parser.add_argument("--loaders", type=int, default=4, help="Load-generator processes.")
    parser.add_argument("--upstreams", type=int, default=2, help="Echo upstream processes (deployments).")
    parser.add_argument("--connections", type=int, default=64, help="Connections per gateway worker.")
    parser.add_argument("--no-credit", action="store_true", help="Count every request in Redis (quotas.credit off).")
    parser.add_argument("--upstream", choices=sorted(UPSTREAMS), default="lean",
                        help="The upstreams' server: bench.lean_upstream or the dev echo server.")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",") if n]
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) <= max(counts):
        raise SystemExit(f"{len(cpus)} CPUs: not enough for {max(counts)} pinned workers plus the load")
    rest = set(cpus[max(counts):])
    rest_list = ",".join(map(str, sorted(rest)))
    _pin(rest)
    rows: list[list[str]] = []
    sent = 0
    with tempfile.TemporaryDirectory() as tmp, fresh_database() as db_url, services_on(rest):
        ups = [start_upstream(cpus=rest_list, module=UPSTREAMS[args.upstream]) for _ in range(args.upstreams)]
        pool = ProcessPoolExecutor(args.loaders, mp_context=get_context("spawn"), initializer=_pin, initargs=(rest,))
        try:
            direct = [http_request(url, "/v1/chat/completions", CHAT | {"model": "echo"}, None) for _, url in ups]
            offer(pool, direct, 64, 1.0, args.loaders)  # warm-up: the pool's processes and imports
            most = args.connections * max(counts)
            d = offer(pool, direct, most, args.seconds, args.loaders)
            rows.append(["direct upstreams (the harness's ceiling)", str(most), f"{d.ok / d.seconds:,.0f}",
                         "-", "-", "-", "-", "-", "-", "-", f"errors {d.errors}"])
            base = 0.0
            for n in counts:
                config = scaling_config(db_url, [url for _, url in ups], Path(tmp) / f"journal{n}", not args.no_credit)
                with running_gateway(config, Path(tmp), n, ",".join(map(str, cpus[:n]))) as gw:
                    key = make_tenant_key(gw.url)
                    via = [http_request(gw.url, "/v1/chat/completions", CHAT | {"model": "fast"}, key)]
                    sent += offer(pool, via, args.connections * n, 1.0, args.loaders).sent  # warm-up
                    workers = worker_pids(gw.proc.pid)
                    cpu0, rcpu0, pcpu0 = gateway_cpu(gw), redis_cpu_seconds(), postgres_cpu_seconds()
                    each0 = [cpu_seconds(pid) for pid in workers]
                    conns: list[int] = []  # counted half-way through the run, while the connections are open
                    counting = threading.Timer(args.seconds / 2, _count_connections,
                                               (conns, workers, int(gw.url.rsplit(":", 1)[1])))
                    counting.start()
                    g = offer(pool, via, args.connections * n, args.seconds, args.loaders)
                    counting.join()
                    cpu, rcpu = gateway_cpu(gw) - cpu0, redis_cpu_seconds() - rcpu0
                    pcpu = postgres_cpu_seconds() - pcpu0
                    busy = [(cpu_seconds(pid) - c) / g.seconds for pid, c in zip(workers, each0, strict=True)]
                    sent += g.sent
                    rss = [rss_mib(pid) for pid in worker_pids(gw.proc.pid)]
                rate = g.ok / g.seconds
                base = base or rate / n
                rows.append(
                    [
                        f"gateway, {n} worker(s)",
                        str(args.connections * n),
                        f"{rate:,.0f}",
                        f"{rate / n:,.0f}",
                        f"{rate / (n * base):.0%}",
                        f"{cpu * 1000 / max(1, g.sent):.3f}",
                        f"{rcpu * 1e6 / max(1, g.sent):.0f} us, {rcpu / g.seconds:.0%} of a core",
                        f"{pcpu * 1e6 / max(1, g.sent):.0f} us, {pcpu / g.seconds:.0%} of a core",
                        " ".join(f"{c}:{b:.0%}" for c, b in zip(conns, busy, strict=True)),
                        ", ".join(f"{r:.0f}" for r in rss),
                        f"errors {g.errors}",
                    ]
                )
        finally:
            pool.shutdown()
            for proc, _ in ups:
                stop(proc)
        rows_in_db = asyncio.run(count_usage_rows(db_url))
    print(f"gateway workers on CPUs 0..N-1; {args.loaders} load generators and {args.upstreams} {args.upstream} "
          f"upstreams on {rest_list}; {args.seconds:g} s runs; credit {'off' if args.no_credit else 'on'}")
    print(f"Python: {interpreter()}")
    print_table(
        rows,
        ["run", "conns", "req/s", "req/s per worker", "efficiency", "gateway CPU ms/req", "Redis CPU per req",
         "PostgreSQL CPU per req", "per worker: conns:busy", "RSS MiB per worker", "notes"],
    )
    print(f"usage rows in PostgreSQL: {rows_in_db:,}; requests sent through the gateway: {sent:,}")


if __name__ == "__main__":
    main()
