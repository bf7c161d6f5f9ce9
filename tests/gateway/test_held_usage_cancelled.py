"""A background response's spend, once claimed, is metered to the end though the caller is cancelled
while the budgets are charged (a client that left its ``GET``, the follower stopped, while Redis is
slow to answer): the usage row is written before the charge, nobody claims the response while the
metering runs, and once Redis has answered (here: its time-out) the response is settled."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from sqlalchemy import select

from backends.base import Meter
from gateway.db import Database
from gateway.db.models import StoredResponse, UsageRow
from gateway.held_usage import LEASE_SECONDS, meter_ended, unsettled, usage_id
from gateway.pipeline import Pipeline
from gateway.quotas.limits import Limits
from gateway.stored_responses import Kept, ResponseStore
from tests.gateway.tenancy_fixtures import db, redis, redis_prefix  # noqa: F401
from tests.gateway.test_quota_admission import PRICES, principal_with
from tests.support.gated_replica import gated_replica


async def test_a_claimed_spend_is_recorded_though_its_charge_is_cancelled(
    db: Database, redis_prefix: str, tmp_path: Path
) -> None:
    p = await principal_with(db, Limits(token_budget=1000, budget_period="total"), Limits())
    store = ResponseStore(db)
    response: dict[str, Any] = {"id": "resp_bg_cancelled", "object": "response", "status": "queued", "model": "m",
                                "created_at": 1}
    pending = unsettled(p, "req-1", "m", "m", "d", "openai", 7, None)
    assert await store.save(p, Kept(response, [], [], None, "d", pending), None)
    def cost(deployment: str | None, model: str, meter: Meter) -> float:
        return 0.0

    answer: dict[str, Any] = response | {"status": "completed", "usage": {"input_tokens": 7, "output_tokens": 3}}
    async with gated_replica(db, redis_prefix, PRICES, tmp_path, redis_timeout=5.0) as replica:
        admission, writer = replica.admission, replica.writer
        pipeline = cast(Pipeline, SimpleNamespace(cost=cost, services=SimpleNamespace(admission=admission,
                                                                                       usage=writer)))
        await admission.limits.scopes(p)  # cached: the charge waits on Redis alone
        replica.gate.black_hole()
        metering = asyncio.create_task(meter_ended(pipeline, store, response["id"], answer))
        await asyncio.sleep(1.0)  # claimed; the charge waits for Redis
        metering.cancel()
        await asyncio.gather(metering, return_exceptions=True)
        assert await store.claim(response["id"], LEASE_SECONDS) is None  # claimed: nobody meters it meanwhile
        assert response["id"] not in dict(await store.unsettled(100))  # nor does the follower ask about it
        replica.gate.reopen()  # the charge's connection is cut: it ends (an outage, rebuilt from the rows)
        for _ in range(150):
            if await _settled(db, response["id"]):
                break
            await asyncio.sleep(0.1)
        assert await _settled(db, response["id"])
        await writer.flush()
        async with db.session() as s:
            rows = (await s.execute(select(UsageRow).where(UsageRow.request_id == usage_id(response["id"])))).all()
        assert len(rows) == 1


async def _settled(db: Database, response_id: str) -> bool:
    async with db.session() as s:
        return (await s.execute(select(StoredResponse.unsettled).where(StoredResponse.id == response_id))).scalar() \
            is None
