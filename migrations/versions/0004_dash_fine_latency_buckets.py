"""latency histograms on fine geometric buckets (percentiles within 4 %), per hour and per day

The bucket numbers of ``latency_hourly`` change meaning (``gateway.usage.buckets.bucket_of``), so the
table is emptied and rebuilt from the usage records, and gains an index on (tenant_id, hour); the new
``latency_daily`` holds the same counts per UTC day. Downgrade rebuilds the old coarse buckets.

Revision ID: 0004_dash
Revises: 0002
Create Date: 2026-12-04
"""

import bisect
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import op

from gateway.db.models import UTCDateTime

revision: str = "0004_dash"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BATCH = 20_000
_OLD_BOUNDS_MS = (25, 50, 100, 200, 350, 500, 750, 1000, 1500, 2000, 3000, 5000, 7500, 10000, 20000, 30000,
                  60000, 120000)


def _rebuild(bucket_of: Callable[[float], int], with_daily: bool) -> None:
    conn = op.get_bind()
    usage = sa.table("usage_records", *(sa.column(c) for c in ("id", "tenant_id", "model", "status", "latency_ms",
                                                               "ttft_ms")), sa.column("started_at", UTCDateTime))
    # Typed hour and day columns: SQLite then gets the ORM's text for them (see 0007_sqlite_times).
    latency_t = sa.table("latency_hourly", *(sa.column(c) for c in ("tenant_id", "model", "kind", "bucket", "count")),
                         sa.column("hour", UTCDateTime))
    daily_t = sa.table("latency_daily", *(sa.column(c) for c in ("tenant_id", "model", "kind", "bucket", "count")),
                       sa.column("day", UTCDateTime))
    conn.execute(latency_t.delete())
    counts: dict[tuple[str, str, object, str, int], int] = {}
    last = 0
    while True:
        batch = conn.execute(sa.select(usage).where(usage.c.id > last).order_by(usage.c.id).limit(_BATCH)).all()
        if not batch:
            break
        last = batch[-1].id
        for r in batch:
            if r.status >= 400:
                continue
            hour = r.started_at.replace(minute=0, second=0, microsecond=0)
            for kind, ms in (("latency", r.latency_ms or 0.0), ("ttft", r.ttft_ms)):
                if ms is not None:
                    k = (r.tenant_id or "", r.model, hour, kind, bucket_of(ms))
                    counts[k] = counts.get(k, 0) + 1
    if counts:
        conn.execute(latency_t.insert(), [
            {"tenant_id": k[0], "model": k[1], "hour": k[2], "kind": k[3],
             "bucket": k[4], "count": n}
            for k, n in counts.items()
        ])  # fmt: skip
    if with_daily and counts:
        days: dict[tuple[str, str, object, str, int], int] = {}
        for (tenant, model, hour, kind, bucket), n in counts.items():
            k = (tenant, model, hour.replace(hour=0), kind, bucket)  # type: ignore[attr-defined]
            days[k] = days.get(k, 0) + n
        conn.execute(daily_t.insert(), [
            {"tenant_id": k[0], "model": k[1], "day": k[2], "kind": k[3],
             "bucket": k[4], "count": n}
            for k, n in days.items()
        ])  # fmt: skip


def upgrade() -> None:
    from gateway.usage.buckets import bucket_of

    # a range's percentiles read its hours for every model: an index range, not the tenant's history
    op.create_index("ix_latency_hourly_tenant_hour", "latency_hourly", ["tenant_id", "hour"])
    op.create_table(
        "latency_daily",
        sa.Column("tenant_id", sa.String(40), nullable=False),
        sa.Column("day", UTCDateTime, nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("bucket", sa.Integer, nullable=False),
        sa.Column("count", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "day", "model", "kind", "bucket", name="pk_latency_daily"),
    )
    _rebuild(bucket_of, with_daily=True)


def downgrade() -> None:
    op.drop_table("latency_daily")
    _rebuild(lambda ms: bisect.bisect_left(_OLD_BOUNDS_MS, ms), with_daily=False)
    op.drop_index("ix_latency_hourly_tenant_hour", table_name="latency_hourly")
