"""stored_responses.upstream_previous_id: the response only the upstream holds that a kept
conversation began by continuing, sent on with the kept items (``gateway.stored_responses.Kept``)

Revision ID: 0008_upstream_previous
Revises: 0007_sqlite_times
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_upstream_previous"
down_revision: str | None = "0007_sqlite_times"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
previous_code_compatible = True  # a nullable column the previous version never names


def upgrade() -> None:
    with op.batch_alter_table("stored_responses") as table:
        table.add_column(sa.Column("upstream_previous_id", sa.String(80), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("stored_responses") as table:
        table.drop_column("upstream_previous_id")
