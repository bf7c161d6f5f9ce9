"""usage_records.service_tier: the provider's service tier a request was served at, as its answer
named it (OpenAI's ``service_tier``, Anthropic's ``usage.service_tier``), and priced at

Revision ID: 0009_usage_service_tier
Revises: 0008_upstream_previous
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_usage_service_tier"
down_revision: str | None = "0008_upstream_previous"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
previous_code_compatible = True  # a nullable column the previous version never names


def upgrade() -> None:
    with op.batch_alter_table("usage_records") as table:
        table.add_column(sa.Column("service_tier", sa.String(40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as table:
        table.drop_column("service_tier")
