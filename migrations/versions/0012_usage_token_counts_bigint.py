"""usage_records' token counts as BIGINT: an upstream's usage counts have no bound, and PostgreSQL's
INTEGER refused a row past 2**31 - 1 (it went to the quarantine file, not the database)

SQLite's INTEGER already holds 64 bits: nothing to do there. On PostgreSQL the three columns change
in one ALTER TABLE, one rewrite of the table under an exclusive lock (the rollups' sums were BIGINT
from the start). The downgrade refuses, saying how many rows, while a count does not fit INTEGER.

Revision ID: 0012_usage_token_counts_bigint
Revises: 0011_schema_compatibility
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_usage_token_counts_bigint"
down_revision: str | None = "0011_schema_compatibility"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
previous_code_compatible = True  # the previous version writes and reads the same integers

COLUMNS = ("prompt_tokens", "completion_tokens", "cached_tokens")
INT32_MAX = 2**31 - 1


class CountsTooLarge(RuntimeError):
    """Rows hold token counts that INTEGER columns cannot: the downgrade would lose them."""


def _retype(sql_type: str) -> None:
    if op.get_bind().dialect.name == "postgresql":
        changes = ", ".join(f"ALTER COLUMN {column} TYPE {sql_type}" for column in COLUMNS)
        op.execute(f"ALTER TABLE usage_records {changes}")


def upgrade() -> None:
    _retype("BIGINT")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        outside = " OR ".join(f"{column} NOT BETWEEN {-INT32_MAX - 1} AND {INT32_MAX}" for column in COLUMNS)
        rows = op.get_bind().execute(sa.text(f"SELECT count(*) FROM usage_records WHERE {outside}")).scalar_one()
        if rows:
            raise CountsTooLarge(
                f"cannot downgrade below 0012_usage_token_counts_bigint: {rows} usage_records row(s) hold a token "
                f"count past INTEGER's {INT32_MAX} (prompt_tokens, completion_tokens or cached_tokens); "
                "delete or export those rows first, or stay on this revision")
    _retype("INTEGER")
