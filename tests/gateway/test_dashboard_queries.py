"""The dashboard's numbers against known data: percentiles within 5 % of the exact ones, series
fitted to the range with zero buckets, local-midnight days, minute buckets, and the request log."""

from __future__ import annotations

import math
import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from gateway.contracts import UsageRecord
from gateway.dashboard.queries import live, percentiles, summary
from gateway.dashboard.ranges import Range
from gateway.db import Database
from gateway.errors import ParameterError
from gateway.quotas.limits import Limits
from gateway.usage import records
from gateway.usage.buckets import bucket_of
from gateway.usage.pricing import PriceTable
from gateway.usage.writer import UsageWriter
from tests.gateway.tenancy_fixtures import db, drop_pg_database, new_pg_database  # noqa: F401

NOW = datetime(2026, 11, 20, 15, 42, 30, tzinfo=UTC)


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def test_histogram_percentiles_are_within_5_percent_of_the_exact_ones() -> None:
    rng = random.Random(7)
    for sample in (
        [rng.lognormvariate(math.log(300), 0.8) for _ in range(5000)],  # a long tail
        [rng.uniform(80, 120) for _ in range(2000)],  # tight: the old coarse buckets made p50 = p90 = p99
        [rng.choice((12.0, 950.0, 31_000.0)) * rng.uniform(0.97, 1.03) for _ in range(999)],
    ):
        counts: dict[int, int] = {}
        for v in sample:
            counts[bucket_of(v)] = counts.get(bucket_of(v), 0) + 1
        got = percentiles(counts)
        for q in (0.5, 0.9, 0.99):
            exact = nearest_rank(sample, q)
            assert got[f"p{round(q * 100)}"] == pytest.approx(exact, rel=0.05), (q, exact)
    tight = {bucket_of(v): 1 for v in (100.0, 105.0, 112.0)}
    assert len({percentiles(tight)[p] for p in ("p50", "p90", "p99")}) > 1


def test_ranges_fit_the_preset_and_the_time_zone() -> None:
    hour = Range.parse(None, None, None, NOW, preset="1h")
    assert (hour.bucket, len(hour.buckets())) == ("minute", 61) and hour.end == NOW
    day = Range.parse(None, None, None, NOW, preset="24h")
    assert day.bucket == "hour" and day.buckets()[0] == datetime(2026, 11, 19, 15, tzinfo=UTC)
    week = Range.parse(None, None, None, NOW, preset="7d", tz="Asia/Tokyo")
    starts = week.buckets()
    assert week.bucket == "day" and len(starts) == 8
    assert all(t.astimezone(ZoneInfo("Asia/Tokyo")).hour == 0 for t in starts)  # local midnights
    custom = Range.parse("2026-03-28", "2026-03-30", None, tz="Europe/Paris")  # over a DST change
    assert [t.astimezone(ZoneInfo("Europe/Paris")).hour for t in custom.buckets()] == [0, 0, 0]
    assert custom.end - custom.start == timedelta(days=3, hours=-1)
    for kwargs, param in (({"preset": "2w"}, "range"), ({"tz": "Mars/Olympus"}, "tz"), ({"bucket": "week"}, "bucket")):
        with pytest.raises(ParameterError) as err:
            Range.parse(None, None, kwargs.pop("bucket", None), NOW, **kwargs)
        assert err.value.param == param
    with pytest.raises(ParameterError):
        Range.parse(None, None, "minute", NOW, preset="7d")


def test_a_bare_end_date_ends_at_the_next_local_midnight_on_a_dst_day() -> None:
    """The day the clocks change has 23 or 25 hours: a range ending on it neither spills an hour
    into the next day (an extra bucket) nor loses its last hour."""
    ny = ZoneInfo("America/New_York")
    for day, hours in (("2025-03-09", 23), ("2025-11-02", 25)):
        one = Range.parse(day, day, None, tz="America/New_York")
        assert one.end - one.start == timedelta(hours=hours) and len(one.buckets()) == hours
        assert one.end.astimezone(ny).hour == 0
    week = Range.parse("2025-03-03", "2025-03-09", "day", tz="America/New_York")
    assert [t.astimezone(ny).day for t in week.buckets()] == list(range(3, 10))


