"""The usage writers of several workers (or replicas) adding to the same rollup rows of one
PostgreSQL at the same time: no transaction dies in a deadlock, so no batch goes to the journal,
and the rows and rollups are exact."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from pathlib import Path

from sqlalchemy import text

from gateway.contracts import UsageRecord
from gateway.db import Database, migrate
from gateway.usage.pricing import Price, PriceTable
from gateway.usage.writer import UsageWriter
from tests.gateway.tenancy_fixtures import pg_url  # noqa: F401

WRITERS = 4
ROUNDS = 4
BATCH = 500  # five slices of rollup.SLICE_ROWS: each its own transaction
PRICES = PriceTable({"m": Price(input_per_million=1.0, output_per_million=2.0)})


def record(rng: random.Random) -> UsageRecord:
    """One tenant, key, model and hour for all: every batch adds to the same hourly row, and to
    latency buckets that differ from slice to slice."""
    return UsageRecord(request_id=uuid.uuid4().hex, key_id="k1", tenant_id="t1", model="m", deployment="d",
                       provider="openai", endpoint="chat.completions", started_at=time.time(), status=200,
                       prompt_tokens=10, completion_tokens=5, latency_ms=rng.uniform(1, 5000),
                       ttft_ms=rng.uniform(1, 500))


async def test_writers_of_several_workers_add_to_the_same_rollups_without_deadlocks(pg_url: str,
                                                                                   tmp_path: Path) -> None:
    await asyncio.to_thread(migrate.upgrade, pg_url)
    databases = [Database.from_url(pg_url) for _ in range(WRITERS)]  # a pool each, as separate processes have
    writers = [UsageWriter(db, PRICES, journal_dir=tmp_path / f"worker{i}", batch_size=BATCH, flush_interval=60)
               for i, db in enumerate(databases)]
    rng = random.Random(23)
    try:
        for _ in range(ROUNDS):
            for writer in writers:
                for _ in range(BATCH):
                    writer.record(record(rng))
            # all at once; a flush that met a deadlock journals its batch and returns False
            assert await asyncio.gather(*(w.flush() for w in writers)) == [True] * WRITERS
        assert all(w.db_healthy and w.journal.count == 0 for w in writers)
    finally:
        for writer in writers:
            await writer.aclose()
    sent = WRITERS * ROUNDS * BATCH
    try:
        async with databases[0].engine.connect() as conn:
            rows = (await conn.execute(text("SELECT count(*) FROM usage_records"))).scalar()
            hourly = (await conn.execute(text("SELECT sum(requests), sum(prompt_tokens) FROM usage_hourly"))).one()
            by_kind = "SELECT kind, sum(count) FROM {} GROUP BY kind"
            latency = dict((await conn.execute(text(by_kind.format("latency_hourly")))).all())
            daily = dict((await conn.execute(text(by_kind.format("latency_daily")))).all())
    finally:
        for db in databases:
            await db.dispose()
    assert rows == sent
    assert tuple(hourly) == (sent, 10 * sent)
    assert latency == daily == {"latency": sent, "ttft": sent}
