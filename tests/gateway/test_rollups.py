"""Hourly rollups: maintained by the usage writer (never double-counted), filled by the migration
from older records, and read by the dashboard queries with the same totals as the full report."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, insert, select, text

from gateway.contracts import UsageRecord
from gateway.dashboard.queries import Range, live, percentiles, summary
from gateway.db import Database, migrate
from gateway.db.models import LatencyDaily, LatencyHourly, UsageHourly, UsageRow
from gateway.quotas.limits import Limits
from gateway.usage import rollup
from gateway.usage.buckets import GROWTH, MIN_MS
from gateway.usage.pricing import Price, PriceTable
from gateway.usage.report import ReportQuery, usage_report
from gateway.usage.rollup import hour_of
from gateway.usage.writer import UsageWriter, to_row
from tests.gateway.tenancy_fixtures import db, drop_pg_database, new_pg_database  # noqa: F401

PRICES = PriceTable({"m1": Price(1.0, 2.0), "m2": Price(3.0, 4.0)})
# Yesterday, 23:30:07 UTC: a day before NOW to an hour after it spans three UTC days on every run.
NOW = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0).timestamp() - 1800 + 7


def mixed_records(tenant: str, n: int = 60) -> list[UsageRecord]:
    out = []
    for i in range(n):
        failed = i % 10 == 0
        out.append(UsageRecord(
            request_id=uuid.uuid4().hex, key_id=f"{tenant}-k{i % 2}", tenant_id=tenant, model=f"m{1 + i % 2}",
            deployment="d", provider="openai", endpoint="chat.completions", started_at=NOW - 3600 * (i % 5),
            status=502 if failed else 200, error_type="upstream_error" if failed else None,
            prompt_tokens=0 if failed else 10 + i, completion_tokens=0 if failed else i,
            latency_ms=100.0 + i * 10, ttft_ms=None if failed else 40.0,
        ))  # fmt: skip
    return out


async def test_writer_keeps_rollups_matching_the_records(db: Database, tmp_path: Path) -> None:
    a, b = uuid.uuid4().hex[:8], uuid.uuid4().hex[:8]
    records = mixed_records(a) + mixed_records(b, 7)
    w = UsageWriter(db, PRICES, journal_dir=tmp_path, batch_size=13, flush_interval=0.05)
    w.start()
    for r in records + records[:20]:  # a replayed batch must not count twice
        w.record(r)
    await w.aclose()
    rng = Range(datetime.fromtimestamp(NOW - 86400, UTC), datetime.fromtimestamp(NOW + 3600, UTC), "hour")
    got = await summary(db, a, rng)
    [want] = await usage_report(db, ReportQuery(tenant_id=a, group_by=()))
    for field in ("requests", "errors", "prompt_tokens", "completion_tokens", "cost"):
        assert got["totals"][field] == pytest.approx(want[field]), field
    assert got["totals"]["requests"] == 60 and got["totals"]["errors"] == 6
    assert sum(p["requests"] for p in got["series"]) == 60
    assert len([p for p in got["series"] if p["requests"]]) == 5 and len(got["series"]) == 26  # zeros drawn
    assert {m["model"]: m["requests"] for m in got["by_model"]} == {"m1": 30, "m2": 30}
    assert {k["key_id"] for k in got["by_key"]} == {f"{a}-k0", f"{a}-k1"}
    assert got["errors"] == [{"error_type": "upstream_error", "requests": 6, "rate": 0.1}]
    assert got["ttft_ms"]["p50"] == pytest.approx(40.0, rel=0.04) and got["latency_ms"]["p99"] is not None
    daily = await summary(db, a, Range(rng.start, rng.end, "day"))
    assert sum(p["requests"] for p in daily["series"]) == 60 and len(daily["series"]) == 3
    assert daily["ttft_ms"] == got["ttft_ms"] and daily["latency_ms"] == got["latency_ms"]
    other = await summary(db, b, rng)
    assert other["totals"]["requests"] == 7 and all(a not in k["key_id"] for k in other["by_key"])
    now = await live(db, a, Limits(requests_per_minute=100, budget_period="total"), now=NOW)
    assert now["used"]["token_budget"] == got["totals"]["total_tokens"]
    assert now["used"]["requests_per_minute"] == 12  # the records started within the last minute


async def test_a_request_id_twice_in_one_batch_is_rolled_up_once(db: Database, tmp_path: Path) -> None:
    """The insert skips a request id's second record in the same batch; the rollups must skip it too
    (on SQLite they added every record whose id the insert returned: each such duplicate counted twice)."""
    tenant = uuid.uuid4().hex[:8]
    records = mixed_records(tenant, 10)
    w = UsageWriter(db, PRICES, journal_dir=tmp_path, batch_size=100)
    for r in records + records[:4]:  # one batch holding four ids twice
        w.record(r)
    assert await w.flush()
    await w.aclose()
    async with db.session() as s:
        rolled = (await s.execute(select(func.sum(UsageHourly.requests), func.sum(UsageHourly.prompt_tokens))
                                  .where(UsageHourly.tenant_id == tenant))).one()
        latencies = await s.scalar(select(func.sum(LatencyHourly.count)).where(
            LatencyHourly.tenant_id == tenant, LatencyHourly.kind == "latency"))
    assert tuple(rolled) == (10, sum(r.prompt_tokens for r in records))
    assert latencies == sum(r.status < 400 for r in records)


def edge_records(tenant: str) -> list[UsageRecord]:
    """Latencies on and beside bucket bounds, and zero; 4xx and 5xx; hours on both sides of a UTC
    midnight that is not one in the database's time zone."""
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    latencies = [0.05, 0.0, MIN_MS, MIN_MS * 1.0000001, 0.5, 1.0, 250.0, 86_400_000.0]
    latencies += [MIN_MS * GROWTH**i * f for i in (1, 2, 17, 60, 150) for f in (1.0, 1 - 1e-12, 1 + 1e-12)]
    out = []
    for i, ms in enumerate(latencies):
        status = (200, 200, 429, 502)[i % 4]
        out.append(UsageRecord(
            request_id=uuid.uuid4().hex, key_id=f"{tenant}-k{i % 2}", tenant_id=tenant,
            model=f"m{1 + i % 2}", deployment="d", provider="openai", endpoint="chat.completions",
            started_at=midnight + (-1800 if i % 3 else 1800) - 86400 * (i % 2), status=status,
            error_type=None if status == 200 else f"e{status}", prompt_tokens=i, completion_tokens=2 * i,
            cached_tokens=i % 3, cost=i * 1e-6, latency_ms=ms, ttft_ms=None if i % 3 == 0 else ms / 2,
        ))  # fmt: skip
    return out


