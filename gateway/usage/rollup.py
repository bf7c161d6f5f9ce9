"""Hourly rollups of usage rows (tables ``usage_hourly``, ``latency_hourly`` and ``latency_daily``).

``aggregate`` folds usage rows (the dicts ``writer.to_row`` makes) into per-hour sums and latency
bucket counts; ``apply`` adds them to the tables with one upsert per table
(``ON CONFLICT … DO UPDATE SET n = n + excluded.n``), so concurrent writers add up correctly
(on PostgreSQL as column arrays: ``pg_bulk``).
The writer calls it with exactly the rows its insert created, in the same transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.db.models import LatencyDaily, LatencyHourly, UsageHourly
from gateway.usage import pg_bulk
from gateway.usage.buckets import bucket_of

# Rows a writer handles between two turns of the event loop (a batch of 500 in one go held every
# request in flight for milliseconds at a time).
SLICE_ROWS = 100

_SUMS = ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_tokens", "cost", "latency_ms_sum")
HourKey = tuple[str, str, str, datetime, str]  # tenant, key, model, hour, error type
LatencyKey = tuple[str, str, datetime, str, int]  # tenant, model, hour, kind, bucket


def hour_of(ts: datetime) -> datetime:
    return ts.replace(minute=0, second=0, microsecond=0)


def day_of(ts: datetime) -> datetime:
    return ts.replace(hour=0, minute=0, second=0, microsecond=0)


def daily(latency: Mapping[LatencyKey, int]) -> dict[LatencyKey, int]:
    """Hourly latency bucket counts summed per UTC day (the key's hour becomes its day)."""
    out: dict[LatencyKey, int] = {}
    for (tenant, model, hour, kind, bucket), n in latency.items():
        k = (tenant, model, day_of(hour), kind, bucket)
        out[k] = out.get(k, 0) + n
    return out


def aggregate(
    rows: Iterable[Mapping[str, Any]],
    hourly: dict[HourKey, dict[str, float]] | None = None,
    latency: dict[LatencyKey, int] | None = None,
) -> tuple[dict[HourKey, dict[str, float]], dict[LatencyKey, int]]:
    """The rollups of ``rows``, added to ``hourly`` and ``latency`` when given."""
    hourly = {} if hourly is None else hourly
    latency = {} if latency is None else latency
    for r in rows:
        tenant, hour = r["tenant_id"] or "", hour_of(r["started_at"])
        key = (tenant, r["key_id"], r["model"], hour, r["error_type"] or "")
        sums = hourly.get(key)
        if sums is None:
            sums = hourly[key] = dict.fromkeys(_SUMS, 0)
        sums["requests"] += 1
        sums["errors"] += 1 if r["status"] >= 400 else 0
        sums["prompt_tokens"] += r["prompt_tokens"]
        sums["completion_tokens"] += r["completion_tokens"]
        sums["cached_tokens"] += r["cached_tokens"]
        sums["cost"] += r["cost"]
        sums["latency_ms_sum"] += r["latency_ms"] or 0.0
        if r["status"] < 400:  # percentiles describe answered requests
            lk = (tenant, r["model"], hour, "latency", bucket_of(r["latency_ms"] or 0.0))
            latency[lk] = latency.get(lk, 0) + 1
            if r.get("ttft_ms") is not None:
                tk = (tenant, r["model"], hour, "ttft", bucket_of(r["ttft_ms"]))
                latency[tk] = latency.get(tk, 0) + 1
    return hourly, latency


async def apply(conn: AsyncConnection, rows: Sequence[Mapping[str, Any]]) -> None:
    hourly: dict[HourKey, dict[str, float]] = {}
    latency: dict[LatencyKey, int] = {}
    for i in range(0, len(rows), SLICE_ROWS):
        if i:
            await asyncio.sleep(0)  # the event loop serves requests between slices
        aggregate(rows[i : i + SLICE_ROWS], hourly, latency)
    if conn.dialect.name == "postgresql":  # column arrays, one statement per table (pg_bulk)
        await pg_bulk.add_rollups(conn, pg_bulk.UPSERT_HOURLY, {k: [v[c] for c in _SUMS] for k, v in hourly.items()})
        await pg_bulk.add_rollups(conn, pg_bulk.UPSERT_LATENCY_HOURLY, {k: (n,) for k, n in latency.items()})
        await pg_bulk.add_rollups(conn, pg_bulk.UPSERT_LATENCY_DAILY, {k: (n,) for k, n in daily(latency).items()})
        return
    if hourly:
        ins = sqlite.insert(UsageHourly)
        stmt = ins.on_conflict_do_update(
            index_elements=["tenant_id", "key_id", "model", "hour", "error_type"],
            set_={c: getattr(UsageHourly, c) + getattr(ins.excluded, c) for c in _SUMS},
        )
        await conn.execute(stmt, [
            {"tenant_id": k[0], "key_id": k[1], "model": k[2], "hour": k[3], "error_type": k[4], **v}
            for k, v in sorted(hourly.items())  # a fixed order: concurrent writers lock rows alike
        ])  # fmt: skip
    if latency:
        await _add_latency(conn, LatencyHourly, "hour", latency)
        await _add_latency(conn, LatencyDaily, "day", daily(latency))


async def _add_latency(conn: AsyncConnection, table: type[LatencyHourly] | type[LatencyDaily], period: str,
                       counts: Mapping[LatencyKey, int]) -> None:
    """Add bucket counts to a latency table (SQLite), the key's time in its ``period`` column; the
    conflict target is the table's primary key."""
    ins = sqlite.insert(table)
    stmt = ins.on_conflict_do_update(
        index_elements=[c.name for c in table.__table__.primary_key],
        set_={"count": table.count + ins.excluded.count},
    )
    await conn.execute(stmt, [
        {"tenant_id": k[0], "model": k[1], period: k[2], "kind": k[3], "bucket": k[4], "count": n}
        for k, n in sorted(counts.items())
    ])  # fmt: skip
