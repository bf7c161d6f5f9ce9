"""What a tenant's dashboard shows: totals, zero-filled time series (overall, by model, by key),
breakdowns, errors and latency percentiles for one tenant over one ``Range``.

Hour and day buckets read the hourly rollups (never a scan of usage_records); minute buckets (ranges
of at most 6 hours) group the records of that range by minute, an index range. Every function takes
the tenant id it reports on; deciding *which* tenant a caller may see is ``gateway.dashboard.api``'s job.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Select, and_, case, func, or_, select
from sqlalchemy.sql.elements import ColumnElement

from gateway.contracts import QUOTA_REFUSED
from gateway.dashboard.ranges import Range
from gateway.db.engine import Database
from gateway.db.models import ApiKey, LatencyDaily, LatencyHourly, UsageHourly, UsageRow
from gateway.quotas.limits import Limits, Period, period_start, tokens_of
from gateway.usage.buckets import bucket_value
from gateway.usage.records import plain_cost
from gateway.usage.rollup import day_of, hour_of

__all__ = ["FIELDS", "RATE_LIMITED", "Range", "budget_used", "cells", "fold", "live", "percentiles", "shown",
           "summary"]

# error types of requests answered 429: the gateway's own quota refusals and upstreams' rate limits
RATE_LIMITED = frozenset({"rate_limit_exceeded", "rate_limited", "upstream_rate_limited"})
# error types of requests refused at admission: the quotas counted nothing for them
REFUSED = frozenset({QUOTA_REFUSED, "quota_unavailable"})
FIELDS = ("requests", "errors", "rate_limited", "prompt_tokens", "completion_tokens", "total_tokens", "cost")
QS = (0.5, 0.9, 0.99)
HOUR = timedelta(hours=1)


def _zero() -> dict[str, Any]:
    return {f: 0.0 if f == "cost" else 0 for f in FIELDS}


def _add(acc: dict[str, Any], cell: Any) -> None:
    acc["requests"] += int(cell.requests or 0)
    acc["errors"] += int(cell.errors or 0)
    acc["rate_limited"] += int(cell.rate_limited or 0)
    acc["prompt_tokens"] += int(cell.prompt_tokens or 0)
    acc["completion_tokens"] += int(cell.completion_tokens or 0)
    acc["total_tokens"] = acc["prompt_tokens"] + acc["completion_tokens"]
    acc["cost"] += float(cell.cost or 0.0)


def _rounded(acc: dict[str, Any]) -> dict[str, Any]:
    return {**acc, "cost": plain_cost(acc["cost"])}


def _minute(db: Database) -> ColumnElement[Any]:
    if db.dialect == "postgresql":
        return func.date_trunc("minute", UsageRow.started_at)
    return func.strftime("%Y-%m-%d %H:%M:00", UsageRow.started_at)


def _records(db: Database, by: str) -> tuple[Select[Any], ColumnElement[Any]]:
    """The usage records summed per minute and per value of ``by`` (the caller adds the range)."""
    r = UsageRow
    at = _minute(db).label("at")
    q = select(at, getattr(r, by).label("name"), func.count().label("requests"),
               func.sum(case((r.status >= 400, 1), else_=0)).label("errors"),
               func.sum(case((r.error_type.in_(RATE_LIMITED), 1), else_=0)).label("rate_limited"),
               func.sum(r.prompt_tokens).label("prompt_tokens"),
               func.sum(r.completion_tokens).label("completion_tokens"), func.sum(r.cost).label("cost"))
    return q, at


def partial_hours(rng: Range, now: datetime | None = None) -> list[datetime]:
    """The UTC hours of an hour- or day-bucketed range that its rollup rows cannot serve whole: the
    one the range's end cuts (unless the end is still to come: nothing has started after now), and
    those a bucket starts inside (a local midnight on the half hour, in zones such as Asia/Kolkata)."""
    now = now or datetime.now(UTC)
    starts = {hour_of(t) for t in rng.buckets() if t != hour_of(t)}
    if rng.end != hour_of(rng.end) and rng.end < now:
        starts.add(hour_of(rng.end))
    return sorted(starts)


async def cells(db: Database, rng: Range, by: str, tenant_id: str | None = None) -> Sequence[Any]:
    """Rows of (at, name, requests, errors, rate_limited, prompt_tokens, completion_tokens, cost): the
    range's usage summed per hour (the rollup) or minute (the records) and per value of column ``by``
    (model, key_id, error_type or tenant_id). Hours the range or a bucket cuts (``partial_hours``) are
    read from the records, so that every row counts in its own bucket and none after the end does."""
    r = UsageRow
    queries = []
    if rng.bucket != "minute":
        h = UsageHourly
        at, name = h.hour.label("at"), getattr(h, by).label("name")
        q = select(at, name, func.sum(h.requests).label("requests"), func.sum(h.errors).label("errors"),
                   func.sum(case((h.error_type.in_(RATE_LIMITED), h.requests), else_=0)).label("rate_limited"),
                   func.sum(h.prompt_tokens).label("prompt_tokens"),
                   func.sum(h.completion_tokens).label("completion_tokens"), func.sum(h.cost).label("cost"))
        q = q.where(h.hour >= hour_of(rng.start), h.hour < rng.end)
        cut = partial_hours(rng)
        if cut:
            q = q.where(h.hour.not_in(cut))
        if tenant_id is not None:
            q = q.where(h.tenant_id == tenant_id)
        queries.append(q.group_by(at, name))
        if cut:
            edges, minute = _records(db, by)
            spans = [and_(r.started_at >= max(t, rng.start), r.started_at < min(t + HOUR, rng.end)) for t in cut]
            edges = edges.where(or_(*spans))
            if tenant_id is not None:
                edges = edges.where(r.tenant_id == tenant_id)
            queries.append(edges.group_by(minute, getattr(r, by)))
    else:
        q, minute = _records(db, by)
        q = q.where(r.started_at >= rng.start, r.started_at < rng.end)
        if tenant_id is not None:
            q = q.where(r.tenant_id == tenant_id)
        queries.append(q.group_by(minute, getattr(r, by)))
    out: list[Any] = []
    async with db.session() as s:
        for query in queries:
            out += (await s.execute(query)).all()
    return out


def _when(value: Any) -> datetime:
    if isinstance(value, str):  # SQLite's strftime
        return datetime.fromisoformat(value).replace(tzinfo=UTC)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def fold(rows: Iterable[Any], rng: Range) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """The zero-filled series of all rows and, per ``name``, its own zero-filled series. Costs are
    the sums as they are: a total is rounded once (``_sum``), never a sum of rounded buckets, and
    a series for the page goes through ``shown``."""
    starts = rng.buckets()
    index = {t: i for i, t in enumerate(starts)}
    slot: dict[Any, int | None] = {}  # a row's time -> its bucket (many rows share an hour)
    total = [_zero() for _ in starts]
    split: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.at not in slot:
            slot[row.at] = index.get(rng.floor(_when(row.at)))
        i = slot[row.at]
        if i is None:
            continue
        _add(total[i], row)
        name = row.name or ""
        if name not in split:
            split[name] = [_zero() for _ in starts]
        _add(split[name][i], row)
    stamp = [t.isoformat() for t in starts]
    return [{"t": t, **p} for t, p in zip(stamp, total, strict=True)], dict(sorted(split.items()))


def shown(points: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """A series as the page shows it: each bucket's cost rounded (``plain_cost``)."""
    return [_rounded(p) for p in points]