async def test_rollups_made_by_postgresql_equal_those_made_in_python(db: Database, tmp_path: Path) -> None:
    """On PostgreSQL the usage insert also aggregates the rollups (``pg_bulk``); on SQLite
    ``rollup.aggregate`` does. Both give what ``aggregate`` gives for the same rows: the same
    hours (in UTC, whatever the database's time zone), sums and latency buckets, bucket for bucket."""
    name = ""
    if db.dialect == "postgresql":
        async with db.engine.begin() as conn:
            name = await conn.scalar(text("SELECT current_database()"))
            await conn.exec_driver_sql(f'ALTER DATABASE "{name}" SET timezone TO \'Asia/Kolkata\'')
        await db.engine.dispose()  # new connections take the database's time zone
    tenant = uuid.uuid4().hex[:8]
    records = edge_records(tenant)
    w = UsageWriter(db, PRICES, journal_dir=tmp_path, batch_size=7, flush_interval=0.05)
    w.start()
    for r in records + records[:5]:  # a replayed batch adds nothing
        w.record(r)
    await w.aclose()
    hourly, latency = rollup.aggregate(to_row(r) for r in records)
    async with db.session() as s:
        got_hourly = {(h.tenant_id, h.key_id, h.model, h.hour, h.error_type): h
                      for h in await s.scalars(select(UsageHourly).where(UsageHourly.tenant_id == tenant))}
        got_latency = {(x.tenant_id, x.model, x.hour, x.kind, x.bucket): x.count
                       for x in await s.scalars(select(LatencyHourly).where(LatencyHourly.tenant_id == tenant))}
        got_daily = {(x.tenant_id, x.model, x.day, x.kind, x.bucket): x.count
                     for x in await s.scalars(select(LatencyDaily).where(LatencyDaily.tenant_id == tenant))}
    if db.dialect == "postgresql":
        async with db.engine.begin() as conn:
            await conn.exec_driver_sql(f'ALTER DATABASE "{name}" RESET timezone')
        await db.engine.dispose()
    assert set(got_hourly) == set(hourly)
    for key, sums in hourly.items():
        row = got_hourly[key]
        counts = ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_tokens")
        assert [getattr(row, c) for c in counts] == [sums[c] for c in counts]
        assert row.cost == pytest.approx(sums["cost"]) and row.latency_ms_sum == pytest.approx(sums["latency_ms_sum"])
    assert got_latency == latency
    assert got_daily == rollup.daily(latency)
    assert len({k[4] for k in latency}) > 10  # many buckets, bounds included


