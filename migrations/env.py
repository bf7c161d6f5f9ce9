"""Alembic environment: async engines (aiosqlite / asyncpg), batch mode on SQLite; each run ends by
recording which versions may run on the schema it leaves (``gateway.db.schema_compat``).

Each migration step, its DDL and its version stamp, is one transaction: a process killed inside a
step leaves the database at the step before. PostgreSQL runs the whole upgrade in one transaction.
SQLite's DDL is transactional too, but alembic does not wrap it (its SQLite dialect says
``transactional_ddl = False``) and the sqlite3 driver begins a transaction only before DML, so
:func:`_sqlite_transactions` takes BEGIN over from the driver (SQLAlchemy's recipe for SQLite)."""

from __future__ import annotations

import asyncio
from typing import Any

from alembic import context
from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from gateway.db.models import Base
from gateway.db.schema_compat import record

config = context.config
target_metadata = Base.metadata


def run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _sqlite_transactions(engine: AsyncEngine) -> None:
    """Have every SQLAlchemy transaction on ``engine`` emit BEGIN itself, DDL included."""

    @event.listens_for(engine.sync_engine, "connect")
    def no_driver_transactions(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine.sync_engine, "begin")
    def begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN")


def _run(connection: Connection) -> None:
    sqlite = connection.dialect.name == "sqlite"
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=sqlite,
        transactional_ddl=True,
        transaction_per_migration=sqlite,  # PostgreSQL: one transaction for the whole run, as before
        on_version_apply=config.attributes.get("on_version_apply"),  # progress lines (switchyard db upgrade)
    )
    with context.begin_transaction():
        context.run_migrations()
    # after the migrations' own commit (on SQLite, one per step); a crash in between leaves a row for
    # another revision, which older code reads as "no record"
    record(connection, context.script)
    connection.commit()


async def run_online() -> None:
    engine = create_async_engine(config.get_main_option("sqlalchemy.url") or "", poolclass=NullPool)
    if engine.dialect.name == "sqlite":
        _sqlite_transactions(engine)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    asyncio.run(run_online())