def _record(tenant: str, at: datetime, *, model: str = "m", key: str = "k", status: int = 200,
            error: str | None = None, latency: float = 100.0) -> UsageRecord:
    ok = status < 400
    return UsageRecord(
        request_id=uuid.uuid4().hex, key_id=f"{tenant}-{key}", tenant_id=tenant, model=model, deployment="dep",
        provider="openai", endpoint="chat.completions", started_at=at.timestamp(), status=status,
        error_type=error, prompt_tokens=10 if ok else 0, completion_tokens=5 if ok else 0, cost=0.001 if ok else 0.0,
        latency_ms=latency, ttft_ms=latency / 4 if ok else None,
    )


async def _write(db: Database, tmp_path: Path, rows: list[UsageRecord]) -> None:
    w = UsageWriter(db, PriceTable(), journal_dir=tmp_path)
    for r in rows:
        w.record(r)
    assert await w.flush()
    w.journal.close()


async def test_series_are_zero_filled_by_model_and_key_and_count_429s(db: Database, tmp_path: Path) -> None:
    t = uuid.uuid4().hex[:8]
    base = NOW.replace(minute=0, second=0)
    rows = [_record(t, base - timedelta(hours=20), model="a"), _record(t, base - timedelta(hours=20), model="b"),
            _record(t, base - timedelta(hours=2, minutes=-5), key="k2"),
            _record(t, base - timedelta(hours=2), status=429, error="rate_limit_exceeded"),
            _record(t, base + timedelta(minutes=30), status=502, error="upstream_error")]
    await _write(db, tmp_path, rows)
    got = await summary(db, t, Range.parse(None, None, None, NOW, preset="24h"))
    assert len(got["series"]) == 25 and [p["requests"] for p in got["series"]].count(0) == 22
    assert got["series"][0]["t"] == (base - timedelta(hours=24)).isoformat()
    assert got["totals"] | {"cost": 0} == {"requests": 5, "errors": 2, "rate_limited": 1, "prompt_tokens": 30,
                                           "completion_tokens": 15, "total_tokens": 45, "cost": 0}
    assert set(got["series_by_model"]) == {"a", "b", "m"} and len(got["series_by_model"]["a"]["requests"]) == 25
    assert sum(got["series_by_key"][f"{t}-k2"]["requests"]) == 1
    assert {e["error_type"] for e in got["errors"]} == {"rate_limit_exceeded", "upstream_error"}
    # the last hour, by minute, straight from the records
    recent = await summary(db, t, Range.parse(None, None, None, NOW, preset="1h"))
    assert recent["bucket"] == "minute" and len(recent["series"]) == 61
    assert [p["requests"] for p in recent["series"] if p["requests"]] == [1] and recent["totals"]["errors"] == 1


async def test_hours_a_range_or_a_bucket_cuts_count_only_their_own_rows(db: Database, tmp_path: Path) -> None:
    """A range ending mid-hour counts no row after its end; local days that start on the half hour
    (Asia/Kolkata) count each row in its own day. The rollup's hour holds both sides of such a cut:
    those hours are read from the records (the totals were off by the rows on the wrong side)."""
    t = uuid.uuid4().hex[:8]
    base = datetime(2026, 11, 12, tzinfo=UTC)
    rows = [_record(t, base + timedelta(minutes=25 * i), status=(200, 200, 429)[i % 3],
                    error=(None, None, "rate_limit_exceeded")[i % 3]) for i in range(300)]
    await _write(db, tmp_path, rows)
    for start, end, tz in (("2026-11-12T00:00:00Z", "2026-11-13T10:30:00Z", None),
                           ("2026-11-12", "2026-11-15", "Asia/Kolkata")):
        rng = Range.parse(start, end, None, tz=tz)
        got = await summary(db, t, rng)
        bounds = [*rng.buckets(), rng.end]
        want = [sum(lo.timestamp() <= r.started_at < hi.timestamp() for r in rows)
                for lo, hi in zip(bounds, bounds[1:], strict=False)]
        assert [p["requests"] for p in got["series"]] == want, (start, end, tz)
        assert got["totals"]["rate_limited"] == sum(
            rng.start.timestamp() <= r.started_at < rng.end.timestamp() and r.status == 429 for r in rows)


