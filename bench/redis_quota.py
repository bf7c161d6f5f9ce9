"""What one admission and one settlement cost Redis: its own CPU microseconds per script call
(``INFO commandstats``) and the round trip seen by the gateway's client, with the sliding windows
full (a key and its tenant, each limited on requests/min, tokens/min and concurrency, with
reservations in each of the last 60 seconds). First as a gateway's steady state, each request
admitted while ``--in-flight`` others hold their concurrency tickets and the oldest then settled
(the CPU of both scripts per request); then ``--calls`` admissions in a row, and their settlements
(the tickets pile up meanwhile).

    .venv/bin/python -m bench.redis_quota [--redis redis://127.0.0.1:6379/15] [--calls 3000] [--in-flight 64]

Uses a fresh key prefix in the given database and deletes its keys afterwards. Resets the
server's command statistics (``CONFIG RESETSTAT``).
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

from bench.harness import print_table
from gateway.quotas.limits import Limits, Scope
from gateway.quotas.redis_client import RespClient
from gateway.quotas.redis_store import RedisStore, connect_redis
from gateway.quotas.store import Lease, Reservation, lease_for

LIMITS = Limits(requests_per_minute=10**9, tokens_per_minute=10**12, max_concurrency=10**6)


async def script_micros(redis: RespClient) -> tuple[int, int]:
    """(calls, microseconds) of EVALSHA since the last reset."""
    info = await redis.execute("INFO", "commandstats")
    assert isinstance(info, bytes)
    for line in info.decode().splitlines():
        if line.startswith("cmdstat_evalsha:"):
            fields = dict(kv.split("=") for kv in line.split(":", 1)[1].split(","))
            return int(fields["calls"]), int(fields["usec"])
    return 0, 0


def quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def measure(url: str, calls: int, in_flight: int) -> list[list[str]]:
    redis = connect_redis(url)
    prefix = f"bench-quota:{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis, prefix=prefix)
    scopes = [Scope("key", "k1", LIMITS), Scope("tenant", "t1", LIMITS)]
    start = time.time()
    for second in range(60):  # one reservation in each second of the window
        r = Reservation(uuid.uuid4().hex, start - 59 + second, 100, 0, scopes, 30)
        await store.reserve(r)
        await store.settle(lease_for(r), r.now, 80, 0)
    rows = []
    # A gateway's steady state: a request admitted as the oldest of ``in_flight`` is settled.
    open_: list[Lease] = []
    for _ in range(in_flight):
        r = Reservation(uuid.uuid4().hex, time.time(), 100, 0, scopes, 30)
        await store.reserve(r)
        open_.append(lease_for(r))
    await redis.execute("CONFIG", "RESETSTAT")
    for _ in range(calls):
        r = Reservation(uuid.uuid4().hex, time.time(), 100, 0, scopes, 30)
        await store.reserve(r)
        open_.append(lease_for(r))
        await store.settle(open_.pop(0), time.time(), 80, 0)
    n, us = await script_micros(redis)
    rows.append([f"admission + settlement, {in_flight} in flight (per request)", f"{us / calls:.1f}", "-", "-"])
    for lease in open_:
        await store.settle(lease, time.time(), 80, 0)
    leases: list[Lease] = []
    await redis.execute("CONFIG", "RESETSTAT")
    trips = []
    for _ in range(calls):
        r = Reservation(uuid.uuid4().hex, time.time(), 100, 0, scopes, 30)
        t = time.perf_counter()
        await store.reserve(r)
        trips.append(time.perf_counter() - t)
        leases.append(lease_for(r))
    n, us = await script_micros(redis)
    rows.append(["admission (reserve script)", f"{us / n:.1f}", f"{quantile(trips, 0.5) * 1e6:.0f}",
                 f"{quantile(trips, 0.99) * 1e6:.0f}"])
    await redis.execute("CONFIG", "RESETSTAT")
    trips = []
    for lease in leases:
        t = time.perf_counter()
        await store.settle(lease, time.time(), 80, 0)
        trips.append(time.perf_counter() - t)
    n, us = await script_micros(redis)
    rows.append(["settlement (settle script)", f"{us / n:.1f}", f"{quantile(trips, 0.5) * 1e6:.0f}",
                 f"{quantile(trips, 0.99) * 1e6:.0f}"])
    cursor = b"0"
    while True:
        reply = await redis.execute("SCAN", cursor, "MATCH", f"{prefix}:*", "COUNT", 1000)
        assert isinstance(reply, list)
        cursor, keys = reply[0], reply[1]
        if keys:
            await redis.execute("DEL", *keys)
        if cursor == b"0":
            break
    await redis.aclose()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--in-flight", type=int, default=64, help="Requests in flight in the first row.")
    args = parser.parse_args()
    rows = asyncio.run(measure(args.redis, args.calls, args.in_flight))
    print_table(rows, ["script", "Redis CPU us/call", "round trip p50 us", "round trip p99 us"])


if __name__ == "__main__":
    main()
