"""A budget bucket rebuilt from the usage records counts the requests this process settled just
before, whose records were still in its usage writer's buffer (a budget set on a busy tenant, a
Redis restarted under load): the writer is flushed before the records are read."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from redis.asyncio import Redis

from gateway.admin.service import TenancyService
from gateway.contracts import QuotaExceeded, UsageRecord
from gateway.db import Database
from gateway.quotas.admission import QuotaAdmission
from gateway.quotas.limits import Limits, LimitsSource
from gateway.quotas.redis_store import RedisStore, connect_redis
from gateway.quotas.store import MemoryStore
from gateway.usage.writer import UsageWriter
from tests.gateway.tenancy_fixtures import REDIS_URL, db, redis, redis_prefix  # noqa: F401
from tests.gateway.test_quota_admission import PRICES, principal_with


@pytest.mark.parametrize("store_kind", ["memory", "redis"])
async def test_a_budget_set_on_a_busy_tenant_counts_the_records_not_written_yet(
    db: Database, redis: Redis, redis_prefix: str, tmp_path: Path, store_kind: str
) -> None:
    p = await principal_with(db, Limits(), Limits())
    store = MemoryStore() if store_kind == "memory" else RedisStore(connect_redis(REDIS_URL), prefix=redis_prefix)
    writer = UsageWriter(db, PRICES, journal_dir=tmp_path, flush_interval=3600)  # nothing written by itself
    limits = LimitsSource(db)
    adm = QuotaAdmission(store, limits, PRICES, flush_records=writer.flush)
    try:
        ticket = await adm.admit(p, "m", 1000)  # no budget yet: no bucket counts it
        await adm.settle(ticket, 900, 0.0)
        writer.record(UsageRecord(
            request_id=uuid.uuid4().hex, key_id=p.key_id, tenant_id=p.tenant_id, model="m", deployment="d",
            provider="openai", endpoint="chat.completions", started_at=time.time(), status=200,
            prompt_tokens=600, completion_tokens=300,
        ))  # fmt: skip  # in the writer's buffer, as a request settled a moment ago
        assert p.tenant_id is not None
        await TenancyService(db).update_limits("tenant", p.tenant_id, token_budget=1000)
        limits.invalidate()
        with pytest.raises(QuotaExceeded, match="token budget"):
            await adm.admit(p, "m", 200)  # 900 spent already
        await adm.settle(await adm.admit(p, "m", 100), 100, 0.0)
    finally:
        await writer.aclose()