async def test_request_log_search_detail_and_export_stay_in_the_tenant(db: Database, tmp_path: Path) -> None:
    mine, theirs = uuid.uuid4().hex[:8], uuid.uuid4().hex[:8]
    rows = [_record(mine, NOW - timedelta(minutes=i), model=("x", "y")[i % 2]) for i in range(7)]
    rows += [_record(mine, NOW, status=429, error="rate_limit_exceeded"), _record(theirs, NOW, model="x")]
    await _write(db, tmp_path, rows)
    f = records.RecordFilter(mine, NOW - timedelta(days=1), NOW + timedelta(minutes=1))
    page, cursor = await records.search(db, f, limit=5)
    assert len(page) == 5 and cursor is not None and all(r["tenant_id"] == mine for r in page)
    rest, end = await records.search(db, f, limit=5, before=cursor)
    assert len(rest) == 3 and end is None
    assert {r["request_id"] for r in page + rest} == {r.request_id for r in rows[:8]}
    refused = await records.search(db, records.RecordFilter(mine, f.start, f.end, status="429"))
    assert [r["error_type"] for r in refused[0]] == ["rate_limit_exceeded"]
    assert len((await records.search(db, records.RecordFilter(mine, f.start, f.end, text="x")))[0]) == 4
    prefix = rows[0].request_id[:10]
    found, _ = await records.search(db, records.RecordFilter(mine, f.start, f.end, text=prefix))
    assert [r["request_id"] for r in found] == [rows[0].request_id]
    detail = await records.one(db, mine, rows[7].request_id)
    assert detail and detail["status"] == 429 and "rate" in detail["explanation"]
    assert await records.one(db, mine, rows[8].request_id) is None  # another tenant's: not found
    exported = [r async for batch in records.batches(db, f, size=3) for r in batch]
    assert len(exported) == 8 and all(r["tenant_id"] == mine for r in exported)


async def test_export_pages_in_time_order_whatever_order_the_rows_were_written(db: Database, tmp_path: Path) -> None:
    """Rows written late (the journal's retry) hold higher ids than rows of later times: the export,
    oldest first, pages on (time, id), so every row comes once, in time order, across pages (some
    share a time, and a page's edge falls between them)."""
    t = uuid.uuid4().hex[:8]
    times = [NOW - timedelta(minutes=m) for m in (5, 9, 1, 9, 7, 3, 9, 2, 8, 1)]
    rows = [_record(t, at) for at in times]
    for r in rows:  # one flush each: ids follow this (not time) order
        await _write(db, tmp_path, [r])
    f = records.RecordFilter(t, NOW - timedelta(hours=1), NOW)
    for size in (1, 2, 3, 4, 100):
        exported = [r async for batch in records.batches(db, f, size=size) for r in batch]
        got = [(r["started_at"], r["request_id"]) for r in exported]
        assert sorted(r["request_id"] for r in exported) == sorted(r.request_id for r in rows), size
        assert [at for at, _ in got] == sorted(at for at, _ in got), size


async def test_the_limits_card_counts_the_requests_its_limit_counts(db: Database, tmp_path: Path) -> None:
    """Requests/min in use is what the limit counts: every request admitted (one an upstream answered
    429 included), none the gateway refused (over a limit, or its quota service down)."""
    t = uuid.uuid4().hex[:8]
    at = NOW - timedelta(seconds=20)
    rows = [_record(t, at), _record(t, at), _record(t, at, status=429, error="rate_limited")]
    rows += [_record(t, at, status=429, error="rate_limit_exceeded") for _ in range(3)]
    rows += [_record(t, at, status=503, error="quota_unavailable")]
    await _write(db, tmp_path, rows)
    got = await live(db, t, Limits(requests_per_minute=3), now=NOW.timestamp())
    assert got["used"]["requests_per_minute"] == 3 and got["used"]["tokens_per_minute"] == 30


async def test_percentiles_over_days_read_whole_days_daily_and_the_edges_hourly(db: Database, tmp_path: Path) -> None:
    from gateway.dashboard.queries import _histograms

    t = uuid.uuid4().hex[:8]
    start = datetime(2026, 11, 10, 17, 20, tzinfo=UTC)
    rows = [_record(t, start + timedelta(hours=5 * i), model=("a", "b")[i % 2], latency=50.0 + 37 * i,
                    status=200 if i % 9 else 502, error=None if i % 9 else "upstream_error") for i in range(40)]
    await _write(db, tmp_path, rows)
    rng = Range(datetime(2026, 11, 10, 21, tzinfo=UTC), datetime(2026, 11, 17, 3, 30, tzinfo=UTC), "day")
    want: dict[tuple[str, str], dict[int, int]] = {}
    for r in rows:
        at = datetime.fromtimestamp(r.started_at, UTC).replace(minute=0)
        if r.status < 400 and rng.start <= at < rng.end:
            for kind, ms in (("latency", r.latency_ms), ("ttft", r.ttft_ms)):
                counts = want.setdefault((kind, r.model), {})
                counts[bucket_of(ms)] = counts.get(bucket_of(ms), 0) + 1  # type: ignore[arg-type]
    assert await _histograms(db, t, rng) == want
    got = await summary(db, t, rng)
    exact = sorted(r.latency_ms for r in rows if r.status < 400
                   and rng.start <= datetime.fromtimestamp(r.started_at, UTC).replace(minute=0) < rng.end)
    assert got["latency_ms"]["p50"] == pytest.approx(nearest_rank(exact, 0.5), rel=0.05)


