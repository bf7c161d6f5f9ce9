"""stored Responses API answers (stored_responses), for GET /v1/responses/{id} and previous_response_id

Revision ID: 0006_responses
Revises: 0005_audit
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from gateway.db.models import UTCDateTime

revision: str = "0006_responses"
down_revision: str | None = "0005_audit"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "stored_responses",
        sa.Column("id", sa.String(80), nullable=False),
        sa.Column("owner", sa.String(48), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("previous_response_id", sa.String(80), nullable=True),
        sa.Column("input_items", sa.JSON, nullable=False),
        sa.Column("context", sa.JSON, nullable=False),
        sa.Column("response", sa.JSON, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_stored_responses"),
    )
    op.create_index("ix_stored_responses_owner_created", "stored_responses", ["owner", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_stored_responses_owner_created", table_name="stored_responses")
    op.drop_table("stored_responses")
