"""The numbers users see about their usage equal sums over the raw usage rows, on SQLite and
PostgreSQL: ranges cut at hours and days in several time zones, token counts past 32 bits, and
costs whose sums have more digits than are shown."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gateway.contracts import UsageRecord
from gateway.dashboard import operator
from gateway.dashboard.queries import Range, live, summary
from gateway.db import Database
from gateway.db.models import Tenant
from gateway.quotas.limits import Limits, Scope
from gateway.quotas.recorded import recorded_spend
from gateway.usage.pricing import PriceTable
from gateway.usage.records import plain_cost
from gateway.usage.report import ReportQuery, end_of_day, usage_report
from gateway.usage.writer import UsageWriter
from tests.gateway.tenancy_fixtures import db  # noqa: F401

DAY0 = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=3)
INT32_MAX = 2**31 - 1


def record(tenant: str, at: datetime, **fields: Any) -> UsageRecord:
    values: dict[str, Any] = dict(
        request_id=uuid.uuid4().hex, key_id=f"{tenant}-k", tenant_id=tenant, model="m1", deployment="d",
        provider="openai", endpoint="chat.completions", started_at=at.timestamp(), status=200,
        prompt_tokens=3, completion_tokens=5, cost=0.1, latency_ms=10.0)
    return UsageRecord(**(values | fields))


async def write(db: Database, tmp_path: Path, records: list[UsageRecord]) -> None:
    w = UsageWriter(db, PriceTable(), journal_dir=tmp_path, batch_size=50, flush_interval=0.05)
    w.start()
    for r in records:
        w.record(r)
    await w.aclose()


async def test_dashboard_totals_equal_the_rows_of_cut_ranges(db: Database, tmp_path: Path) -> None:
    """Rows on and beside hour and day bounds; ranges cut mid-hour and at local midnights off the
    UTC hour: the dashboard and the report count exactly the rows in [start, end)."""
    tenant = uuid.uuid4().hex[:8]
    seconds = [0, 1, 3599.999999, 3600, 3600 * 23 + 1800, 86400, 86400.5, 86400 * 2 - 1e-6, 86400 * 2,
               3600 * 10 + 1799, 3600 * 10 + 1800, 3600 * 10 + 1801]
    rows = [record(tenant, DAY0 + timedelta(seconds=s), cost=(0.1, 0.2, 1e-9, 0.3)[i % 4])
            for i, s in enumerate(seconds)]
    await write(db, tmp_path, rows)
    cases = [
        (timedelta(hours=10, minutes=30), timedelta(days=1, minutes=30), "hour", "UTC"),
        (timedelta(), timedelta(days=2), "day", "UTC"),
        (timedelta(), timedelta(days=2), "day", "Asia/Kolkata"),
        (timedelta(minutes=10), timedelta(days=2, minutes=-1), "day", "America/New_York"),
        (timedelta(minutes=10), timedelta(days=2, minutes=-1), "day", "Asia/Kathmandu"),
        (timedelta(hours=10), timedelta(hours=10, minutes=30), "minute", "UTC"),
        (timedelta(hours=10), timedelta(hours=10, minutes=30), "hour", "UTC"),
    ]
    for start, end, bucket, tz in cases:
        rng = Range.parse((DAY0 + start).isoformat(), (DAY0 + end).isoformat(), bucket, tz=tz)
        inside = [r for r in rows if rng.start.timestamp() <= r.started_at < rng.end.timestamp()]
        got = (await summary(db, tenant, rng))["totals"]
        [want] = await usage_report(db, ReportQuery(start=rng.start, end=rng.end, tenant_id=tenant, group_by=()))
        assert got["requests"] == want["requests"] == len(inside), (bucket, tz)
        assert got["cost"] == want["cost"] == plain_cost(sum(r.cost or 0.0 for r in inside)), (bucket, tz)


async def test_token_counts_past_32_bits_sum_without_overflow(db: Database, tmp_path: Path) -> None:
    """Each count fits its INTEGER column, a row's prompt plus completion does not: the limits page
    and the budget rebuilt from the records sum them as 64-bit numbers (PostgreSQL's INTEGER
    addition overflowed: the limits page was a 500 and admission could not rebuild the budget)."""
    tenant = uuid.uuid4().hex[:8]
    now = datetime.now(UTC) - timedelta(seconds=5)
    rows = [record(tenant, now, prompt_tokens=INT32_MAX, completion_tokens=INT32_MAX, cached_tokens=INT32_MAX),
            record(tenant, now, prompt_tokens=INT32_MAX, completion_tokens=10)]
    await write(db, tmp_path, rows)
    tokens = 3 * INT32_MAX + 10
    [report] = await usage_report(db, ReportQuery(tenant_id=tenant, group_by=()))
    assert report["total_tokens"] == tokens and report["cached_tokens"] == INT32_MAX
    used = (await live(db, tenant, Limits(token_budget=2**40, budget_period="day")))["used"]
    assert used["tokens_per_minute"] == used["token_budget"] == tokens
    spent = await recorded_spend(db, Scope("tenant", tenant, Limits(budget_period="day")), now.timestamp())
    assert spent.tokens == tokens
    spent = await recorded_spend(db, Scope("key", f"{tenant}-k", Limits(budget_period="total")), now.timestamp())
    assert spent.tokens == tokens


async def test_dashboard_cost_totals_are_the_report_s_not_a_sum_of_rounded_buckets(
        db: Database, tmp_path: Path) -> None:
    """Per-day costs with more significant digits than a cost keeps (12): the totals (of the tenant,
    per model, per key, per tenant in the operator's view) are the rows' sum rounded once, as the
    report shows it, not the sum of each day's rounded cost (24691.3578246 for 24691.3578247)."""
    tenant = uuid.uuid4().hex[:8]
    async with db.session() as s, s.begin():
        s.add(Tenant(id=tenant, name=f"t-{tenant}"))
    rows = [record(tenant, DAY0 + timedelta(days=d, hours=5), cost=12345.67891234) for d in (0, 1)]
    await write(db, tmp_path, rows)
    rng = Range.parse(DAY0.isoformat(), (DAY0 + timedelta(days=2)).isoformat(), "day")
    [report] = await usage_report(db, ReportQuery(start=rng.start, end=rng.end, tenant_id=tenant, group_by=()))
    assert report["cost"] == plain_cost(2 * 12345.67891234) == 24691.3578247
    got = await summary(db, tenant, rng)
    assert got["totals"]["cost"] == report["cost"]
    assert [m["cost"] for m in got["by_model"]] == [k["cost"] for k in got["by_key"]] == [report["cost"]]
    assert [p["cost"] for p in got["series"]] == [12345.6789123, 12345.6789123]  # each day as shown
    view = await operator.overview(db, rng)
    [mine] = [t for t in view["tenants"] if t["tenant_id"] == tenant]
    assert mine["cost"] == report["cost"]


def test_a_bare_end_date_in_any_iso_form_includes_that_day() -> None:
    """``20260131`` is the same day as ``2026-01-31``: the dashboard's range, like the report's
    (``end_of_day``), runs to the next local midnight (it ended at the day's start)."""
    for tz in ("UTC", "Asia/Kolkata"):
        compact = Range.parse("20260101", "20260131", "day", tz=tz)
        assert compact == Range.parse("2026-01-01", "2026-01-31", "day", tz=tz)
    assert Range.parse("2026-01-01", "20260131", "day").end == end_of_day("20260131", "end")
    assert Range.parse("2026-01-01", "2026-01-31T00:00:00Z", "day").end == datetime(2026, 1, 31, tzinfo=UTC)
