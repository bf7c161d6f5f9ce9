"""A background response's spend survives the death of the process metering it.

A replica SIGKILLed while it charges the budgets (its Redis partitioned: the charge waits) has
claimed the response but not settled it. Its usage record, written before the charge, is in its
write-ahead segment, which the restarted worker replays; once the claim's lease has run out the
response is unsettled again (the follower's view) and is metered again: one usage row with the
upstream's usage, and the budgets of the key and its tenant charged once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from sqlalchemy import select

from gateway.contracts import Principal
from gateway.db import Database
from gateway.db.models import UsageRow
from gateway.held_usage import meter_ended, unsettled, usage_id
from gateway.quotas.admission import QuotaAdmission
from gateway.quotas.limits import Limits, LimitsSource
from gateway.quotas.redis_store import RedisStore, connect_redis
from gateway.stored_responses import Kept, ResponseStore
from gateway.usage.writer import UsageWriter
from tests.gateway.tenancy_fixtures import REDIS_URL, db, plain_url, redis, redis_prefix, repo_root  # noqa: F401
from tests.gateway.test_quota_admission import principal_with
from tests.support.held_meter_child import PRICES, ended, pipeline

LEASE = 2.0  # the killed replica's claim, in seconds
BUDGET = Limits(token_budget=1000, budget_period="total")


async def _rows(db: Database, response_id: str) -> list[UsageRow]:
    async with db.session() as s:
        return list((await s.scalars(select(UsageRow).where(UsageRow.request_id == usage_id(response_id)))).all())


async def _until(check: Callable[[], Awaitable[object]], timeout: float = 20.0) -> None:
    """Poll ``check`` until it is true, for at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await check() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)


async def _held(db: Database, p: Principal) -> tuple[str, dict[str, Any]]:
    """A background response ``p`` started, stored held: its id, and its spend unsettled."""
    response_id = f"resp_bg_{uuid.uuid4().hex}"
    queued = {"id": response_id, "object": "response", "status": "queued", "model": "m", "created_at": 1}
    pending = unsettled(p, "req-1", "m", "m", "d", "openai", 7, None)
    assert await ResponseStore(db).save(p, Kept(queued, [], [], None, "d", pending), None)
    return response_id, pending


def _meterer(db: Database, prefix: str, journal: Path, response_id: str) -> subprocess.Popen[str]:
    env = os.environ | {"PYTHONPATH": str(repo_root())}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.held_meter_child", plain_url(db), prefix, str(journal), response_id,
         str(LEASE)], cwd=repo_root(), env=env, stdout=subprocess.PIPE, text=True)


async def test_a_response_whose_meterer_is_killed_is_metered_once(
    db: Database, redis: Redis, redis_prefix: str, tmp_path: Path
) -> None:
    p = await principal_with(db, BUDGET, BUDGET)
    store, (response_id, _) = ResponseStore(db), await _held(db, p)
    client = connect_redis(REDIS_URL)
    admission = QuotaAdmission(RedisStore(client, prefix=redis_prefix), LimitsSource(db), PRICES)
    await admission.settle(await admission.admit(p, "m", 0), 0, 0.0)  # the budget buckets exist, at 0
    journal = tmp_path / "journal"
    child = _meterer(db, redis_prefix, journal, response_id)
    assert child.stdout is not None
    try:
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert line.strip() == "charging"  # it was killed having claimed the response, while the charge waited

    restarted = UsageWriter(db, PRICES, journal_dir=journal, flush_interval=3600)
    restarted.start()  # replays the dead writer's segment
    try:
        await _until(lambda: _rows(db, response_id))
        assert [(r.prompt_tokens, r.completion_tokens) for r in await _rows(db, response_id)] == [(7, 3)]

        async def unsettled_again() -> bool:  # the claim's lease has run out
            return response_id in dict(await store.unsettled(100))

        await _until(unsettled_again)
        await meter_ended(pipeline(admission, restarted), store, response_id, ended(response_id))
        assert not await unsettled_again() and await store.claim(response_id, 3600) is None  # settled
    finally:
        await restarted.aclose()
        await admission.aclose()
        await client.aclose()
    assert [(r.prompt_tokens, r.completion_tokens) for r in await _rows(db, response_id)] == [(7, 3)]
    for scope in (f"key:{p.key_id}", f"tenant:{p.tenant_id}"):
        spent = await redis.hmget(f"{redis_prefix}:{scope}:bd:total", ["tokens", "micros"])
        assert [int(v or 0) for v in spent] == [10, 16]  # 7 + 3 tokens; 7 x 1 + 3 x 3 micro-dollars


async def test_a_claim_holds_until_its_lease_runs_out_or_it_is_settled(db: Database) -> None:
    p = await principal_with(db, Limits(), Limits())
    store, (response_id, pending) = ResponseStore(db), await _held(db, p)

    async def listed() -> bool:
        return response_id in dict(await store.unsettled(100))

    assert await store.claim(response_id, -1.0) == pending  # a lease already over: its meterer died
    assert await listed()
    assert await store.claim(response_id, 3600) == pending  # taken again
    assert not await listed() and await store.claim(response_id, 3600) is None  # being metered
    await store.settle(response_id)
    assert not await listed() and await store.claim(response_id, -1.0) is None


async def test_a_response_metered_again_after_its_meterer_charged_is_charged_once(
    db: Database, redis: Redis, redis_prefix: str, tmp_path: Path
) -> None:
    """A meterer that died after Redis ran its charge, before it settled the row (its lease run out):
    the response is metered again, and its budgets are not charged again (the charge's once-key)."""
    p = await principal_with(db, BUDGET, BUDGET)
    store, (response_id, _) = ResponseStore(db), await _held(db, p)
    client = connect_redis(REDIS_URL)
    admission = QuotaAdmission(RedisStore(client, prefix=redis_prefix), LimitsSource(db), PRICES)
    writer = UsageWriter(db, PRICES, journal_dir=tmp_path / "journal", flush_interval=3600)
    try:
        await admission.settle(await admission.admit(p, "m", 0), 0, 0.0)  # the budget buckets exist, at 0
        assert await store.claim(response_id, -1.0) is not None  # the dead meterer's claim, run out
        await admission.charge(p, 10, PRICES.cost("m", 7, 3), once=usage_id(response_id))  # its charge
        await meter_ended(pipeline(admission, writer), store, response_id, ended(response_id))
        assert await store.claim(response_id, 3600) is None  # settled
        assert await writer.flush()
    finally:
        await writer.aclose()
        await admission.aclose()
        await client.aclose()
    assert [(r.prompt_tokens, r.completion_tokens) for r in await _rows(db, response_id)] == [(7, 3)]
    for scope in (f"key:{p.key_id}", f"tenant:{p.tenant_id}"):
        spent = await redis.hmget(f"{redis_prefix}:{scope}:bd:total", ["tokens", "micros"])
        assert [int(v or 0) for v in spent] == [10, 16]  # charged once: 7 + 3 tokens, 7 x 1 + 3 x 3 micro-dollars
    assert await redis.ttl(f"{redis_prefix}:charged:{usage_id(response_id)}") > 6 * 86400
