"""Rolling upgrades: this version's code against a database a newer version migrated. The newer
version is this repository's migrations plus the ones written here (a copy of ``migrations/``), so the
code under test is exactly what an older replica would run."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import select

from gateway.admin.service import TenancyService
from gateway.db import Database, SchemaNotReady, check_schema, migrate
from gateway.db.models import SchemaCompatibility

NEWER = '''"""a newer version's migration

Revision ID: {revision}
Revises: {down}
"""

import sqlalchemy as sa
from alembic import op

revision = "{revision}"
down_revision = "{down}"
branch_labels = None
depends_on = None
{flag}


def upgrade() -> None:
    with op.batch_alter_table("{table}") as table:
        table.add_column(sa.Column("{column}", sa.String(20), {nullable}))


def downgrade() -> None:
    with op.batch_alter_table("{table}") as table:
        table.drop_column("{column}")
'''


def newer_version(tmp_path: Path) -> Path:
    """Migrations of a newer version, numbered past any of this one's (``migrate_with`` compares
    names): 9998 adds a nullable column (flagged compatible), 9999 a NOT NULL one (not flagged: the
    previous code's inserts would fail)."""
    scripts = tmp_path / "newer_migrations"
    shutil.copytree(migrate.MIGRATIONS, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    head = migrate.head_revision()
    (scripts / "versions" / "9998_newer.py").write_text(NEWER.format(
        revision="9998_newer", down=head, flag="previous_code_compatible = True", table="tenants",
        column="region", nullable="nullable=True"))
    (scripts / "versions" / "9999_breaking.py").write_text(NEWER.format(
        revision="9999_breaking", down="9998_newer", flag="", table="api_keys", column="owner",
        nullable="nullable=False, server_default='x'"))
    return scripts


def migrate_with(scripts: Path, url: str, revision: str) -> None:
    """``switchyard db upgrade``/``downgrade`` as the newer version runs it."""
    cfg = migrate.alembic_config(url)
    cfg.set_main_option("script_location", str(scripts))
    current = asyncio.run(_revision(url))
    if current is not None and revision < current:
        command.downgrade(cfg, revision)
    else:
        command.upgrade(cfg, revision)


async def _revision(url: str) -> str | None:
    db = Database.from_url(url)
    try:
        return (await migrate.schema_state(db.engine)).current
    finally:
        await db.dispose()


async def recorded(db: Database) -> tuple[str, str]:
    async with db.engine.connect() as conn:
        row = (await conn.execute(select(SchemaCompatibility.revision, SchemaCompatibility.oldest_revision))).one()
    return row.revision, row.oldest_revision


async def test_an_older_version_runs_on_a_newer_schema_only_when_it_says_so(empty_url: str, tmp_path: Path) -> None:
    scripts = newer_version(tmp_path)
    head = migrate.head_revision()
    await asyncio.to_thread(migrate.upgrade, empty_url)
    db = Database.from_url(empty_url)
    try:
        # this version's own migrations: 0008 to 0013 are flagged, 0007 is not
        assert await recorded(db) == (head, "0007_sqlite_times")
        assert (await check_schema(db.engine)).newer is False

        await asyncio.to_thread(migrate_with, scripts, empty_url, "9998_newer")
        assert await recorded(db) == ("9998_newer", "0007_sqlite_times")
        found = await check_schema(db.engine)
        assert found.newer and found.usable and found.current == "9998_newer" and found.head == head
        # the older code works on it: its inserts name only the columns it knows
        tenant = await TenancyService(db).create_tenant("acme")
        assert (await TenancyService(db).create_key(tenant.id, name="ci")).secret
        # its `db upgrade` (a bootstrap, an init step) leaves the newer schema as it is
        assert await asyncio.to_thread(migrate.upgrade, empty_url) == "9998_newer"

        await asyncio.to_thread(migrate_with, scripts, empty_url, "9999_breaking")
        assert await recorded(db) == ("9999_breaking", "9999_breaking")
        message = f"at revision 9999_breaking, newer than this version's {head}, and it needs the code of 9999_breaking"
        with pytest.raises(SchemaNotReady, match=message):
            await check_schema(db.engine)
        with pytest.raises(SchemaNotReady, match=message):
            await asyncio.to_thread(migrate.upgrade, empty_url)

        # the newer version's downgrade records again; back at this version's head, all is as before
        await asyncio.to_thread(migrate_with, scripts, empty_url, head)
        assert await recorded(db) == (head, "0007_sqlite_times")
        assert (await check_schema(db.engine)).newer is False
        assert (await TenancyService(db).list_tenants()).items
    finally:
        await db.dispose()


async def test_a_newer_schema_that_records_nothing_is_refused(tmp_path: Path) -> None:
    """A row left from another revision (the table emptied by hand, or written by other tooling)
    proves nothing about the newer schema: refused, as one without the table."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'stale.db'}"
    await asyncio.to_thread(migrate_with, newer_version(tmp_path), url, "9998_newer")
    db = Database.from_url(url)
    try:
        async with db.engine.begin() as conn:
            await conn.execute(SchemaCompatibility.__table__.update().values(revision="0011_other"))
        with pytest.raises(SchemaNotReady, match="does not record that older versions may run on it"):
            await check_schema(db.engine)
    finally:
        await db.dispose()


def test_db_cli_of_an_older_version_on_a_newer_schema(tmp_path: Path) -> None:
    """What an older replica's init container and start run: `db wait` passes at once on a newer
    schema that lists it, and fails at once (no waiting can mend it) on one that does not."""
    db_file = tmp_path / "cli.db"
    url = f"sqlite+aiosqlite:///{db_file}"
    config = tmp_path / "conf.yaml"
    config.write_text(f"database:\n  url: {url}\n")
    scripts = newer_version(tmp_path)
    cli = [str(Path(sys.executable).parent / "switchyard")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args, "--config", str(config)], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=60)

    migrate_with(scripts, url, "9998_newer")
    waited = run("db", "wait", "--timeout", "30")
    assert waited.returncode == 0, waited.stderr
    assert "9998_newer" in waited.stdout and "may run on it" in waited.stdout
    current = run("db", "current")
    assert "current: 9998_newer" in current.stdout and "records that this version may run on it" in current.stdout
    up = run("db", "upgrade")
    assert up.returncode == 0 and "nothing to migrate" in up.stderr and "at revision 9998_newer" in up.stdout
    assert run("tenant", "list").returncode == 0

    migrate_with(scripts, url, "9999_breaking")
    started = time.monotonic()
    waited = run("db", "wait", "--timeout", "30")
    assert waited.returncode == 1 and time.monotonic() - started < 20
    assert "needs the code of 9999_breaking or later" in waited.stderr and "Traceback" not in waited.stderr
    up = run("db", "upgrade")
    assert up.returncode == 1 and "run a newer version of switchyard" in up.stderr and "Traceback" not in up.stderr
    refused = run("tenant", "list")
    assert refused.returncode == 1 and "9999_breaking" in refused.stderr
