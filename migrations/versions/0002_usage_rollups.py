"""hourly usage rollups (usage_hourly, latency_hourly), filled from existing usage records

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from gateway.db.models import UTCDateTime

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BACKFILL_BATCH = 20_000


def upgrade() -> None:
    op.create_table(
        "usage_hourly",
        sa.Column("tenant_id", sa.String(40), nullable=False),
        sa.Column("key_id", sa.String(40), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("hour", UTCDateTime, nullable=False),
        sa.Column("error_type", sa.String(64), nullable=False),
        sa.Column("requests", sa.BigInteger, nullable=False),
        sa.Column("errors", sa.BigInteger, nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False),
        sa.Column("cached_tokens", sa.BigInteger, nullable=False),
        sa.Column("cost", sa.Float, nullable=False),
        sa.Column("latency_ms_sum", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "key_id", "model", "hour", "error_type", name="pk_usage_hourly"),
    )
    op.create_index("ix_usage_hourly_tenant_hour", "usage_hourly", ["tenant_id", "hour"])
    op.create_table(
        "latency_hourly",
        sa.Column("tenant_id", sa.String(40), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("hour", UTCDateTime, nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("bucket", sa.Integer, nullable=False),
        sa.Column("count", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "model", "hour", "kind", "bucket", name="pk_latency_hourly"),
    )
    _backfill()


def _backfill() -> None:
    """Roll up the usage records written before this migration, batch by batch."""
    from gateway.usage.rollup import aggregate

    conn = op.get_bind()
    usage = sa.table("usage_records", *(sa.column(c) for c in (
        "id", "tenant_id", "key_id", "model", "status", "error_type", "prompt_tokens", "completion_tokens",
        "cached_tokens", "cost", "latency_ms", "ttft_ms")), sa.column("started_at", UTCDateTime))  # fmt: skip
    # The hour columns are typed so that SQLite gets the text the ORM writes (microseconds included):
    # rows in another format would compare and conflict as different hours.
    hourly_t = sa.table("usage_hourly", *(sa.column(c) for c in (
        "tenant_id", "key_id", "model", "error_type", "requests", "errors", "prompt_tokens",
        "completion_tokens", "cached_tokens", "cost", "latency_ms_sum")), sa.column("hour", UTCDateTime))  # fmt: skip
    latency_t = sa.table("latency_hourly", *(sa.column(c) for c in ("tenant_id", "model", "kind", "bucket", "count")),
                         sa.column("hour", UTCDateTime))
    hourly: dict = {}
    latency: dict = {}
    last = 0
    while True:
        rows = conn.execute(sa.select(usage).where(usage.c.id > last).order_by(usage.c.id).limit(_BACKFILL_BATCH))
        batch = [dict(r._mapping) for r in rows]
        if not batch:
            break
        last = batch[-1]["id"]
        h, lat = aggregate(batch)
        for k, v in h.items():
            acc = hourly.setdefault(k, dict.fromkeys(v, 0))
            for f, n in v.items():
                acc[f] += n
        for k, n in lat.items():
            latency[k] = latency.get(k, 0) + n
    if hourly:
        conn.execute(hourly_t.insert(), [
            {"tenant_id": k[0], "key_id": k[1], "model": k[2], "hour": k[3], "error_type": k[4], **v}
            for k, v in hourly.items()
        ])  # fmt: skip
    if latency:
        conn.execute(latency_t.insert(), [
            {"tenant_id": k[0], "model": k[1], "hour": k[2], "kind": k[3], "bucket": k[4], "count": n}
            for k, n in latency.items()
        ])  # fmt: skip


def downgrade() -> None:
    op.drop_table("latency_hourly")
    op.drop_index("ix_usage_hourly_tenant_hour", table_name="usage_hourly")
    op.drop_table("usage_hourly")