def _sum(points: Iterable[dict[str, Any]]) -> dict[str, Any]:
    acc = _zero()
    for p in points:
        for f in FIELDS:
            acc[f] += p[f]
    return _rounded(acc)


async def summary(db: Database, tenant_id: str, rng: Range) -> dict[str, Any]:
    """Totals; zero-filled series (all, by model, by key); breakdowns by model / key / error type;
    latency and TTFT percentiles (overall and per model)."""
    models, keys, errors, hist, names = await asyncio.gather(  # independent reads, on separate connections
        cells(db, rng, "model", tenant_id), cells(db, rng, "key_id", tenant_id),
        cells(db, rng, "error_type", tenant_id), _histograms(db, tenant_id, rng), _key_names(db, tenant_id))
    series, by_model = fold(models, rng)
    _, by_key = fold(keys, rng)
    _, by_error = fold(errors, rng)
    totals = _sum(series)
    model_rows = []
    for model, points in by_model.items():
        lat = percentiles(hist.get(("latency", model), {}))
        model_rows.append({"model": model, **_sum(points), **{f"latency_{k}": v for k, v in lat.items()}})
    return {
        "tenant_id": tenant_id,
        "start": rng.start.isoformat(),
        "end": rng.end.isoformat(),
        "bucket": rng.bucket,
        "tz": rng.tz_name,
        "totals": totals,
        "series": shown(series),
        "series_by_model": {m: _compact(p) for m, p in by_model.items()},
        "series_by_key": {k: _compact(p) for k, p in by_key.items()},
        "by_model": model_rows,
        "by_key": [{"key_id": k, "key_name": names.get(k, ""), **_sum(p)} for k, p in by_key.items()],
        "errors": [
            {"error_type": e, "requests": (n := _sum(p)["requests"]), "rate": n / (totals["requests"] or 1)}
            for e, p in by_error.items() if e
        ],
        "latency_ms": percentiles(_merged(hist, "latency")),
        "ttft_ms": percentiles(_merged(hist, "ttft")),
    }


