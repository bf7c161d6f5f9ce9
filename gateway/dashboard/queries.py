"""What the dashboards show, read from the hourly rollups (never a scan of usage_records).

Every function takes the tenant id it reports on; deciding *which* tenant a caller may see is
the caller's job (``gateway.dashboard.api``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import func, select

from gateway.db.engine import Database
from gateway.db.models import LatencyHourly, UsageHourly, UsageRow
from gateway.errors import ParameterError
from gateway.quotas.limits import Limits, period_start
from gateway.usage.rollup import BOUNDS_MS

Bucket = Literal["hour", "day"]
MAX_RANGE = timedelta(days=400)
_SUMS = ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_tokens", "cost")


@dataclass(frozen=True)
class Range:
    start: datetime  # inclusive, on an hour
    end: datetime  # exclusive
    bucket: Bucket = "hour"

    @classmethod
    def parse(cls, start: str | None, end: str | None, bucket: str | None, now: datetime | None = None) -> Range:
        """ISO dates or timestamps (UTC); default: the last 7 days. Raises ParameterError naming the parameter."""
        now = now or datetime.now(UTC)
        if bucket not in (None, "hour", "day"):
            raise ParameterError("bucket must be 'hour' or 'day'", param="bucket")
        e = _parse(end, "end") if end else now
        if end and len(end.strip()) == 10:
            e += timedelta(days=1)  # a bare end date includes that day
        s = _parse(start, "start") if start else e - timedelta(days=7)
        if s >= e:
            raise ParameterError("start must be before end", param="start")
        if e - s > MAX_RANGE:
            raise ParameterError("start: the range may span at most 400 days", param="start")
        return cls(s.replace(minute=0, second=0, microsecond=0), e, bucket or "hour")  # type: ignore[arg-type]


def _parse(text: str, param: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ParameterError(f"{param} must be an ISO date or timestamp, got {text[:40]!r}", param=param) from None
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


def _sums(row: Any) -> dict[str, Any]:
    out: dict[str, Any] = {f: int(getattr(row, f) or 0) for f in _SUMS if f != "cost"}
    out["cost"] = round(float(row.cost or 0.0), 8)
    out["total_tokens"] = out["prompt_tokens"] + out["completion_tokens"]
    return out


def _sum_columns() -> list[Any]:
    return [func.sum(getattr(UsageHourly, f)).label(f) for f in _SUMS]


async def summary(db: Database, tenant_id: str, rng: Range) -> dict[str, Any]:
    """Totals, a time series, breakdowns by model / key / error type, and latency percentiles."""
    where = (UsageHourly.tenant_id == tenant_id, UsageHourly.hour >= rng.start, UsageHourly.hour < rng.end)
    async with db.session() as s:
        hours = (await s.execute(select(UsageHourly.hour, *_sum_columns()).where(*where).group_by(UsageHourly.hour)
                                 .order_by(UsageHourly.hour))).all()
        groups = [UsageHourly.model, UsageHourly.key_id, UsageHourly.error_type]  # one pass, a few hundred rows
        cells = (await s.execute(select(*groups, *_sum_columns()).where(*where).group_by(*groups))).all()
        lat_where = (
            LatencyHourly.tenant_id == tenant_id,
            LatencyHourly.hour >= rng.start,
            LatencyHourly.hour < rng.end,
        )
        buckets = (await s.execute(
            select(LatencyHourly.kind, LatencyHourly.bucket, func.sum(LatencyHourly.count).label("n"))
            .where(*lat_where).group_by(LatencyHourly.kind, LatencyHourly.bucket))).all()  # fmt: skip
    series = _bucketed([(r.hour, _sums(r)) for r in hours], rng.bucket)
    totals = dict.fromkeys((*_SUMS, "total_tokens"), 0)
    for _, point in series:
        for f in totals:
            totals[f] += point[f]
    totals["cost"] = round(totals["cost"], 8)
    total_requests = totals["requests"] or 1
    return {
        "tenant_id": tenant_id,
        "start": rng.start.isoformat(),
        "end": rng.end.isoformat(),
        "bucket": rng.bucket,
        "totals": totals,
        "series": [{"t": t.isoformat(), **p} for t, p in series],
        "by_model": _rollup(cells, "model"),
        "by_key": _rollup(cells, "key_id"),
        "errors": [
            {"error_type": e["error_type"], "requests": e["requests"], "rate": e["requests"] / total_requests}
            for e in _rollup(cells, "error_type")
            if e["error_type"]
        ],
        "latency_ms": percentiles({r.bucket: int(r.n) for r in buckets if r.kind == "latency"}),
        "ttft_ms": percentiles({r.bucket: int(r.n) for r in buckets if r.kind == "ttft"}),
    }


def _rollup(cells: Sequence[Any], column: str) -> list[dict[str, Any]]:
    """Sum the (model, key, error type) cells over one of those columns, sorted by it."""
    out: dict[str, dict[str, Any]] = {}
    for cell in cells:
        sums = _sums(cell)
        acc = out.setdefault(getattr(cell, column), dict.fromkeys(sums, 0))
        for f, v in sums.items():
            acc[f] += v
    return [{column: name, **acc, "cost": round(acc["cost"], 8)} for name, acc in sorted(out.items())]


def _bucketed(points: list[tuple[datetime, dict[str, Any]]], bucket: Bucket) -> list[tuple[datetime, dict[str, Any]]]:
    if bucket == "hour":
        return points
    days: dict[datetime, dict[str, Any]] = {}
    for t, p in points:
        day = t.replace(hour=0)
        acc = days.setdefault(day, dict.fromkeys(p, 0))
        for f, v in p.items():
            acc[f] += v
    for acc in days.values():
        acc["cost"] = round(acc["cost"], 8)
    return sorted(days.items())


def percentiles(counts: dict[int, int], qs: tuple[float, ...] = (0.5, 0.9, 0.99)) -> dict[str, float | None]:
    """Upper bucket bounds at each quantile (None without data; over the last bound: its value)."""
    total = sum(counts.values())
    out: dict[str, float | None] = {}
    for q in qs:
        name = f"p{round(q * 100)}"
        if not total:
            out[name] = None
            continue
        seen = 0
        for b in sorted(counts):
            seen += counts[b]
            if seen >= q * total:
                out[name] = float(BOUNDS_MS[min(b, len(BOUNDS_MS) - 1)])
                break
    return out


async def live(db: Database, tenant_id: str, limits: Limits, now: float | None = None) -> dict[str, Any]:
    """The tenant's limits and how much of each is in use now: the last 60 s of requests and tokens
    (an index range on usage_records), and the budget period so far (from the rollups)."""
    now = now or time.time()
    since = datetime.fromtimestamp(now - 60, UTC)
    async with db.session() as s:
        minute = (await s.execute(
            select(func.count().label("requests"),
                   func.coalesce(func.sum(UsageRow.prompt_tokens + UsageRow.completion_tokens), 0).label("tokens"))
            .where(UsageRow.tenant_id == tenant_id, UsageRow.started_at >= since))).one()  # fmt: skip
        q = select(
            func.coalesce(func.sum(UsageHourly.prompt_tokens + UsageHourly.completion_tokens), 0),
            func.coalesce(func.sum(UsageHourly.cost), 0.0),
        ).where(UsageHourly.tenant_id == tenant_id)
        start = period_start(limits.budget_period, now)
        if start is not None:
            q = q.where(UsageHourly.hour >= datetime.fromtimestamp(start, UTC))
        tokens, cost = (await s.execute(q)).one()
    return {
        "tenant_id": tenant_id,
        "limits": limits.as_dict(),
        "used": {
            "requests_per_minute": int(minute.requests),
            "tokens_per_minute": int(minute.tokens),
            "token_budget": int(tokens),
            "cost_budget": round(float(cost), 8),
        },
    }
