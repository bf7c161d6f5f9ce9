"""tenants.name_key: a tenant's name as names are compared (``gateway.db.names``: Unicode NFKC, case
folded, invisible characters dropped, blanks collapsed), unique, so that "Acme", "acme" and "Ａｃｍｅ"
cannot name two tenants.

The column stays nullable, so that the previous version, which knows nothing of it, can still
create tenants during a rolling upgrade (its tenants have no key: they are found by their exact
name, and get a key when renamed). Existing names are kept as they are (none is renamed or deleted). Where two or more tenants' names
are one name by that rule, the upgrade refuses before changing anything, listing each group with the
tenants' ids: rename all but one of each (``PATCH /admin/v1/tenants/{id}`` on the running version),
then upgrade again.

Revision ID: 0016_tenant_name_keys
Revises: 0015_responses_unsettled
Create Date: 2026-12-09
"""

from collections import defaultdict
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from gateway.db.names import name_key, shown

revision: str = "0016_tenant_name_keys"
down_revision: str | None = "0015_responses_unsettled"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
previous_code_compatible = True  # a nullable column: a tenant the previous version creates has none (found by its exact name)

tenants = sa.table("tenants", sa.column("id", sa.String), sa.column("name", sa.String),
                   sa.column("name_key", sa.Text), sa.column("created_at", sa.String))


class NamesCollide(RuntimeError):
    """Tenants whose names are one name once compared ignoring case and Unicode form."""


def _keys() -> dict[str, str]:
    """Each tenant's id -> its name's key; NamesCollide when two tenants share a key."""
    rows = op.get_bind().execute(sa.select(tenants.c.id, tenants.c.name).order_by(tenants.c.created_at,
                                                                                  tenants.c.id)).all()
    groups: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for tenant_id, name in rows:
        groups[name_key(name)].append((tenant_id, name))
    twins = [group for group in groups.values() if len(group) > 1]
    if twins:
        listed = "; ".join(", ".join(f"{shown(name)!r} ({tenant_id})" for tenant_id, name in group) for group in twins)
        raise NamesCollide(
            f"cannot upgrade to 0016_tenant_name_keys: {len(twins)} group(s) of tenants have names that differ only "
            f"in case, Unicode form or invisible characters, which this version takes for one name: {listed}. "
            "Nothing was changed: rename all but one tenant of each group (PATCH /admin/v1/tenants/{id} with "
            "another name, on the version running now), then upgrade again")
    return {tenant_id: key for key, group in groups.items() for tenant_id, _ in group}


def upgrade() -> None:
    keys = _keys()  # before any change: a refused upgrade leaves the database at 0015
    op.add_column("tenants", sa.Column("name_key", sa.Text(), nullable=True))
    for tenant_id, key in keys.items():
        op.execute(tenants.update().where(tenants.c.id == tenant_id).values(name_key=key))
    with op.batch_alter_table("tenants") as table:
        table.create_unique_constraint("uq_tenants_name_key", ["name_key"])


def downgrade() -> None:
    with op.batch_alter_table("tenants") as table:
        table.drop_constraint("uq_tenants_name_key", type_="unique")
        table.drop_column("name_key")
