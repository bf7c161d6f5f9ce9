"""latency_hourly re-bucketed on the fine geometric histogram (percentiles within 4 %)

The bucket numbers of ``latency_hourly`` change meaning (``gateway.usage.rollup.bucket_of``), so the
table is emptied and rebuilt from the usage records, and gains an index on (tenant_id, hour).
Downgrade rebuilds the old coarse buckets.

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


def _rebuild(bucket_of: Callable[[float], int]) -> None:
    conn = op.get_bind()
    usage = sa.table("usage_records", *(sa.column(c) for c in ("id", "tenant_id", "model", "status", "latency_ms",
                                                               "ttft_ms")), sa.column("started_at", UTCDateTime))
    latency_t = sa.table("latency_hourly", *(sa.column(c) for c in ("tenant_id", "model", "hour", "kind", "bucket",
                                                                     "count")))
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
    to_db = UTCDateTime().process_bind_param
    if counts:
        conn.execute(latency_t.insert(), [
            {"tenant_id": k[0], "model": k[1], "hour": to_db(k[2], conn.dialect), "kind": k[3],  # type: ignore[arg-type]
             "bucket": k[4], "count": n}
            for k, n in counts.items()
        ])  # fmt: skip


def upgrade() -> None:
    from gateway.usage.rollup import bucket_of

    # a range's percentiles read its hours for every model: an index range, not the tenant's history
    op.create_index("ix_latency_hourly_tenant_hour", "latency_hourly", ["tenant_id", "hour"])
    _rebuild(bucket_of)


def downgrade() -> None:
    _rebuild(lambda ms: bisect.bisect_left(_OLD_BOUNDS_MS, ms))
    op.drop_index("ix_latency_hourly_tenant_hour", table_name="latency_hourly")
