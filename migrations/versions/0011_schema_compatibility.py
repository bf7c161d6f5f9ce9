"""schema_compatibility: the oldest version whose code may run on the database's schema, read by a
replica of that older version when it (re)starts during a rolling upgrade

Revision ID: 0011_schema_compatibility
Revises: 0010_upstream_request_id
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_schema_compatibility"
down_revision: str | None = "0010_upstream_request_id"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
previous_code_compatible = True  # a table the previous version never names


def upgrade() -> None:
    op.create_table(
        "schema_compatibility",
        sa.Column("revision", sa.String(64), nullable=False),
        sa.Column("oldest_revision", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("revision", name="pk_schema_compatibility"),
    )


def downgrade() -> None:
    op.drop_table("schema_compatibility")
