"""tenants, api keys, limits, usage records, model prices

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from gateway.db.models import BigId, UTCDateTime

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("weight", sa.Float, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tenants"),
        sa.UniqueConstraint("name", name="uq_tenants_name"),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("tenant_id", sa.String(40), nullable=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("is_admin", sa.Boolean, nullable=False),
        sa.Column("allowed_models", sa.JSON, nullable=True),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("expires_at", UTCDateTime, nullable=True),
        sa.Column("revoked_at", UTCDateTime, nullable=True),
        sa.Column("rotated_from", sa.String(40), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_api_keys_tenant_id_tenants", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
    )
    op.create_index("ix_api_keys_tenant_id", "api_keys", ["tenant_id"])
    op.create_table(
        "limits",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("scope", sa.String(8), nullable=False),
        sa.Column("scope_id", sa.String(40), nullable=False),
        sa.Column("requests_per_minute", sa.Integer, nullable=True),
        sa.Column("tokens_per_minute", sa.Integer, nullable=True),
        sa.Column("max_concurrency", sa.Integer, nullable=True),
        sa.Column("token_budget", sa.BigInteger, nullable=True),
        sa.Column("cost_budget", sa.Float, nullable=True),
        sa.Column("budget_period", sa.String(8), nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_limits"),
        sa.UniqueConstraint("scope", "scope_id", name="uq_limits_scope"),
    )
    op.create_table(
        "usage_records",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("tenant_id", sa.String(40), nullable=True),
        sa.Column("key_id", sa.String(40), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("deployment", sa.String(200), nullable=True),
        sa.Column("provider", sa.String(40), nullable=True),
        sa.Column("endpoint", sa.String(40), nullable=False),
        sa.Column("stream", sa.Boolean, nullable=False),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
        sa.Column("cached_tokens", sa.Integer, nullable=False),
        sa.Column("exact", sa.Boolean, nullable=False),
        sa.Column("cost", sa.Float, nullable=False),
        sa.Column("status", sa.Integer, nullable=False),
        sa.Column("error_type", sa.String(64), nullable=True),
        sa.Column("latency_ms", sa.Float, nullable=False),
        sa.Column("ttft_ms", sa.Float, nullable=True),
        sa.Column("started_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_usage_records"),
        sa.UniqueConstraint("request_id", name="uq_usage_records_request_id"),
    )
    op.create_index("ix_usage_records_key_id", "usage_records", ["key_id"])
    op.create_index("ix_usage_records_started_at", "usage_records", ["started_at"])
    op.create_index("ix_usage_tenant_started", "usage_records", ["tenant_id", "started_at"])
    op.create_table(
        "model_prices",
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("input_per_million", sa.Float, nullable=False),
        sa.Column("output_per_million", sa.Float, nullable=False),
        sa.Column("cached_input_per_million", sa.Float, nullable=True),
        sa.Column("updated_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("model", name="pk_model_prices"),
    )


def downgrade() -> None:
    op.drop_table("model_prices")
    op.drop_index("ix_usage_tenant_started", table_name="usage_records")
    op.drop_index("ix_usage_records_started_at", table_name="usage_records")
    op.drop_index("ix_usage_records_key_id", table_name="usage_records")
    op.drop_table("usage_records")
    op.drop_table("limits")
    op.drop_index("ix_api_keys_tenant_id", table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_table("tenants")
