"""Alembic environment: async engines (aiosqlite / asyncpg), batch mode on SQLite; each run ends by
recording which versions may run on the schema it leaves (``gateway.db.schema_compat``)."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
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


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        on_version_apply=config.attributes.get("on_version_apply"),  # progress lines (switchyard db upgrade)
    )
    with context.begin_transaction():
        context.run_migrations()
    # after the migrations' own commit (SQLite's DDL is not transactional: alembic commits as it goes);
    # a crash in between leaves a row for another revision, which older code reads as "no record"
    record(connection, context.script)
    connection.commit()


async def run_online() -> None:
    engine = create_async_engine(config.get_main_option("sqlalchemy.url") or "", poolclass=NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    asyncio.run(run_online())
