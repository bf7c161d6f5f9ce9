"""Usage rows and their rollups into PostgreSQL: one statement per table and slice of rows.

SQLAlchemy's many-row insert binds and processes every row's parameters in Python: some 20 µs a
row, milliseconds of the event loop for each batch, which every request in flight then waits out.
Here the usage rows go as one JSON array (``json_to_recordset``: encoded by msgspec in C, parsed
by PostgreSQL), and the rollups, a few rows per batch, as whole columns (``unnest($1::text[],
...)``), on the same SQLAlchemy connection and transaction. The statements do what the SQLAlchemy
ones do on SQLite: insert usage rows unless their request id is there (returning the ids
inserted), and add the rollups to what the tables hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from sqlalchemy.ext.asyncio import AsyncConnection

_json = msgspec.json.Encoder()

# (column, PostgreSQL type of its array parameter), in the order of writer.to_row's keys
USAGE_COLUMNS = (
    ("request_id", "varchar"), ("tenant_id", "varchar"), ("key_id", "varchar"), ("model", "varchar"),
    ("deployment", "varchar"), ("provider", "varchar"), ("endpoint", "varchar"), ("stream", "boolean"),
    ("prompt_tokens", "integer"), ("completion_tokens", "integer"), ("cached_tokens", "integer"),
    ("exact", "boolean"), ("cost", "float8"), ("status", "integer"), ("error_type", "varchar"),
    ("latency_ms", "float8"), ("ttft_ms", "float8"), ("started_at", "timestamptz"),
)
HOURLY_KEY = (("tenant_id", "varchar"), ("key_id", "varchar"), ("model", "varchar"), ("hour", "timestamptz"),
              ("error_type", "varchar"))
HOURLY_SUMS = (("requests", "int8"), ("errors", "int8"), ("prompt_tokens", "int8"), ("completion_tokens", "int8"),
               ("cached_tokens", "int8"), ("cost", "float8"), ("latency_ms_sum", "float8"))
LATENCY_HOURLY = (("tenant_id", "varchar"), ("model", "varchar"), ("hour", "timestamptz"), ("kind", "varchar"),
                  ("bucket", "integer"))
LATENCY_DAILY = (("tenant_id", "varchar"), ("model", "varchar"), ("day", "timestamptz"), ("kind", "varchar"),
                 ("bucket", "integer"))


def _unnest(columns: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"${i}::{pg_type}[]" for i, (_, pg_type) in enumerate(columns, 1))


def _names(columns: Sequence[tuple[str, str]]) -> str:
    return ", ".join(name for name, _ in columns)


def _upsert(table: str, key: Sequence[tuple[str, str]], sums: Sequence[tuple[str, str]]) -> str:
    columns = (*key, *sums)
    added = ", ".join(f"{name} = {table}.{name} + excluded.{name}" for name, _ in sums)
    return (f"INSERT INTO {table} ({_names(columns)}) SELECT * FROM unnest({_unnest(columns)}) "
            f"ON CONFLICT ({_names(key)}) DO UPDATE SET {added}")


_RECORD_TYPE = ", ".join(f"{name} {pg_type}" for name, pg_type in USAGE_COLUMNS)
INSERT_USAGE = (f"INSERT INTO usage_records ({_names(USAGE_COLUMNS)}) "
                f"SELECT {_names(USAGE_COLUMNS)} FROM json_to_recordset($1::json) AS r({_RECORD_TYPE}) "
                "ON CONFLICT (request_id) DO NOTHING RETURNING request_id")
UPSERT_HOURLY = _upsert("usage_hourly", HOURLY_KEY, HOURLY_SUMS)
UPSERT_LATENCY_HOURLY = _upsert("latency_hourly", LATENCY_HOURLY, (("count", "int8"),))
UPSERT_LATENCY_DAILY = _upsert("latency_daily", LATENCY_DAILY, (("count", "int8"),))


async def insert_usage(conn: AsyncConnection, rows: Sequence[Mapping[str, Any]]) -> set[str]:
    """Insert ``rows`` (``writer.to_row`` dicts); the request ids of those not there before. The
    rows go as one JSON array (encoded in C by msgspec, parsed by PostgreSQL): asyncpg's array
    parameters check every element in Python, about 15 µs of the event loop per row."""
    return set((await conn.exec_driver_sql(INSERT_USAGE, (_json.encode(rows).decode(),))).scalars())


async def add_rollups(conn: AsyncConnection, statement: str, keyed: Mapping[tuple[Any, ...], Sequence[Any]]) -> None:
    """One of the ``UPSERT_*`` statements over ``keyed``: each key's fields, then its sums."""
    if not keyed:
        return
    rows = [(*key, *sums) for key, sums in sorted(keyed.items())]  # a fixed order: writers lock rows alike
    await conn.exec_driver_sql(statement, tuple(list(column) for column in zip(*rows, strict=True)))
