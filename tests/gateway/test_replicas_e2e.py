"""Stateless replicas: three gateway processes sharing one Redis and one PostgreSQL database.

Everything shared lives in those two: a quota is enforced exactly across the three, a key revoked
through one replica is refused by all of them, and every request leaves exactly one usage row.
(Helpers and fixtures come from the two-replica quota tests and the tenancy fixtures.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from redis.asyncio import Redis

from gateway.db import Database
from tests.gateway.tenancy_fixtures import GatewayProcess, gateway_processes, pg_url, redis  # noqa: F401
from tests.gateway.test_quota_e2e import (  # noqa: F401
    KEY_IDS,
    admin,
    cleanup,
    database,
    hammer_past_credit,
    rows_by_status,
    shared_config,
    tenant_key,
    wait_rows,
)
from tests.support.fake_upstream import FakeUpstream

REPLICAS = 3


@pytest.fixture(scope="module")
def replicas(pg_url: str, database: Database, fake_upstream_server: FakeUpstream,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[GatewayProcess]]:
    workdir = tmp_path_factory.mktemp("replicas")
    names = [f"replica{i}" for i in range(REPLICAS)]
    with gateway_processes(shared_config(pg_url, fake_upstream_server), workdir, names) as procs:
        yield procs


async def test_quota_exact_and_usage_complete_across_three_replicas(
    replicas: list[GatewayProcess], database: Database, redis: Redis
) -> None:
    tid, key = tenant_key(replicas[2], requests_per_minute=60)
    try:
        results = await hammer_past_credit(replicas, key, 150, 30, max_tokens=3)
        ok = [r for r in results if not isinstance(r, BaseException)]
        limited = [r for r in results if isinstance(r, openai.RateLimitError)]
        assert len(ok) == 60 and len(limited) == 120, {type(r).__name__ for r in results}
        count, tokens, cost = await wait_rows(database, tid, 180)
        assert count == 180 and (await rows_by_status(database, tid)) == {200: 60, 429: 120}
        assert tokens == sum(r.usage.total_tokens for r in ok) and cost > 0
    finally:
        await cleanup(redis, tid)


def _status(gw: GatewayProcess, key: str) -> int:
    return httpx.get(gw.url + "/v1/models", headers={"authorization": f"Bearer {key}"}, timeout=10).status_code


async def test_revocation_through_one_replica_is_seen_by_all(replicas: list[GatewayProcess], redis: Redis) -> None:
    tid, key = tenant_key(replicas[0])
    try:
        assert [_status(gw, key) for gw in replicas] == [200] * REPLICAS  # every replica has it cached now
        with admin(replicas[1]) as a:
            assert a.post(f"/admin/v1/keys/{KEY_IDS[tid]}/revoke").json()["status"] == "revoked"
        deadline = time.monotonic() + 15  # key_cache_seconds is 1
        statuses = [_status(gw, key) for gw in replicas]
        while statuses != [401] * REPLICAS and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            statuses = [_status(gw, key) for gw in replicas]
        assert statuses == [401] * REPLICAS
    finally:
        await cleanup(redis, tid)
