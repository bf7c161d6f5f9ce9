"""Alembic migrations on SQLite and PostgreSQL, the un-migrated start-up guard, and the db CLI."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect
from sqlalchemy.exc import IntegrityError
from typer.testing import CliRunner

from gateway.cli import app
from gateway.db import Database, SchemaNotReady, check_schema, migrate
from gateway.db.models import Base
from tests.support.concurrent import concurrently

TABLES = {"tenants", "api_keys", "limits", "usage_records", "model_prices", "usage_hourly", "latency_hourly",
          "stored_responses", "auth_events", "revoked_sessions", "latency_daily", "schema_compatibility"}


async def tables(url: str) -> set[str]:
    db = Database.from_url(url)
    try:
        async with db.engine.connect() as conn:
            return set(await conn.run_sync(lambda c: inspect(c).get_table_names())) - {"alembic_version"}
    finally:
        await db.dispose()


async def _assert_at_head(url: str) -> None:
    """The database at ``url`` is whole at the head: its schema checked, every table there."""
    db = Database.from_url(url)
    try:
        await check_schema(db.engine)
    finally:
        await db.dispose()
    assert await tables(url) == TABLES


async def test_upgrade_from_empty_downgrade_and_again(empty_url: str) -> None:
    db = Database.from_url(empty_url)
    try:
        with pytest.raises(SchemaNotReady, match="switchyard db upgrade"):
            await check_schema(db.engine)
        await asyncio.to_thread(migrate.upgrade, empty_url)
        await check_schema(db.engine)
        assert await tables(empty_url) == TABLES
        await asyncio.to_thread(migrate.downgrade, empty_url, "base")
        assert await tables(empty_url) == set()
        with pytest.raises(SchemaNotReady, match="empty"):
            await check_schema(db.engine)
        await asyncio.to_thread(migrate.upgrade, empty_url)
        await check_schema(db.engine)
    finally:
        await db.dispose()


async def test_migration_matches_the_models(empty_url: str) -> None:
    """Autogenerate finds nothing to do: the migration creates exactly what the ORM declares, column
    types included."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    await asyncio.to_thread(migrate.upgrade, empty_url)
    db = Database.from_url(empty_url)
    try:
        async with db.engine.connect() as conn:
            diff = await conn.run_sync(
                lambda c: compare_metadata(MigrationContext.configure(c, opts={"compare_type": True}), Base.metadata)
            )
    finally:
        await db.dispose()
    assert diff == []


