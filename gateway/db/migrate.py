"""Alembic, configured in code: ``migrations/`` is found next to the package, the URL comes from
the same settings as the server, so ``switchyard db upgrade`` works from any directory.

Alembic's env.py runs its own event loop, so these functions are synchronous; async callers use
``asyncio.to_thread``. ``check_schema`` is the start-up guard against an un-migrated database.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.db.engine import ensure_sqlite_dir, normalise_url, safe_url

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
    """Call ``progress`` with a line after each migration step is applied."""
    if progress is not None:
        def step(*, step: Any, **_: Any) -> None:
            doc = (step.up_revision.doc or "").strip().splitlines()
            verb = "applied" if step.is_upgrade else "reverted"
            progress(f"{verb} {step.up_revision_id}: {doc[0] if doc else ''}")

        cfg.attributes["on_version_apply"] = step
    return cfg


def upgrade(url: str, revision: str = "head", progress: Callable[[str], None] | None = None) -> None:
    command.upgrade(_with_progress(alembic_config(url), progress), revision)


def downgrade(url: str, revision: str = "-1", progress: Callable[[str], None] | None = None) -> None:
    command.downgrade(_with_progress(alembic_config(url), progress), revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def _current(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        return await conn.run_sync(_current)


async def check_schema(engine: AsyncEngine) -> None:
    """Raise SchemaNotReady unless the database is at the head revision."""
    head = head_revision()
    try:
        current = await current_revision(engine)
    except Exception as exc:  # unreachable database: say so, with the URL but no password
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SchemaNotReady(
            f"cannot reach the database at {safe_url(engine.url)}: {reason}. Check that it is running and that "
            "database.url in the config (or SWITCHYARD__DATABASE__URL) points at it"
        ) from None
    if current != head:
        state = "empty (never migrated)" if current is None else f"at revision {current}"
        raise SchemaNotReady(
            f"database {safe_url(engine.url)} is {state}, this version needs {head}: "
            "run `switchyard db upgrade --config <your config>` first"
        )
