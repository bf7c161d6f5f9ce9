"""stored_responses' ids as TEXT: an upstream serving the Responses API mints its own response ids,
of no bounded length (a proxy such as LiteLLM encodes the route into them, well past 80 characters),
and PostgreSQL's VARCHAR(80) refused such a row: the answer went back with ``store: true`` but was
never kept (its GET a 404, its continuation a 400)

``id``, ``previous_response_id`` and ``upstream_previous_id`` change type; on SQLite (where the length
was never enforced) the table is rebuilt so its declared types match. The downgrade refuses, saying
how many rows, while an id is longer than 80 characters.

Revision ID: 0013_responses_ids_text
Revises: 0012_usage_token_counts_bigint
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_responses_ids_text"
down_revision: str | None = "0012_usage_token_counts_bigint"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
previous_code_compatible = True  # the previous version writes and reads the same strings

COLUMNS = ("id", "previous_response_id", "upstream_previous_id")
OLD_LENGTH = 80


class IdsTooLong(RuntimeError):
    """Rows hold ids that VARCHAR(80) columns cannot: the downgrade would refuse or cut them."""


def _retype(old: sa.types.TypeEngine, new: sa.types.TypeEngine) -> None:
    with op.batch_alter_table("stored_responses") as table:
        for column in COLUMNS:
            table.alter_column(column, existing_type=old, type_=new, existing_nullable=column != "id")


def upgrade() -> None:
    _retype(sa.String(OLD_LENGTH), sa.Text())


def downgrade() -> None:
    longer = " OR ".join(f"length({column}) > {OLD_LENGTH}" for column in COLUMNS)
    rows = op.get_bind().execute(sa.text(f"SELECT count(*) FROM stored_responses WHERE {longer}")).scalar_one()
    if rows:
        raise IdsTooLong(
            f"cannot downgrade below 0013_responses_ids_text: {rows} stored_responses row(s) hold an id longer "
            f"than {OLD_LENGTH} characters (id, previous_response_id or upstream_previous_id); delete those "
            "rows first, or stay on this revision")
    _retype(sa.Text(), sa.String(OLD_LENGTH))