async def _key_names(db: Database, tenant_id: str) -> dict[str, str]:
    async with db.session() as s:
        return dict((await s.execute(select(ApiKey.id, ApiKey.name).where(ApiKey.tenant_id == tenant_id))).all())


def _compact(points: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """A series as columns (one list per field), as the charts take it."""
    return {f: [p[f] for p in shown(points)] for f in FIELDS}


async def _histograms(db: Database, tenant_id: str, rng: Range) -> dict[tuple[str, str], dict[int, int]]:
    """(kind, model) -> bucket counts over the hours the range covers: whole UTC days from the daily
    table, the hours before the first and after the last whole day from the hourly one."""
    lo, hi = hour_of(rng.start), rng.end
    first = day_of(lo) + (timedelta(days=1) if lo != day_of(lo) else timedelta())
    last = day_of(hi)
    h, d = LatencyHourly, LatencyDaily
    parts: list[tuple[Any, list[Any]]] = [(h, [h.hour >= lo, h.hour < hi])]
    if last > first:
        parts = [(d, [d.day >= first, d.day < last]),
                 (h, [or_(and_(h.hour >= lo, h.hour < first), and_(h.hour >= last, h.hour < hi))])]
    out: dict[tuple[str, str], dict[int, int]] = {}
    async with db.session() as s:
        for table, where in parts:
            rows = (await s.execute(
                select(table.kind, table.model, table.bucket, func.sum(table.count).label("n"))
                .where(table.tenant_id == tenant_id, *where)
                .group_by(table.kind, table.model, table.bucket))).all()  # fmt: skip
            for r in rows:
                counts = out.setdefault((r.kind, r.model), {})
                counts[r.bucket] = counts.get(r.bucket, 0) + int(r.n)
    return out


def _merged(hist: dict[tuple[str, str], dict[int, int]], kind: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for (k, _), counts in hist.items():
        if k == kind:
            for b, n in counts.items():
                out[b] = out.get(b, 0) + n
    return out


def percentiles(counts: dict[int, int], qs: tuple[float, ...] = QS) -> dict[str, float | None]:
    """Nearest-rank percentiles from bucket counts: the value of the bucket holding the rank (within
    4 % of the exact value, see ``gateway.usage.rollup``); None without data."""
    total = sum(counts.values())
    out: dict[str, float | None] = {}
    for q in qs:
        name = f"p{round(q * 100)}"
        out[name] = None
        seen = 0
        for b in sorted(counts):
            seen += counts[b]
            if total and seen >= q * total:
                out[name] = round(bucket_value(b), 2)
                break
    return out


async def live(db: Database, tenant_id: str, limits: Limits, now: float | None = None) -> dict[str, Any]:
    """The tenant's limits and how much of each is in use now: the last 60 s of requests and tokens
    (an index range on usage_records) that the limits counted (not the requests refused at
    admission), and the budget period so far (from the rollups)."""
    now = now or time.time()
    since = datetime.fromtimestamp(now - 60, UTC)
    admitted = or_(UsageRow.error_type.is_(None), UsageRow.error_type.not_in(REFUSED))
    async with db.session() as s:
        minute = (await s.execute(
            select(func.count().label("requests"), tokens_of(UsageRow).label("tokens"))
            .where(UsageRow.tenant_id == tenant_id, UsageRow.started_at >= since, admitted))).one()  # fmt: skip
    tokens, cost = (await budget_used(db, [tenant_id], limits.budget_period, now)).get(tenant_id, (0, 0.0))
    return {
        "tenant_id": tenant_id,
        "limits": limits.as_dict(),
        "used": {
            "requests_per_minute": int(minute.requests),
            "tokens_per_minute": int(minute.tokens),
            "token_budget": tokens,
            "cost_budget": cost,
        },
    }


async def budget_used(db: Database, tenant_ids: Sequence[str], period: Period, now: float | None = None
                      ) -> dict[str, tuple[int, float]]:
    """Tokens and cost each tenant used in the current budget period (from the rollups)."""
    q = select(
        UsageHourly.tenant_id,
        tokens_of(UsageHourly),
        func.coalesce(func.sum(UsageHourly.cost), 0.0),
    ).where(UsageHourly.tenant_id.in_(list(tenant_ids))).group_by(UsageHourly.tenant_id)
    start = period_start(period, now or time.time())
    if start is not None:
        q = q.where(UsageHourly.hour >= datetime.fromtimestamp(start, UTC))
    async with db.session() as s:
        return {t: (int(n), plain_cost(c)) for t, n, c in (await s.execute(q)).all()}