def test_db_cli_works_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db_file = tmp_path / "cli.db"
    config = tmp_path / "conf.yaml"
    config.write_text(f"database:\n  url: sqlite+aiosqlite:///{db_file}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cli = [str(Path(sys.executable).parent / "switchyard")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60)

    monkeypatch.chdir(elsewhere)  # the read-backs run in-process, from the same directory and environment
    unset = {k: None for k in os.environ if k.startswith("SWITCHYARD")}

    def read(*args: str) -> str:
        done = CliRunner().invoke(app, list(args), env=unset)
        assert done.exit_code == 0, (args, done.stderr)
        return done.stdout

    refused, waited = concurrently(partial(run, "tenant", "list", "--config", str(config)),
                                   partial(run, "db", "wait", "--config", str(config), "--timeout", "0.5",
                                           "--interval", "0.2"))
    assert refused.returncode == 1 and "switchyard db upgrade" in refused.stderr
    assert waited.returncode == 1 and "switchyard db upgrade" in waited.stderr and "Traceback" not in waited.stderr
    up = run("db", "upgrade", "--config", str(config))
    assert up.returncode == 0, up.stderr
    with ThreadPoolExecutor(1) as pool:  # the wait's process beside the read-backs (CliRunner: one at a time)
        ready = pool.submit(run, "db", "wait", "--config", str(config), "--timeout", "5")
        current = read("db", "current", "--config", str(config))
        read("tenant", "list", "--config", str(config))
    assert ready.result().returncode == 0
    assert f"current: {migrate.head_revision()} " in current
    down = run("db", "downgrade", "--config", str(config), "--revision", "base")
    assert down.returncode == 0, down.stderr
    assert "(empty)" in read("db", "current", "--config", str(config))


async def _usage_columns(url: str) -> dict[str, object]:
    db = Database.from_url(url)
    try:
        async with db.engine.connect() as conn:
            found = await conn.run_sync(lambda c: inspect(c).get_columns("usage_records"))
    finally:
        await db.dispose()
    return {c["name"]: c for c in found}


async def test_0010_adds_and_drops_the_upstream_request_id_keeping_the_rows(empty_url: str) -> None:
    """``usage_records.upstream_request_id`` (nullable, 128 characters) comes with 0010 and goes with
    its downgrade; the rows written before and after stay."""
    await asyncio.to_thread(migrate.upgrade, empty_url, "0009_usage_service_tier")
    assert "upstream_request_id" not in await _usage_columns(empty_url)
    db = Database.from_url(empty_url)
    row = ("'r1', 'k', 'm', 'chat.completions', false, 0, 0, 0, true, 0.0, 200, 0.0, "
           "'2026-12-06 00:00:00+00:00'")
    insert = ("INSERT INTO usage_records (request_id, key_id, model, endpoint, stream, prompt_tokens, "
              "completion_tokens, cached_tokens, exact, cost, status, latency_ms, started_at{}) VALUES ({}{})")
    try:
        async with db.engine.begin() as conn:
            await conn.exec_driver_sql(insert.format("", row, ""))
        await asyncio.to_thread(migrate.upgrade, empty_url)
        column = (await _usage_columns(empty_url))["upstream_request_id"]
        assert column["nullable"] and getattr(column["type"], "length", None) == 128
        async with db.engine.begin() as conn:
            await conn.exec_driver_sql(insert.format(", upstream_request_id", row.replace("'r1'", "'r2'"),
                                                     ", 'req_abc'"))
            got = dict((await conn.exec_driver_sql(
                "SELECT request_id, upstream_request_id FROM usage_records")).all())
        assert got == {"r1": None, "r2": "req_abc"}
        await asyncio.to_thread(migrate.downgrade, empty_url, "0009_usage_service_tier")
        assert "upstream_request_id" not in await _usage_columns(empty_url)
        async with db.engine.connect() as conn:
            assert (await conn.exec_driver_sql("SELECT count(*) FROM usage_records")).scalar() == 2
        await asyncio.to_thread(migrate.upgrade, empty_url)
        await check_schema(db.engine)
    finally:
        await db.dispose()


async def test_0012_widens_the_token_counts_keeping_the_rows_and_refuses_a_lossy_downgrade(empty_url: str) -> None:
    """Upgraded from 0011 with rows in ``usage_records``, the token counts hold 64 bits on PostgreSQL
    (SQLite's INTEGER always did: the step changes nothing there) and the rows stay; the downgrade
    refuses, saying why, while a count does not fit 32 bits, and goes through once none is left."""
    big = 3_000_000_000
    await asyncio.to_thread(migrate.upgrade, empty_url, "0011_schema_compatibility")
    db = Database.from_url(empty_url)
    insert = ("INSERT INTO usage_records (request_id, key_id, model, endpoint, stream, prompt_tokens, "
              "completion_tokens, cached_tokens, exact, cost, status, latency_ms, started_at) VALUES "
              "('{}', 'k', 'm', 'chat.completions', false, {}, {}, {}, true, 0.0, 200, 0.0, "
              "'2026-12-07 00:00:00+00:00')")
    counts = "SELECT request_id, prompt_tokens, completion_tokens, cached_tokens FROM usage_records ORDER BY 1"
    try:
        async with db.engine.begin() as conn:
            await conn.exec_driver_sql(insert.format("r1", 2**31 - 1, 7, 3))
        await asyncio.to_thread(migrate.upgrade, empty_url)
        if db.dialect == "postgresql":
            columns: dict[str, Any] = await _usage_columns(empty_url)
            assert {str(columns[c]["type"]) for c in ("prompt_tokens", "completion_tokens", "cached_tokens")} == {
                "BIGINT"}
        async with db.engine.begin() as conn:
            await conn.exec_driver_sql(insert.format("r2", big, big + 1, big + 2))
            assert [tuple(r) for r in (await conn.exec_driver_sql(counts)).all()] == [
                ("r1", 2**31 - 1, 7, 3), ("r2", big, big + 1, big + 2)]
        if db.dialect == "postgresql":
            with pytest.raises(RuntimeError, match=r"cannot downgrade below 0012.*1 usage_records row"):
                await asyncio.to_thread(migrate.downgrade, empty_url, "0011_schema_compatibility")
            await check_schema(db.engine)  # the refused downgrade left the schema at the head
            async with db.engine.begin() as conn:
                await conn.exec_driver_sql("DELETE FROM usage_records WHERE request_id = 'r2'")
        await asyncio.to_thread(migrate.downgrade, empty_url, "0011_schema_compatibility")
        await db.engine.dispose()  # asyncpg's statements prepared on the wider columns are stale now
        async with db.engine.connect() as conn:
            kept = [tuple(r) for r in (await conn.exec_driver_sql(counts)).all()]
        assert kept[0] == ("r1", 2**31 - 1, 7, 3) and len(kept) == (1 if db.dialect == "postgresql" else 2)
        await asyncio.to_thread(migrate.upgrade, empty_url)
        await check_schema(db.engine)
    finally:
        await db.dispose()


async def test_0013_widens_the_response_ids_keeping_the_rows_and_refuses_a_lossy_downgrade(empty_url: str) -> None:
    """Upgraded from 0012 with a row in ``stored_responses``, its ids hold any length (an upstream's
    are not bounded) and the row stays; the downgrade refuses, saying why, while an id is longer
    than 80 characters, and goes through once none is."""
    await asyncio.to_thread(migrate.upgrade, empty_url, "0012_usage_token_counts_bigint")
    db = Database.from_url(empty_url)
    insert = ("INSERT INTO stored_responses (id, owner, created_at, model, previous_response_id, "
              "upstream_previous_id, input_items, context, response) VALUES ('{}', 'ten_1', "
              "'2026-12-07 00:00:00+00:00', 'm', {}, {}, '[]', '[]', '{{}}')")
    ids = "SELECT id, previous_response_id, upstream_previous_id FROM stored_responses ORDER BY 1"
    long_id = "resp_" + "x" * 200
    try:
        async with db.engine.begin() as conn:
            await conn.exec_driver_sql(insert.format("resp_1", "NULL", "NULL"))
        await asyncio.to_thread(migrate.upgrade, empty_url)
        async with db.engine.begin() as conn:
            await conn.exec_driver_sql(insert.format(long_id, f"'{long_id}'", f"'{long_id}'"))
            assert [tuple(r) for r in (await conn.exec_driver_sql(ids)).all()] == [
                ("resp_1", None, None), (long_id, long_id, long_id)]
        with pytest.raises(RuntimeError, match=r"cannot downgrade below 0013.*1 stored_responses row"):
            await asyncio.to_thread(migrate.downgrade, empty_url, "0012_usage_token_counts_bigint")
        # the refused downgrade left the schema at 0013 at least (0014's downgrade ran first on SQLite)
        await asyncio.to_thread(migrate.upgrade, empty_url)
        await check_schema(db.engine)
        async with db.engine.begin() as conn:
            await conn.exec_driver_sql(f"DELETE FROM stored_responses WHERE id = '{long_id}'")
        await asyncio.to_thread(migrate.downgrade, empty_url, "0012_usage_token_counts_bigint")
        await db.engine.dispose()  # asyncpg's statements prepared on the wider columns are stale now
        async with db.engine.connect() as conn:
            assert [tuple(r) for r in (await conn.exec_driver_sql(ids)).all()] == [("resp_1", None, None)]
        await asyncio.to_thread(migrate.upgrade, empty_url)
        await check_schema(db.engine)
    finally:
        await db.dispose()


async def test_0016_keys_tenant_names_and_refuses_names_that_would_be_one(empty_url: str) -> None:
    """Upgraded from 0015 with tenants whose names differ only in case or Unicode form, the upgrade
    refuses, listing them with their ids, and changes nothing; once they are renamed it goes through,
    keeping every tenant, its name as it was and its keys, and a twin name is refused by the database."""
    await asyncio.to_thread(migrate.upgrade, empty_url, "0015_responses_unsettled")
    db = Database.from_url(empty_url)
    tenant = ("INSERT INTO tenants (id, name, status, weight, created_at) VALUES ('{}', '{}', 'active', 1.0, "
              "'2026-12-0{} 00:00:00+00:00')")
    key = ("INSERT INTO api_keys (id, tenant_id, name, prefix, key_hash, is_admin, created_at) VALUES "
           "('key_1', 'ten_b', '', 'sk-sy-x', 'h', false, '2026-12-01 00:00:00+00:00')")
    try:
        async with db.engine.begin() as conn:
            for n, (tid, name) in enumerate([("ten_a", "Acme"), ("ten_b", "ＡＣＭＥ"), ("ten_c", "acme\u200b"),
                                             ("ten_d", "Solo"), ("ten_e", "solo "), ("ten_f", "Other")]):
                await conn.exec_driver_sql(tenant.format(tid, name, n + 1))
            await conn.exec_driver_sql(key)
        with pytest.raises(RuntimeError, match=r"cannot upgrade to 0016.*2 group\(s\).*'Acme' \(ten_a\), "
                                               r"'ＡＣＭＥ' \(ten_b\), 'acme\\\\u200b' \(ten_c\); 'Solo' \(ten_d\)"):
            await asyncio.to_thread(migrate.upgrade, empty_url)
        async with db.engine.begin() as conn:
            assert (await conn.exec_driver_sql("SELECT version_num FROM alembic_version")).scalar_one() == (
                "0015_responses_unsettled")
            await conn.exec_driver_sql("UPDATE tenants SET name = 'Acme 2' WHERE id = 'ten_b'")
            await conn.exec_driver_sql("UPDATE tenants SET name = 'Acme 3' WHERE id = 'ten_c'")
            await conn.exec_driver_sql("UPDATE tenants SET name = 'Solo 2' WHERE id = 'ten_e'")
        await asyncio.to_thread(migrate.upgrade, empty_url)
        await check_schema(db.engine)
        await db.engine.dispose()
        async with db.engine.begin() as conn:
            rows = (await conn.exec_driver_sql("SELECT id, name, name_key FROM tenants ORDER BY id")).all()
            assert [tuple(r) for r in rows] == [("ten_a", "Acme", "acme"), ("ten_b", "Acme 2", "acme 2"),
                                                ("ten_c", "Acme 3", "acme 3"), ("ten_d", "Solo", "solo"),
                                                ("ten_e", "Solo 2", "solo 2"), ("ten_f", "Other", "other")]
            assert (await conn.exec_driver_sql("SELECT tenant_id FROM api_keys")).scalar_one() == "ten_b"
        with pytest.raises(IntegrityError):
            async with db.engine.begin() as conn:
                await conn.exec_driver_sql("INSERT INTO tenants (id, name, name_key, status, weight, created_at) "
                                           "VALUES ('ten_g', 'ACME', 'acme', 'active', 1.0, '2026-12-09')")
        await asyncio.to_thread(migrate.downgrade, empty_url, "0015_responses_unsettled")
        await asyncio.to_thread(migrate.upgrade, empty_url)
        await check_schema(db.engine)
    finally:
        await db.dispose()


async def test_0017_adds_and_drops_the_metering_lease_keeping_unsettled_responses(empty_url: str) -> None:
    """A background response not metered yet stays so through the upgrade (never claimed) and the
    downgrade (still unsettled: the previous version meters it)."""
    await asyncio.to_thread(migrate.upgrade, empty_url, "0016_tenant_name_keys")
    db = Database.from_url(empty_url)
    row = ("INSERT INTO stored_responses (id, owner, created_at, model, deployment, input_items, context, response, "
           "unsettled) VALUES ('resp_1', 'ten_a', '2026-12-10 00:00:00+00:00', 'm', 'd', '[]', '[]', '{}', "
           "'{\"key_id\": \"key_1\"}')")
    read = "SELECT id, unsettled FROM stored_responses"
    try:
        async with db.engine.begin() as conn:
            await conn.exec_driver_sql(row)
        await asyncio.to_thread(migrate.upgrade, empty_url)
        await check_schema(db.engine)
        await db.engine.dispose()
        async with db.engine.begin() as conn:
            assert (await conn.exec_driver_sql("SELECT metering_until FROM stored_responses")).scalar_one() is None
            await conn.exec_driver_sql("UPDATE stored_responses SET metering_until = 1.5e9")
        await asyncio.to_thread(migrate.downgrade, empty_url, "0016_tenant_name_keys")
        await db.engine.dispose()
        async with db.engine.begin() as conn:
            got = tuple((await conn.exec_driver_sql(read)).one())
            assert "metering_until" not in (await conn.run_sync(
                lambda c: {col["name"] for col in inspect(c).get_columns("stored_responses")}))
        assert got[0] == "resp_1" and got[1] is not None
        await asyncio.to_thread(migrate.upgrade, empty_url)
        await check_schema(db.engine)
    finally:
        await db.dispose()


async def test_a_progress_line_that_cannot_be_written_leaves_the_migration_whole(empty_url: str) -> None:
    """``switchyard db upgrade 2>&1 | head -3``: once head has exited, writing a progress line fails
    (EPIPE). That failure came between a migration's DDL and its version stamp: on SQLite, whose DDL
    alembic does not wrap in a transaction, the database was left half-migrated, and every later
    upgrade failed on a table or index that already existed."""
    shown: list[str] = []

    def report(line: str) -> None:
        shown.append(line)
        if len(shown) > 2:
            raise BrokenPipeError(32, "Broken pipe")

    assert await asyncio.to_thread(migrate.upgrade, empty_url, "head", report) == migrate.head_revision()
    assert len(shown) > 3  # every step was still offered to the report
    await _assert_at_head(empty_url)


def test_db_commands_say_the_revision_reached_and_refuse_an_empty_one(tmp_path: Path) -> None:
    """``db upgrade --revision 0005_audit`` on a newer database changes nothing: it once said the
    database was "at revision 0005_audit" (and ``db downgrade --revision head`` "downgraded to head");
    an empty ``--revision`` was an ``AssertionError`` with no word of what was wrong."""
    config = tmp_path / "conf.yaml"
    config.write_text(f"database:\n  url: sqlite+aiosqlite:///{tmp_path / 'rev.db'}\n")
    env = {k: None for k in os.environ if k.startswith("SWITCHYARD")}

    def run(*args: str) -> Any:
        return CliRunner().invoke(app, ["db", *args, "--config", str(config)], env=env)

    head = migrate.head_revision()
    for args, reached in ((("upgrade",), head), (("upgrade", "--revision", "0005_audit"), head),
                          (("downgrade", "--revision", "head"), head), (("downgrade", "--revision", "0005_audit"),
                                                                        "0005_audit"),
                          (("downgrade", "--revision", "base"), "(empty)")):
        done = run(*args)
        assert done.exit_code == 0, done.stderr
        assert done.stdout.strip().endswith(f"is at revision {reached}"), (args, done.stdout)
    for command in ("upgrade", "downgrade"):
        done = run(command, "--revision", "")
        assert done.exit_code == 1 and done.stderr.startswith("error: --revision is empty"), done.stderr
        assert done.stderr.count("\n") == 1 and "AssertionError" not in done.stderr, done.stderr


def test_db_upgrade_piped_into_head_migrates_the_whole_way(tmp_path: Path) -> None:
    """``switchyard db upgrade 2>&1 | head -2``: Rich ends the process at the first line it cannot
    write (EPIPE once head has gone), and that line comes between a migration's DDL and its version
    stamp: the SQLite database was left half-migrated, every later upgrade failing on an index that
    already existed."""
    config = tmp_path / "conf.yaml"
    config.write_text(f"database:\n  url: sqlite+aiosqlite:///{tmp_path / 'piped.db'}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD")}
    read, write = os.pipe()
    upgrade = subprocess.Popen([str(Path(sys.executable).parent / "switchyard"), "db", "upgrade", "--config",
                                str(config)], stdout=subprocess.DEVNULL, stderr=write, env=env)
    os.close(write)
    with os.fdopen(read) as lines:  # head: two lines, then gone
        assert lines.readline().startswith("migrating ") and lines.readline().startswith("  applied 0001")
    assert upgrade.wait(timeout=60) == 0
    done = CliRunner().invoke(app, ["db", "current", "--json", "--config", str(config)],
                              env={k: None for k in os.environ if k.startswith("SWITCHYARD")})
    assert done.exit_code == 0 and '"up_to_date": true' in done.stdout, (done.stdout, done.stderr)


