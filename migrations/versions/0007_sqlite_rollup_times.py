"""SQLite: rollup hours and days written by 0002 and 0004 in the ORM's text, merged into its rows

Those migrations wrote ``usage_hourly.hour``, ``latency_hourly.hour`` and ``latency_daily.day`` through
untyped columns, so SQLite stored '2026-12-04 19:00:00' where the ORM (and every query) uses
'2026-12-04 19:00:00.000000'. Such rows sorted before the hour they name (a range starting on that hour
left them out) and never met the usage writer's upserts (the same hour twice). Each is added into the
row in the ORM's text and removed. PostgreSQL stores timestamps, not text: nothing to do there.

Revision ID: 0007_sqlite_times
Revises: 0006_responses
Create Date: 2026-12-04
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007_sqlite_times"
down_revision: str | None = "0006_responses"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SHORT = 19  # len('2026-12-04 19:00:00'): no fraction of a second
# table, its time column, the other key columns, the summed columns
_TABLES = (
    ("usage_hourly", "hour", ("tenant_id", "key_id", "model", "error_type"),
     ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_tokens", "cost", "latency_ms_sum")),
    ("latency_hourly", "hour", ("tenant_id", "model", "kind", "bucket"), ("count",)),
    ("latency_daily", "day", ("tenant_id", "model", "kind", "bucket"), ("count",)),
)  # fmt: skip


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "sqlite":
        return
    for table, time_col, keys, sums in _TABLES:
        cols = ", ".join((*keys, time_col, *sums))
        picked = ", ".join((*keys, f"{time_col} || '.000000'", *sums))
        added = ", ".join(f"{c} = {c} + excluded.{c}" for c in sums)
        conflict = ", ".join((*keys, time_col))
        conn.exec_driver_sql(
            f"INSERT INTO {table} ({cols}) SELECT {picked} FROM {table} WHERE length({time_col}) = {_SHORT} "
            f"ON CONFLICT ({conflict}) DO UPDATE SET {added}"
        )
        conn.exec_driver_sql(f"DELETE FROM {table} WHERE length({time_col}) = {_SHORT}")


def downgrade() -> None:
    """Nothing to undo: the rows keep their sums, in the text the ORM reads and writes."""
