"""stored_responses.deployment: the deployment serving the Responses API that answered a response
(an upstream's own id), so ``GET`` and ``cancel`` of one it still holds in the background
(``queued``, ``in_progress``) reach that upstream, for its owner only; NULL for a translated answer.

Revision ID: 0014_responses_deployment
Revises: 0013_responses_ids_text
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_responses_deployment"
down_revision: str | None = "0013_responses_ids_text"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
previous_code_compatible = True  # a nullable column the previous version neither reads nor writes


def upgrade() -> None:
    op.add_column("stored_responses", sa.Column("deployment", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("stored_responses") as table:
        table.drop_column("deployment")