def test_the_operator_chart_draws_the_busiest_tenants_and_the_rest_as_one_line() -> None:
    from gateway.dashboard.operator import CHART_LINES, OTHERS, _busiest

    by_tenant = {f"t{i}": [{"requests": i}, {"requests": 2 * i}] for i in range(CHART_LINES + 3)}
    got = _busiest(by_tenant, {"t10": "ten"})
    lines, labels = got["series_by_tenant"], got["tenant_labels"]
    assert len(lines) == CHART_LINES + 1 and list(lines)[:2] == ["t10", "t9"]
    assert [labels[t] for t in list(lines)[:2]] == ["ten", "t9"]
    assert lines[OTHERS] == [0 + 1 + 2, 0 + 2 + 4] and labels[OTHERS] == "other tenants"


def test_operator_chart_lines_are_keyed_by_tenant_so_no_name_hides_another() -> None:
    """Tenants named like the chart's own lines ("other tenants", "(admin keys)") keep their lines."""
    from gateway.dashboard.operator import CHART_LINES, _busiest

    by_tenant = {f"ten_{i}": [{"requests": 100 + i}] for i in range(CHART_LINES - 1)}
    by_tenant[""] = [{"requests": 50}]  # admin keys
    by_tenant["ten_x"] = [{"requests": 1}]
    by_tenant["ten_y"] = [{"requests": 2}]  # these two are "the rest"
    names = {"ten_0": "other tenants", "ten_1": "(admin keys)"}
    got = _busiest(by_tenant, names)
    lines, labels = got["series_by_tenant"], got["tenant_labels"]
    assert len(lines) == len(labels) == CHART_LINES + 1
    assert sum(ys[0] for ys in lines.values()) == sum(pts[0]["requests"] for pts in by_tenant.values())
    assert sorted(labels.values()).count("other tenants") == 2 and list(labels.values()).count("(admin keys)") == 2


async def test_a_cheap_models_cost_is_the_rows_sum_not_rounded_away(db: Database, tmp_path: Path) -> None:
    """One cached token at $0.075 per million costs 7.5e-08: the totals keep it (rounded to eight
    decimals they said 7e-08, and a 1.5e-09 request nothing), as the usage report does."""
    t = uuid.uuid4().hex[:8]
    rows = [_record(t, NOW - timedelta(minutes=5)), _record(t, NOW - timedelta(minutes=4))]
    rows[0].cost, rows[1].cost = 7.5e-08, 1.5e-09
    await _write(db, tmp_path, rows)
    for preset in ("1h", "24h"):  # from the records, and from the hourly rollup
        got = await summary(db, t, Range.parse(None, None, None, NOW, preset=preset))
        assert got["totals"]["cost"] == 7.65e-08, (preset, got["totals"])


async def test_a_request_id_prefix_matches_its_case_on_both_databases(db: Database, tmp_path: Path) -> None:
    """The log's search matches a request id prefix as exactly as it matches a model: SQLite's LIKE
    ignores ASCII case where PostgreSQL's does not, so the same search found different rows."""
    tenant = uuid.uuid4().hex[:8]
    row = _record(tenant, NOW)
    row.request_id = "abcdef" + row.request_id[6:]  # letters, which have a case
    await _write(db, tmp_path, [row])
    span = (NOW - timedelta(hours=1), NOW + timedelta(hours=1))
    for text, want in ((row.request_id[:12], [row.request_id]), (row.request_id[:12].upper(), [])):
        found, _ = await records.search(db, records.RecordFilter(tenant, *span, text=text))
        assert [r["request_id"] for r in found] == want, (db.dialect, text)
