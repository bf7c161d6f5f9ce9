"""usage_records.upstream_request_id: the provider's own id of the answer to a request (its
``x-request-id``, Azure's ``apim-request-id``, Anthropic's ``request-id``), what its support asks for

Revision ID: 0010_upstream_request_id
Revises: 0009_usage_service_tier
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_upstream_request_id"
down_revision: str | None = "0009_usage_service_tier"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
previous_code_compatible = True  # a nullable column the previous version never names


def upgrade() -> None:
    with op.batch_alter_table("usage_records") as table:
        table.add_column(sa.Column("upstream_request_id", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as table:
        table.drop_column("upstream_request_id")
