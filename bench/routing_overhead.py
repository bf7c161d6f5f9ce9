"""Routing overhead: requests/s through the gateway for a group of 1 vs 10 deployments.

Both groups point at the same loopback fake upstream, so any difference is the routing decision
(strategy ordering, circuit checks) and per-deployment connection pools. Prints a table.

    .venv/bin/python -m bench.routing_overhead [--requests 2000] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time

import httpx

from backends.factory import build_backend
from gateway.app import create_app
from gateway.contracts import Principal
from gateway.routing.router import Router
from gateway.services import Services
from gateway.settings import parse_settings
from tests.support.doubles import RecordingSink, ScriptedAdmission, StaticKeys
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import ServerThread

KEY = "sk-bench"


def _settings(upstream_url: str, strategy: str):
    def group(name: str, n: int) -> dict:
        return {"name": name, "strategy": strategy, "max_retries": 0,
                "deployments": [{"name": f"{name}-{i}", "provider": "openai", "model": "m", "api_base": upstream_url}
                                for i in range(n)]}

    return parse_settings({"models": [group("one", 1), group("ten", 10)]}, env={})


async def _run(url: str, model: str, requests: int, concurrency: int) -> tuple[float, float, float]:
    body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "bench the router"}]}
    latencies: list[float] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {KEY}"}, limits=limits) as client:
        async def worker() -> None:
            while not queue.empty():
                queue.get_nowait()
                t0 = time.perf_counter()
                response = await client.post("/v1/chat/completions", json=body)
                response.raise_for_status()
                latencies.append(time.perf_counter() - t0)

        for _ in range(min(50, requests)):  # warm-up: connections and caches
            await client.post("/v1/chat/completions", json=body)
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    latencies.sort()
    return requests / elapsed, statistics.median(latencies) * 1000, latencies[int(len(latencies) * 0.99) - 1] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one log line per request would dominate
    upstream = FakeUpstream().start()
    rows = []
    try:
        for strategy in ("weighted", "least_busy", "lowest_latency", "priority"):
            settings = _settings(upstream.url, strategy)
            services = Services(authenticator=StaticKeys({KEY: Principal("bench", None, is_admin=True)}),
                                admission=ScriptedAdmission(), usage=RecordingSink(),
                                router=Router.from_settings(settings, build_backend))
            with ServerThread(create_app(settings, services)) as server:
                for model in ("one", "ten"):
                    rps, p50, p99 = asyncio.run(_run(server.url, model, args.requests, args.concurrency))
                    rows.append((strategy, 1 if model == "one" else 10, rps, p50, p99))
    finally:
        upstream.stop()
    print(f"{'strategy':<16}{'deployments':>12}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}")
    for strategy, n, rps, p50, p99 in rows:
        print(f"{strategy:<16}{n:>12}{rps:>10.0f}{p50:>10.2f}{p99:>10.2f}")


if __name__ == "__main__":
    main()
