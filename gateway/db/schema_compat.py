"""Which versions may run on a database: what lets a rolling upgrade restart old replicas.

A migration that the previous version's code keeps working on (it adds a table or a nullable column
that code never names) says so in its module: ``previous_code_compatible = True``. After every
upgrade or downgrade, ``migrations/env.py`` calls :func:`record`, which writes into
``schema_compatibility`` the database's revision and the oldest revision whose code may run on it
(walking back over such migrations). An older replica cannot know the newer migrations, but it reads
that row: :func:`state` accepts a newer schema whose recorded oldest revision its own code contains.
A migration without the flag (a rename, a NOT NULL column, a changed meaning) is the conservative
default: older code refuses the schema and says which version it needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import delete, insert, inspect, select
from sqlalchemy.engine import Connection

from gateway.db.models import SchemaCompatibility

FLAG = "previous_code_compatible"


def oldest_compatible(script: ScriptDirectory, revision: str) -> str:
    """The oldest revision whose code may run on the schema at ``revision``."""
    step = script.get_revision(revision)
    while step is not None and isinstance(step.down_revision, str) and getattr(step.module, FLAG, False) is True:
        step = script.get_revision(step.down_revision)
    assert step is not None
    return step.revision


def record(connection: Connection, script: ScriptDirectory) -> None:
    """Rewrite the row for the revision ``connection``'s database is at now (no table below 0011)."""
    revision = MigrationContext.configure(connection).get_current_revision()
    if revision is None or not inspect(connection).has_table(SchemaCompatibility.__tablename__):
        return
    connection.execute(delete(SchemaCompatibility))
    oldest = oldest_compatible(script, revision)
    connection.execute(insert(SchemaCompatibility).values(revision=revision, oldest_revision=oldest))


@dataclass(frozen=True)
class SchemaState:
    """Where a database's schema stands for this version's code (its migrations' ``head``)."""

    current: str | None
    head: str | None
    newer: bool  # ``current`` is not one of this version's revisions
    oldest: str | None  # for a newer schema: the oldest revision it records as able to run on it
    oldest_known: bool  # ``oldest`` is one of this version's revisions: this code may run on it

    @property
    def usable(self) -> bool:
        return self.current == self.head or self.compatible_newer

    @property
    def compatible_newer(self) -> bool:
        return self.newer and self.oldest_known

    def problem(self) -> str | None:
        """What keeps this version off the database, with what to do; None when it may run on it."""
        if self.usable:
            return None
        upgrade = "run `switchyard db upgrade --config <your config>` first"
        if self.current is None:
            return f"empty (never migrated), this version needs {self.head}: {upgrade}"
        if not self.newer:
            return f"at revision {self.current}, this version needs {self.head}: {upgrade}"
        needs = (f"it needs the code of {self.oldest} or later" if self.oldest is not None
                 else "it does not record that older versions may run on it")
        return (f"at revision {self.current}, newer than this version's {self.head}, and {needs}: "
                "run a newer version of switchyard")


def state(connection: Connection, script: ScriptDirectory) -> SchemaState:
    """Where ``connection``'s database stands for the code whose migrations are ``script``."""
    current = MigrationContext.configure(connection).get_current_revision()
    known = {step.revision for step in script.walk_revisions()}
    newer = current is not None and current not in known
    oldest = None
    if newer and inspect(connection).has_table(SchemaCompatibility.__tablename__):
        row = connection.execute(select(SchemaCompatibility.revision, SchemaCompatibility.oldest_revision)).first()
        oldest = row.oldest_revision if row is not None and row.revision == current else None
    return SchemaState(current, script.get_current_head(), newer, oldest, oldest in known)
