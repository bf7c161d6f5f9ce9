"""audit trail of sign-ins and key use (auth_events); server-side sign-out of dashboard sessions
(revoked_sessions)

Revision ID: 0005_audit
Revises: 0004_dash
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from gateway.db.models import BigId, UTCDateTime

revision: str = "0005_audit"
down_revision: str | None = "0004_dash"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "auth_events",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("at", UTCDateTime, nullable=False),
        sa.Column("event", sa.String(24), nullable=False),
        sa.Column("client", sa.String(64), nullable=False),
        sa.Column("key_id", sa.String(40), nullable=True),
        sa.Column("tenant_id", sa.String(40), nullable=True),
        sa.Column("key_prefix", sa.String(16), nullable=True),
        sa.Column("surface", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_auth_events"),
    )
    op.create_index("ix_auth_events_at", "auth_events", ["at"])
    op.create_index("ix_auth_events_key_at", "auth_events", ["key_id", "at"])
    op.create_table(
        "revoked_sessions",
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("expires_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("session_id", name="pk_revoked_sessions"),
    )
    op.create_index("ix_revoked_sessions_expires_at", "revoked_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_revoked_sessions_expires_at", table_name="revoked_sessions")
    op.drop_table("revoked_sessions")
    op.drop_index("ix_auth_events_key_at", table_name="auth_events")
    op.drop_index("ix_auth_events_at", table_name="auth_events")
    op.drop_table("auth_events")
