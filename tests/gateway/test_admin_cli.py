"""The admin CLI against a config file, on SQLite and PostgreSQL: the real typer app, invoked
in-process (a subprocess per command would cost a second of imports each; test_migrations runs
the installed `switchyard` executable itself)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gateway.cli import app
from gateway.contracts import UsageRecord
from gateway.db import Database, migrate
from gateway.usage.pricing import PriceTable
from gateway.usage.writer import UsageWriter
from tests.gateway.tenancy_fixtures import drop_pg_database, new_pg_database


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


class Cli:
    def __init__(self, config: Path, cwd: Path) -> None:
        self.env = {"SWITCHYARD_CONFIG": str(config)}
        self.cwd = cwd

    def __call__(self, *args: str, ok: bool = True) -> Done:
        result = CliRunner().invoke(app, list(args), env=self.env)
        done = Done(result.exit_code, result.stdout, result.stderr)
        if ok:
            assert done.returncode == 0, (done.stderr, result.exception)
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "--json").stdout)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
async def cli(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    workdir = tmp_path_factory.mktemp("cli")
    name = None
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{workdir / 'cli.db'}"
    else:
        name, url = await new_pg_database()
    config = workdir / "switchyard.yaml"
    config.write_text(f"database:\n  url: {url}\nprices:\n  m: {{input_per_million: 1.0, output_per_million: 2.0}}\n")
    await asyncio.to_thread(migrate.upgrade, url)  # each test can run alone, without another's bootstrap
    yield Cli(config, workdir), url
    if name:
        await drop_pg_database(name)


def test_bootstrap_once_then_tenants_keys_limits(cli: tuple[Cli, str]) -> None:
    run, _ = cli
    first = run.json("bootstrap")
    assert first["created"] and first["secret"].startswith("sk-sy-")
    assert run.json("bootstrap") == {"created": False, "tenant_id": None, "key_id": None, "secret": None}
    tenant = run.json("tenant", "create", "acme", "--weight", "2")
    assert tenant["name"] == "acme" and tenant["weight"] == 2.0
    assert {t["name"] for t in run.json("tenant", "list")} == {"default", "acme"}
    dup = run("tenant", "create", "acme", ok=False)
    assert dup.returncode == 1 and "already exists" in dup.stderr

    key = run.json("key", "create", "--tenant", "acme", "--model", "m", "--name", "ci")
    assert key["key"].startswith("sk-sy-") and key["allowed_models"] == ["m"]
    table = run("key", "list", "--tenant", "acme").stdout
    assert key["prefix"] in table and key["key"] not in table  # shown once, never again
    rotated = run.json("key", "rotate", key["id"], "--grace-hours", "1")
    assert rotated["rotated_from"] == key["id"] and rotated["key"] != key["key"]
    assert run.json("key", "revoke", key["id"])["status"] == "revoked"
    statuses = {k["id"]: k["status"] for k in run.json("key", "list", "--tenant", "acme")}
    assert statuses == {key["id"]: "revoked", rotated["id"]: "active"}

    limits = run.json("limits", "set", "--tenant", "acme", "--rpm", "60", "--tpm", "20000", "--period", "day")
    assert (limits["requests_per_minute"], limits["tokens_per_minute"], limits["budget_period"]) == (60, 20000, "day")
    limits = run.json("limits", "set", "--tenant", "acme", "--rpm", "-1", "--cost-budget", "25")
    assert (
        limits["requests_per_minute"] is None and limits["tokens_per_minute"] == 20000 and limits["cost_budget"] == 25
    )
    assert run.json("limits", "show", "--key", rotated["id"])["max_concurrency"] is None
    shown = run.json("tenant", "show", "acme")
    assert shown["limits"]["tokens_per_minute"] == 20000 and len(shown["keys"]) == 2

    assert run.json("tenant", "disable", "acme")["status"] == "disabled"
    for bad, message in (
        (("tenant", "show", "nope"), "no tenant"),
        (("limits", "show"), "exactly one of --tenant or --key"),
        (("limits", "set", "--tenant", "default", "--period", "week"), "--period must be day, month or total"),
        (("key", "create"), "exactly one of"),
        (("usage", "report", "--start", "yesterday"), "start must be a date"),
        (("usage", "report", "--by", "colour"), "cannot group by"),
        (("usage", "report", "--start", "2026-02-01", "--end", "2026-01-01"), "--start must be before --end"),
        (("limits", "set", "--tenant", "default", "--rpm", "99999999999"), "--rpm must be -1 (no limit) or lie "
                                                                            "in [0, 2147483647], got 99999999999"),
        (("limits", "set", "--tenant", "default", "--cost-budget", "nan"), "--cost-budget must be -1"),
        (("limits", "set", "--tenant", "default", "--rpm", "-5"), "--rpm must be -1 (no limit)"),
    ):
        done = run(*bad, ok=False)
        assert done.returncode != 0 and message in done.stderr, (bad, done.stderr)
        assert "Traceback" not in done.stderr


def test_usage_report_formats_and_range(cli: tuple[Cli, str]) -> None:
    run, url = cli
    tenant = run.json("tenant", "create", f"u-{uuid.uuid4().hex[:6]}")

    async def write() -> None:
        db = Database.from_url(url)
        writer = UsageWriter(db, PriceTable.from_config({}), journal_dir=run.cwd / "journal")
        day = 1_767_225_600.0  # 2026-01-01
        for i in range(3):
            writer.record(UsageRecord(
                request_id=uuid.uuid4().hex, key_id="k", tenant_id=tenant["id"], model="m", deployment="d",
                provider="openai", endpoint="chat.completions", started_at=day + i * 86400, status=200,
                prompt_tokens=10, completion_tokens=5, cost=0.5,
            ))  # fmt: skip
        await writer.aclose()
        await db.dispose()

    asyncio.run(write())
    rows = run.json("usage", "report", "--tenant", tenant["name"], "--by", "day")
    assert [(r["day"], r["requests"]) for r in rows] == [("2026-01-01", 1), ("2026-01-02", 1), ("2026-01-03", 1)]
    ranged = run.json(
        "usage", "report", "--tenant", tenant["id"], "--by", "model", "--start", "2026-01-02", "--end", "2026-01-02"
    )
    assert ranged == [{"model": "m", "requests": 1, "errors": 0, "prompt_tokens": 10, "completion_tokens": 5,
                       "cached_tokens": 0, "total_tokens": 15, "cost": 0.5}]  # fmt: skip
    out = run("usage", "report", "--tenant", tenant["id"], "--by", "tenant,model", "--format", "csv").stdout
    assert list(csv.DictReader(io.StringIO(out))) == [{
        "tenant": tenant["id"], "model": "m", "requests": "3", "errors": "0", "prompt_tokens": "30",
        "completion_tokens": "15", "cached_tokens": "0", "total_tokens": "45", "cost": "1.5",
    }]  # fmt: skip
    assert tenant["id"] in run("usage", "report", "--by", "tenant").stdout


def test_usage_csvs_quote_what_a_spreadsheet_would_run_as_a_formula(cli: tuple[Cli, str]) -> None:
    """Text a client, tenant or upstream controls (here a model and a service tier) that starts a
    formula gets a leading quote in both CSVs; numbers (a negative one too) are written as they are."""
    run, url = cli
    tenant = run.json("tenant", "create", f"f-{uuid.uuid4().hex[:6]}")
    hostile = ("=HYPERLINK(\"http://x\")", "+1+1", "-2+3", "@SUM(A1)", "\tcmd", "\rcmd")

    async def write() -> None:
        db = Database.from_url(url)
        writer = UsageWriter(db, PriceTable.from_config({}), journal_dir=run.cwd / "journal-f")
        for i, text in enumerate(hostile):
            writer.record(UsageRecord(
                request_id=uuid.uuid4().hex, key_id="k", tenant_id=tenant["id"], model=text, deployment="d",
                provider="openai", endpoint="chat.completions", started_at=1_767_225_600.0 + i, status=200,
                prompt_tokens=10, completion_tokens=5, cost=-0.25, service_tier=text, upstream_request_id=text,
            ))  # fmt: skip
        await writer.aclose()
        await db.dispose()

    asyncio.run(write())
    span = ("--tenant", tenant["id"], "--start", "2026-01-01", "--end", "2026-01-01")
    report = run("usage", "report", *span, "--by", "model", "--format", "csv").stdout
    report = list(csv.DictReader(io.StringIO(report, newline="")))
    assert sorted(r["model"] for r in report) == sorted("'" + t for t in hostile)
    assert {r["cost"] for r in report} == {"-0.25"}
    export = list(csv.DictReader(io.StringIO(run("usage", "export", *span).stdout, newline="")))
    assert [(r["model"], r["service_tier"], r["upstream_request_id"]) for r in export] == [
        ("'" + t, "'" + t, "'" + t) for t in hostile]
    assert {(r["cost"], r["prompt_tokens"]) for r in export} == {("-0.25", "10")}


def test_usage_report_shows_a_cheap_models_cost_as_the_rows_sum(cli: tuple[Cli, str]) -> None:
    """Requests of a fraction of a microdollar (7.5e-08 and 1.5e-09) sum to 7.65e-08 in every
    format, as the export's rows say; not 7e-08, nor the table's 0.00000008."""
    run, url = cli
    tenant = run.json("tenant", "create", f"c-{uuid.uuid4().hex[:6]}")

    async def write() -> None:
        db = Database.from_url(url)
        writer = UsageWriter(db, PriceTable.from_config({}), journal_dir=run.cwd / "journal-c")
        for i, cost in enumerate((7.5e-8, 1.5e-9)):
            writer.record(UsageRecord(
                request_id=uuid.uuid4().hex, key_id="k", tenant_id=tenant["id"], model="cheap", deployment="d",
                provider="openai", endpoint="chat.completions", started_at=1_767_225_600.0 + i, status=200,
                prompt_tokens=1, completion_tokens=0, cost=cost,
            ))  # fmt: skip
        await writer.aclose()
        await db.dispose()

    asyncio.run(write())
    span = ("--tenant", tenant["id"], "--start", "2026-01-01", "--end", "2026-01-01", "--by", "model")
    assert [r["cost"] for r in run.json("usage", "report", *span)] == [7.65e-8]
    csv_rows = list(csv.DictReader(io.StringIO(run("usage", "report", *span, "--format", "csv").stdout)))
    assert [r["cost"] for r in csv_rows] == ["0.0000000765"]
    assert "0.0000000765" in run("usage", "report", *span).stdout.replace("\n", "").replace(" ", "")
    export = list(csv.DictReader(io.StringIO(run("usage", "export", *span[:6]).stdout)))
    assert sorted(r["cost"] for r in export) == ["0.0000000015", "0.000000075"]
