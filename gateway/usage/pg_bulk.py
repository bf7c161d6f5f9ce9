"""Usage rows and their rollups into PostgreSQL.

SQLAlchemy's many-row insert binds and processes every row's parameters in Python: some 20 µs a
row, milliseconds of the event loop for each batch, which every request in flight then waits out.
Here the usage rows go as one JSON array (``json_to_recordset``: encoded by msgspec in C, parsed
by PostgreSQL), and one statement inserts them unless their request id is there and adds the rows
it inserted to the rollups, aggregated by PostgreSQL as ``rollup.aggregate`` does on SQLite
(``INSERT_USAGE_AND_ROLLUPS``). Rollups computed elsewhere (``rollup.apply``) go as whole columns
(``unnest($1::text[], ...)``, the ``UPSERT_*`` statements).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.usage.buckets import GROWTH, MIN_MS

_json = msgspec.json.Encoder()

# (column, PostgreSQL type of its array parameter), in the order of writer.to_row's keys
USAGE_COLUMNS = (
    ("request_id", "varchar"), ("tenant_id", "varchar"), ("key_id", "varchar"), ("model", "varchar"),
    ("deployment", "varchar"), ("provider", "varchar"), ("endpoint", "varchar"), ("stream", "boolean"),
    ("prompt_tokens", "int8"), ("completion_tokens", "int8"), ("cached_tokens", "int8"),
    ("exact", "boolean"), ("cost", "float8"), ("status", "integer"), ("error_type", "varchar"),
    ("latency_ms", "float8"), ("ttft_ms", "float8"), ("started_at", "timestamptz"), ("service_tier", "varchar"),
    ("upstream_request_id", "varchar"),
)
HOURLY_KEY = (("tenant_id", "varchar"), ("key_id", "varchar"), ("model", "varchar"), ("hour", "timestamptz"),
              ("error_type", "varchar"))
HOURLY_SUMS = (("requests", "int8"), ("errors", "int8"), ("prompt_tokens", "int8"), ("completion_tokens", "int8"),
               ("cached_tokens", "int8"), ("cost", "float8"), ("latency_ms_sum", "float8"))
LATENCY_HOURLY = (("tenant_id", "varchar"), ("model", "varchar"), ("hour", "timestamptz"), ("kind", "varchar"),
                  ("bucket", "integer"))
LATENCY_DAILY = (("tenant_id", "varchar"), ("model", "varchar"), ("day", "timestamptz"), ("kind", "varchar"),
                 ("bucket", "integer"))
COUNT = (("count", "int8"),)


def _unnest(columns: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"${i}::{pg_type}[]" for i, (_, pg_type) in enumerate(columns, 1))


def _names(columns: Sequence[tuple[str, str]]) -> str:
    return ", ".join(name for name, _ in columns)


def _upsert(table: str, key: Sequence[tuple[str, str]], sums: Sequence[tuple[str, str]],
            grouped: str | None = None) -> str:
    """Add rows to ``table``'s sums: the rows of column-array parameters, or with ``grouped`` those
    of that query (its key's columns, then its sums), grouped by the key and in its order, so
    that concurrent writers lock rows alike."""
    columns = (*key, *sums)
    added = ", ".join(f"{name} = {table}.{name} + excluded.{name}" for name, _ in sums)
    by_key = ", ".join(str(i) for i in range(1, len(key) + 1))
    rows = f"SELECT * FROM unnest({_unnest(columns)})" if grouped is None else (
        f"{grouped} GROUP BY {by_key} ORDER BY {by_key}")
    return f"INSERT INTO {table} ({_names(columns)}) {rows} ON CONFLICT ({_names(key)}) DO UPDATE SET {added}"


_RECORD_TYPE = ", ".join(f"{name} {pg_type}" for name, pg_type in USAGE_COLUMNS)
_INSERT_USAGE = (f"INSERT INTO usage_records ({_names(USAGE_COLUMNS)}) "
                 f"SELECT {_names(USAGE_COLUMNS)} FROM json_to_recordset($1::json) AS r({_RECORD_TYPE}) "
                 "ON CONFLICT (request_id) DO NOTHING")
UPSERT_HOURLY = _upsert("usage_hourly", HOURLY_KEY, HOURLY_SUMS)
UPSERT_LATENCY_HOURLY = _upsert("latency_hourly", LATENCY_HOURLY, COUNT)
UPSERT_LATENCY_DAILY = _upsert("latency_daily", LATENCY_DAILY, COUNT)


def _bucket(ms: str) -> str:
    """``buckets.bucket_of`` in SQL: the same float8 operations on the same constants."""
    return (f"CASE WHEN {ms} <= {MIN_MS!r}::float8 THEN 0 ELSE greatest(1, ceil(ln({ms} / {MIN_MS!r}::float8) "
            f"/ ln({GROWTH!r}::float8) - 1e-9::float8))::int END")


_HOUR, _DAY = "date_trunc('hour', started_at, 'UTC')", "date_trunc('day', started_at, 'UTC')"
_LATENCIES = (  # one row per answered request's latency, and per known time to first token (rollup.aggregate)
    f"SELECT coalesce(tenant_id, '') AS tenant_id, model, started_at, 'latency' AS kind, "
    f"{_bucket('coalesce(latency_ms, 0)')} AS bucket FROM created WHERE status < 400 "
    f"UNION ALL SELECT coalesce(tenant_id, ''), model, started_at, 'ttft', {_bucket('ttft_ms')} "
    "FROM created WHERE status < 400 AND ttft_ms IS NOT NULL"
)
INSERT_USAGE_AND_ROLLUPS = (
    f"WITH created AS ({_INSERT_USAGE} RETURNING *), "
    "hourly AS (" + _upsert("usage_hourly", HOURLY_KEY, HOURLY_SUMS, (
        f"SELECT coalesce(tenant_id, ''), key_id, model, {_HOUR}, coalesce(error_type, ''), count(*), "
        "count(*) FILTER (WHERE status >= 400), sum(prompt_tokens), sum(completion_tokens), sum(cached_tokens), "
        "sum(cost), sum(coalesce(latency_ms, 0)) FROM created")) + "), "
    f"latencies AS ({_LATENCIES}), "
    "latency_hours AS (" + _upsert("latency_hourly", LATENCY_HOURLY, COUNT,
                                   f"SELECT tenant_id, model, {_HOUR}, kind, bucket, count(*) FROM latencies") + "), "
    "latency_days AS (" + _upsert("latency_daily", LATENCY_DAILY, COUNT,
                                  f"SELECT tenant_id, model, {_DAY}, kind, bucket, count(*) FROM latencies") + ") "
    "SELECT count(*) FROM created"
)  # fmt: skip


async def insert_usage_and_rollups(conn: AsyncConnection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``rows`` (``writer.to_row`` dicts) unless their request id is there, and add the rows
    inserted to the hourly rollups, in one statement: PostgreSQL aggregates them (as
    ``rollup.aggregate`` does on SQLite), so the event loop does not. The rows go as one JSON array
    (encoded in C by msgspec, parsed by PostgreSQL): asyncpg's array parameters check every
    element in Python, about 15 µs of the event loop per row."""
    await conn.exec_driver_sql(INSERT_USAGE_AND_ROLLUPS, (_json.encode(rows).decode(),))


async def add_rollups(conn: AsyncConnection, statement: str, keyed: Mapping[tuple[Any, ...], Sequence[Any]]) -> None:
    """One of the ``UPSERT_*`` statements over ``keyed``: each key's fields, then its sums."""
    if not keyed:
        return
    rows = [(*key, *sums) for key, sums in sorted(keyed.items())]  # a fixed order: writers lock rows alike
    await conn.exec_driver_sql(statement, tuple(list(column) for column in zip(*rows, strict=True)))
