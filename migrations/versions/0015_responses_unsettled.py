"""stored_responses.unsettled: a background response whose spend is not metered yet (who started it,
what its usage row needs), until the first poll, cancel or the gateway's follower that finds it
finished meters it and sets the column back to NULL (the row is the claim: it is metered once).

Revision ID: 0015_responses_unsettled
Revises: 0014_responses_deployment
Create Date: 2026-12-08
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_responses_unsettled"
down_revision: str | None = "0014_responses_deployment"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
previous_code_compatible = True  # a nullable column the previous version neither reads nor writes

WHERE = sa.text("unsettled IS NOT NULL")


def upgrade() -> None:
    op.add_column("stored_responses", sa.Column("unsettled", sa.JSON(), nullable=True))
    op.create_index("ix_stored_responses_unsettled", "stored_responses", ["id"], postgresql_where=WHERE,
                    sqlite_where=WHERE)


def downgrade() -> None:
    op.drop_index("ix_stored_responses_unsettled", "stored_responses")
    with op.batch_alter_table("stored_responses") as table:
        table.drop_column("unsettled")