_KILLED_AT = """
import os, signal, sys
from gateway.db import migrate
url, victim = sys.argv[1:]
def report(line: str) -> None:
    if line.startswith(f"applied {victim}:"):  # after the step's DDL and version stamp, before its commit
        os.kill(os.getpid(), signal.SIGKILL)
migrate.upgrade(url, "head", report)
"""


@pytest.mark.parametrize("victim", ["0005_audit", "0013_responses_ids_text", "0016_tenant_name_keys"])
async def test_a_process_killed_inside_a_migration_step_leaves_the_previous_revision(
    empty_url: str, victim: str
) -> None:
    """A step is its DDL and its version stamp, in one transaction: SQLite's DDL ran outside any
    (alembic does not wrap it, pysqlite does not begin before DDL), so a process killed inside a step
    left its tables and indexes without the stamp, and every later upgrade failed on one that already
    existed. 0005 creates tables and indexes; 0013 and 0016 recreate tables in batch mode. PostgreSQL
    runs the whole upgrade in one transaction: it is left empty."""
    killed = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", _KILLED_AT, empty_url, victim],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -9, killed.stderr
    step = migrate.script_directory().get_revision(victim)
    previous = step.down_revision if empty_url.startswith("sqlite") else None
    assert await asyncio.to_thread(migrate.current_revision, empty_url) == previous
    assert await asyncio.to_thread(migrate.upgrade, empty_url) == migrate.head_revision()
    await _assert_at_head(empty_url)
