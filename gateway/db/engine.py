"""The async engine and session factory, for SQLite (embedded) and PostgreSQL (production)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine


def normalise_url(url: str) -> URL:
    """Pick the async driver for plain ``sqlite://`` / ``postgresql://`` URLs."""
    parsed = make_url(url)
    if parsed.drivername in ("sqlite", "sqlite+pysqlite"):
        parsed = parsed.set(drivername="sqlite+aiosqlite")
    elif parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg2"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    return parsed


def safe_url(url: str | URL) -> str:
    """The URL for messages: never the password."""
    parsed = url if isinstance(url, URL) else make_url(url)
    return parsed.render_as_string(hide_password=True)


def ensure_sqlite_dir(url: URL) -> None:
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)


WAL_TRIES = 250  # 5 s of 20 ms waits for a fresh file's switch to WAL (see ``sqlite_pragmas``)


def sqlite_pragmas(dbapi_conn: Any) -> None:
    """WAL, foreign keys and a busy timeout on a new SQLite connection. Switching a fresh file to WAL
    needs a lock that SQLite's busy timeout does not wait for: processes opening one new file at once
    (two CLI commands, workers starting) got "database is locked" but the first. The switch is tried
    again then (a brief blocking sleep, only in that race: once the file is WAL it stays so)."""
    cur = dbapi_conn.cursor()
    for _ in range(WAL_TRIES - 1):
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
            time.sleep(0.02)
    else:
        cur.execute("PRAGMA journal_mode=WAL")  # its error, if it is still locked
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def make_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    """On PostgreSQL, no prepared statement outlives its use: a migration applied while the gateway
    runs (a rolling upgrade) that changes a column's type would make a cached one fail once on each
    connection (asyncpg's InvalidCachedStatementError, which aborts the transaction it is in, so it
    cannot be retried there). Preparing each time costs one more loopback round trip per statement
    (bench/db_statement_cache.py); the hot paths cache or batch what they read and write."""
    parsed = normalise_url(url)
    ensure_sqlite_dir(parsed)
    if parsed.get_backend_name() == "sqlite":
        engine = create_async_engine(parsed, connect_args={"timeout": 30})

        @event.listens_for(engine.sync_engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:
            sqlite_pragmas(dbapi_conn)

        return engine
    return create_async_engine(
        parsed,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        pool_timeout=10,
        # an unreachable server fails fast; statements are prepared afresh each time (see above)
        connect_args={"timeout": 5, "command_timeout": 30, "prepared_statement_cache_size": 0},
    )


@dataclass
class Database:
    """One engine plus its session factory; shared by the authenticator, quotas, usage and admin."""

    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]

    @classmethod
    def from_url(cls, url: str) -> Database:
        engine = make_engine(url)
        return cls(engine, async_sessionmaker(engine, expire_on_commit=False))

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        async with self.sessions() as session:
            yield session

    async def dispose(self) -> None:
        await self.engine.dispose()
