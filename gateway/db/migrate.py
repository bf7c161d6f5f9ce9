"""Alembic, configured in code: ``migrations/`` is found next to the package, the URL comes from
the same settings as the server, so ``switchyard db upgrade`` works from any directory.

Alembic's env.py runs its own event loop, so these functions are synchronous; async callers use
``asyncio.to_thread``. ``check_schema`` is the start-up guard against a database this version
cannot run on: an un-migrated one, or a newer one that does not record this version as compatible
(``gateway.db.schema_compat``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from gateway.db.engine import ensure_sqlite_dir, normalise_url, safe_url
from gateway.db.schema_compat import SchemaState, state

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


class SchemaNotReady(RuntimeError):
    """The database is not at the latest migration; the message says what to run."""


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    parsed = normalise_url(url)
    ensure_sqlite_dir(parsed)
    # alembic's ini interpolation treats % specially
    cfg.set_main_option("sqlalchemy.url", parsed.render_as_string(hide_password=False).replace("%", "%%"))
    return cfg


def _with_progress(cfg: Config, progress: Callable[[str], None] | None) -> Config:
    """Call ``progress`` with a line after each migration step is applied. A line that cannot be
    written (``db upgrade 2>&1 | head``: EPIPE once head has gone) is dropped: alembic calls this
    after a step's DDL and version stamp but before their commit, and a failure there would undo the
    step and end the upgrade."""
    if progress is not None:
        def step(*, step: Any, **_: Any) -> None:
            doc = (step.up_revision.doc or "").strip().splitlines()
            verb = "applied" if step.is_upgrade else "reverted"
            try:
                progress(f"{verb} {step.up_revision_id}: {doc[0] if doc else ''}")
            except (OSError, ValueError):  # a closed or broken stream (ValueError: I/O on a closed file)
                pass

        cfg.attributes["on_version_apply"] = step
    return cfg


def upgrade(url: str, revision: str = "head", progress: Callable[[str], None] | None = None) -> str | None:
    """Migrate to ``revision``; return the revision the database is at then. A database newer than
    this version is left as it is when it records this version as compatible (an older replica's
    start during a rolling upgrade), else SchemaNotReady says which version it needs."""
    found = asyncio.run(_state_of(url))
    if found.newer:
        if not found.usable:
            raise SchemaNotReady(f"database {safe_url(url)} is {found.problem()}")
        if progress is not None:
            progress(f"{found.current} is newer than this version's {found.head} and records that it may run "
                     "on it: nothing to migrate")
        return found.current
    command.upgrade(_with_progress(alembic_config(url), progress), revision)
    return current_revision(url)


def downgrade(url: str, revision: str = "-1", progress: Callable[[str], None] | None = None) -> str | None:
    """Migrate down to ``revision``; return the revision the database is at then (None: empty)."""
    command.downgrade(_with_progress(alembic_config(url), progress), revision)
    return current_revision(url)


def current_revision(url: str) -> str | None:
    """The revision the database is at, as read from it (None: empty): what a run reached, which is
    not the revision asked for when there was nothing to do (an upgrade to an older revision)."""
    return asyncio.run(_state_of(url)).current


@cache
def script_directory() -> ScriptDirectory:
    """This version's migrations."""
    return ScriptDirectory.from_config(alembic_config("sqlite://"))


def head_revision() -> str | None:
    return script_directory().get_current_head()


async def _state_of(url: str) -> SchemaState:
    engine = create_async_engine(alembic_config(url).get_main_option("sqlalchemy.url") or "", poolclass=NullPool)
    try:
        return await schema_state(engine)
    finally:
        await engine.dispose()


async def schema_state(engine: AsyncEngine) -> SchemaState:
    """Where ``engine``'s database stands for this version (an unreachable one raises)."""
    async with engine.connect() as conn:
        return await conn.run_sync(state, script_directory())


async def check_schema(engine: AsyncEngine) -> SchemaState:
    """Raise SchemaNotReady unless this version may run on the database: at its head revision, or
    newer and recording this version as compatible."""
    try:
        found = await schema_state(engine)
    except Exception as exc:  # unreachable database: say so, with the URL but no password
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SchemaNotReady(
            f"cannot reach the database at {safe_url(engine.url)}: {reason}. Check that it is running and that "
            "database.url in the config (or SWITCHYARD__DATABASE__URL) points at it"
        ) from None
    if (problem := found.problem()) is not None:
        raise SchemaNotReady(f"database {safe_url(engine.url)} is {problem}")
    return found