def test_percentiles_and_range_parsing() -> None:
    assert percentiles({}) == {"p50": None, "p90": None, "p99": None}
    r = Range.parse("2026-01-01", "2026-01-31", "day")
    assert r.end - r.start == timedelta(days=31)
    for bad in (("x", None, None), ("2026-02-01", "2026-01-01", None), (None, None, "week")):
        with pytest.raises(ValueError):
            Range.parse(*bad)


LATER_COLUMNS = ("service_tier", "upstream_request_id")  # usage_records' columns added after 0001 (0009, 0010)


def _columns_of_0001(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in LATER_COLUMNS}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_migrations_backfill_existing_records(backend: str, tmp_path: Path) -> None:
    """0002 and 0004 roll up the records written before them. On SQLite, 0007 merges the rollup rows
    that earlier versions of those two wrote with times in another text (no fraction of a second)
    into the usage writer's rows of the same hours."""
    pg = None
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'b.db'}"
    else:
        pg, url = await new_pg_database()
    try:
        await asyncio.to_thread(migrate.upgrade, url, "0001")
        database = Database.from_url(url)
        old, new = mixed_records("old"), mixed_records("old", 10)
        for r in old:  # written straight to the table, not priced by a writer
            r.cost = 0.0
        async with database.engine.begin() as conn:  # rows as 0001 had them: without later columns
            await conn.execute(insert(UsageRow), [_columns_of_0001(to_row(r)) for r in old])
        await asyncio.to_thread(migrate.upgrade, url, "0006_responses")
        async with database.engine.begin() as conn:
            if backend == "sqlite":
                for table, column in (("usage_hourly", "hour"), ("latency_hourly", "hour"), ("latency_daily", "day")):
                    await conn.exec_driver_sql(f"UPDATE {table} SET {column} = substr({column}, 1, 19)")
            # today's writer writes the columns later migrations (0009, 0010) add: there for the write only
            await conn.exec_driver_sql("ALTER TABLE usage_records ADD COLUMN service_tier VARCHAR(40)")
            await conn.exec_driver_sql("ALTER TABLE usage_records ADD COLUMN upstream_request_id VARCHAR(128)")
        w = UsageWriter(database, PRICES, journal_dir=tmp_path / "wal", flush_interval=0.05)
        w.start()
        for r in new:  # the same hours again, through the writer
            w.record(r)
        await w.aclose()
        async with database.engine.begin() as conn:
            await conn.exec_driver_sql("ALTER TABLE usage_records DROP COLUMN service_tier")
            await conn.exec_driver_sql("ALTER TABLE usage_records DROP COLUMN upstream_request_id")
        await asyncio.to_thread(migrate.upgrade, url)
        first_hour = hour_of(datetime.fromtimestamp(NOW - 4 * 3600, UTC))  # the oldest records' hour
        for rng in (Range(datetime.fromtimestamp(NOW - 86400, UTC), datetime.fromtimestamp(NOW + 3600, UTC)),
                    Range(first_hour, first_hour + timedelta(hours=5)),  # a range starting on a filled hour
                    Range(first_hour - timedelta(days=2), first_hour + timedelta(days=2), "day")):  # whole days
            got = await summary(database, "old", rng)
            assert got["totals"]["requests"] == 70 and got["totals"]["errors"] == 7, rng
            assert got["totals"]["prompt_tokens"] == sum(r.prompt_tokens for r in old + new)
            assert got["ttft_ms"]["p50"] == pytest.approx(40.0, rel=0.04), rng
        async with database.session() as s:
            rows = (await s.execute(select(UsageHourly.requests)
                                    .where(UsageHourly.tenant_id == "old", UsageHourly.error_type == ""))).all()
        assert len(rows) == 9 and sum(n for (n,) in rows) == 54 + 9  # one per key, model and hour with successes
        await database.dispose()
    finally:
        if pg:
            await drop_pg_database(pg)
