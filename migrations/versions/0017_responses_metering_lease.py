"""stored_responses.metering_until: the claim on a background response's spend is a lease. The caller
that meters it sets this column (until when its claim holds, epoch seconds), records the usage row,
charges the budgets, and only then sets ``unsettled`` back to NULL; a process that dies in between
leaves the row unsettled, and once the lease has run out another caller meters it again (the same
usage row, written once). Previously the claim itself set ``unsettled`` to NULL, and the spend of a
process killed before its usage row was written was lost.

Revision ID: 0017_responses_metering_lease
Revises: 0016_tenant_name_keys
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017_responses_metering_lease"
down_revision: str | None = "0016_tenant_name_keys"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# a nullable column the previous version neither reads nor writes: it still claims a response by
# setting unsettled to NULL, so while both versions run, one of each may meter the same response at
# the same instant (one usage row still; its budgets charged twice)
previous_code_compatible = True


def upgrade() -> None:
    op.add_column("stored_responses", sa.Column("metering_until", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("stored_responses") as table:
        table.drop_column("metering_until")
