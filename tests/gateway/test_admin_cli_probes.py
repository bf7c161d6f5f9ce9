"""Operator probes of the admin CLI: every listing's --json, and usage exports to a file, on SQLite
and PostgreSQL."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import uuid
from pathlib import Path

import pytest

from gateway.contracts import UsageRecord
from gateway.db import Database
from gateway.usage.pricing import PriceTable
from gateway.usage.writer import UsageWriter
from tests.gateway.test_admin_cli import Cli, cli  # noqa: F401

DAY = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def write_usage(url: str, journal: Path, tenant: str, times: list[float]) -> None:
    async def write() -> None:
        db = Database.from_url(url)
        writer = UsageWriter(db, PriceTable.from_config({}), journal_dir=journal)
        for at in times:
            writer.record(UsageRecord(
                request_id=uuid.uuid4().hex, key_id="k", tenant_id=tenant, model="m", deployment="d",
                provider="openai", endpoint="chat.completions", started_at=at, status=200,
                prompt_tokens=10, completion_tokens=5, cost=0.1,
            ))  # fmt: skip
        await writer.aclose()
        await db.dispose()

    asyncio.run(write())


def test_every_listing_prints_valid_json(cli: tuple[Cli, str]) -> None:
    run, _ = cli
    name = f"j-{uuid.uuid4().hex[:6]}"
    run.json("tenant", "create", name)
    for args in (("tenant", "list"), ("key", "list"), ("key", "list", "--tenant", name), ("tenant", "show", name),
                 ("limits", "show", "--tenant", name), ("audit", "list"),
                 ("usage", "report", "--start", "2001-01-01", "--end", "2001-01-01"),
                 ("usage", "report", "--format", "csv", "--start", "2001-01-01", "--end", "2001-01-01")):
        json.loads(run(*args, "--json").stdout)


def test_export_to_a_file_and_its_range(cli: tuple[Cli, str], tmp_path: Path) -> None:
    run, url = cli
    tenant = run.json("tenant", "create", f"e-{uuid.uuid4().hex[:6]}")
    write_usage(url, run.cwd / f"journal-{uuid.uuid4().hex}", tenant["id"], [DAY - 1, DAY, DAY + 86399, DAY + 86400])
    out = tmp_path / "acme.csv"
    run("usage", "export", "--tenant", tenant["name"], "--start", "2026-01-01", "--end", "2026-01-01", "-o", str(out))
    rows = list(csv.DictReader(io.StringIO(out.read_text(), newline="")))
    assert [r["started_at"][:19] for r in rows] == ["2026-01-01T00:00:00", "2026-01-01T23:59:59"]
    future = run("usage", "export", "--tenant", tenant["id"], "--start", "2026-01-01", "--end", "2099-01-01")
    assert len(list(csv.DictReader(io.StringIO(future.stdout, newline="")))) == 3
    empty = run("usage", "export", "--tenant", tenant["id"], "--start", "2001-01-01", "--end", "2001-01-02").stdout
    assert empty.startswith("request_id,") and len(empty.splitlines()) == 1


def test_a_failed_export_leaves_the_output_file_alone(cli: tuple[Cli, str], tmp_path: Path) -> None:
    """A typo in --tenant is one line on stderr; the file -o names keeps what it held."""
    run, _ = cli
    out = tmp_path / "acme.csv"
    out.write_text("last month's export\n")
    done = run("usage", "export", "--tenant", "no-such-tenant", "-o", str(out), ok=False)
    assert done.returncode == 1 and "no tenant" in done.stderr
    assert out.read_text() == "last month's export\n"


def test_report_totals_and_compact_end_dates(cli: tuple[Cli, str]) -> None:
    run, url = cli
    tenant = run.json("tenant", "create", f"r-{uuid.uuid4().hex[:6]}")
    write_usage(url, run.cwd / f"journal-{uuid.uuid4().hex}", tenant["id"], [DAY, DAY + 3600, DAY + 86400])
    span = ("--tenant", tenant["id"], "--start", "2026-01-01")
    by_day = run.json("usage", "report", *span, "--by", "day")
    total = run.json("usage", "report", *span, "--by", "")
    assert len(total) == 1 and total[0]["requests"] == sum(r["requests"] for r in by_day) == 3
    assert total[0]["cost"] == round(sum(r["cost"] for r in by_day), 8)
    assert run.json("usage", "report", *span, "--end", "2026-01-01", "--by", "day") == by_day[:1]
    sheet = run("usage", "report", *span, "--by", "model,day", "--format", "csv").stdout
    rows = list(csv.DictReader(io.StringIO(sheet, newline="")))
    assert [r["day"] for r in rows] == ["2026-01-01", "2026-01-02"] and rows[0]["requests"] == "2"
    empty = run("usage", "report", "--tenant", tenant["id"], "--start", "2001-01-01", "--end", "2001-01-02",
                "--by", "model,day", "--format", "csv").stdout
    assert empty.splitlines() == [",".join(["model", "day", "requests", "errors", "prompt_tokens",
                                            "completion_tokens", "cached_tokens", "total_tokens", "cost"])]


def test_an_export_to_a_path_it_cannot_write_names_the_path_not_the_database(cli: tuple[Cli, str],
                                                                             tmp_path: Path) -> None:
    run, _ = cli
    for target, why in ((tmp_path, "Is a directory"), (tmp_path / "none" / "x.csv", "No such file or directory")):
        done = run("usage", "export", "-o", str(target), ok=False)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(f"error: cannot write {target}: {why}"), done.stderr
        assert "database" not in done.stderr


@pytest.mark.parametrize(("args", "named"), [
    (["--since", "9999999w"], "--since: '9999999w' reaches before the year 1"),
    (["--end", "0001-01-01", "--since", "2d"], "--since: '2d' reaches before the year 1"),
])
def test_a_range_reaching_before_the_year_one_names_the_option(cli: tuple[Cli, str], args: list[str],
                                                                named: str) -> None:
    run, _ = cli
    for command in ("report", "export"):
        done = run("usage", command, *args, ok=False)
        assert done.returncode == 1 and done.stderr == f"error: {named}\n", done.stderr
    done = run("usage", "export", "--end", "0001-01-05", ok=False)  # the default range: 30 days before --end
    assert done.returncode == 1 and done.stderr.startswith("error: --end: ") and "give --start" in done.stderr, \
        done.stderr


def test_a_key_for_an_empty_model_name_is_refused(cli: tuple[Cli, str]) -> None:
    """``--model ""`` (an unset shell variable) once made a key that may call nothing, silently."""
    run, _ = cli
    tenant = run.json("tenant", "create", f"m-{uuid.uuid4().hex[:6]}")
    done = run("key", "create", "--tenant", tenant["id"], "--model", "m", "--model", "", ok=False)
    assert done.returncode == 1 and done.stderr == "error: models[1] is empty: name a model\n", done.stderr
    assert run.json("key", "list", "--tenant", tenant["id"]) == []


@pytest.mark.parametrize("days", ["1e-300", "0", str(0.5 / 86400)])
def test_a_key_that_would_expire_before_it_is_usable_is_refused(cli: tuple[Cli, str], days: str) -> None:
    """``--expires-in-days 1e-300`` once made a key that had expired before it was created."""
    run, _ = cli
    tenant = run.json("tenant", "create", f"e-{uuid.uuid4().hex[:6]}")
    done = run("key", "create", "--tenant", tenant["id"], "--expires-in-days", days, ok=False)
    assert done.returncode == 1 and done.stderr.startswith("error: --expires-in-days must "), done.stderr
    assert run.json("key", "list", "--tenant", tenant["id"]) == []
    key = run.json("key", "create", "--tenant", tenant["id"], "--expires-in-days", str(1 / 86400))
    assert key["expires_at"] > key["created_at"], key


def test_limits_set_without_a_limit_is_an_error_naming_the_options(cli: tuple[Cli, str]) -> None:
    """``limits set --tenant X`` with no limit once changed nothing and exited 0, silently."""
    run, _ = cli
    tenant = run.json("tenant", "create", f"l-{uuid.uuid4().hex[:6]}")
    for scope in (["--tenant", tenant["id"]], ["--tenant", tenant["id"], "--json"]):
        done = run("limits", "set", *scope, ok=False)
        assert done.returncode == 1 and done.stderr.startswith("error: "), done.stderr
        for option in ("--rpm", "--tpm", "--concurrency", "--token-budget", "--cost-budget", "--period"):
            assert option in done.stderr, done.stderr
    assert run.json("limits", "set", "--tenant", tenant["id"], "--rpm", "5")["requests_per_minute"] == 5


def test_a_usage_range_of_an_unknown_key_is_an_error_not_an_empty_range(cli: tuple[Cli, str], tmp_path: Path) -> None:
    """``--key`` with a mistyped id once read as "no usage in that range" (exit 0), as an unknown
    ``--tenant`` never did; an export to a file leaves the file alone."""
    run, _ = cli
    out = tmp_path / "keep.csv"
    out.write_text("last month's export\n")
    for args in (("report",), ("report", "--format", "csv"), ("export", "-o", str(out))):
        done = run("usage", *args, "--key", "key_nosuchkey", ok=False)
        assert done.returncode == 1 and done.stderr.startswith("error: no key 'key_nosuchkey'"), done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert out.read_text() == "last month's export\n"
    tenant = run.json("tenant", "create", f"k-{uuid.uuid4().hex[:6]}")
    key = run.json("key", "create", "--tenant", tenant["id"])
    assert run.json("usage", "report", "--key", key["id"], "--start", "2001-01-01", "--end", "2001-01-01") == []


def test_audit_of_an_unknown_key_is_an_error_and_the_config_admin_key_is_known(cli: tuple[Cli, str]) -> None:
    """``audit list --key`` with a mistyped id once printed "(none)" (exit 0), as ``usage --key`` no
    longer does; ``usage report --key admin:config`` (the config's admin key, which has no row, and
    whose usage the API reports) was "no key 'admin:config'"."""
    run, _ = cli
    done = run("audit", "list", "--key", "key_nosuchkey", ok=False)
    assert done.returncode == 1 and done.stderr == "error: no key 'key_nosuchkey' (see `switchyard key list`)\n", \
        done.stderr
    assert isinstance(run.json("audit", "list", "--key", "admin:config"), list)
    assert run.json("usage", "report", "--key", "admin:config", "--start", "2001-01-01", "--end", "2001-01-01") == []


def test_an_empty_tenant_or_key_filter_is_an_error_not_every_tenant(cli: tuple[Cli, str], tmp_path: Path) -> None:
    """``usage export --tenant "$TENANT" -o acme.csv`` with the variable unset once exported every
    tenant's requests (an empty ``--tenant`` read as no filter; ``audit list`` likewise), and an
    empty ``--key`` read as "no usage in that range"; ``key list --tenant ""`` was already refused."""
    run, url = cli
    tenant = run.json("tenant", "create", f"x-{uuid.uuid4().hex[:6]}")
    write_usage(url, run.cwd / f"journal-{uuid.uuid4().hex}", tenant["id"], [DAY])
    out = tmp_path / "acme.csv"
    for option, named in (("--tenant", "no tenant ''"), ("--key", "no key ''")):
        for args in (("usage", "report"), ("usage", "export", "-o", str(out)), ("audit", "list")):
            done = run(*args, option, "", ok=False)
            assert done.returncode == 1 and done.stderr.startswith(f"error: {named}"), (args, option, done.stderr)
    assert not out.exists()


def test_a_group_named_twice_is_one_column(cli: tuple[Cli, str]) -> None:
    """``--by tenant,day,tenant --format csv`` once wrote the tenant twice in the header and in every row."""
    run, url = cli
    tenant = run.json("tenant", "create", f"g-{uuid.uuid4().hex[:6]}")
    write_usage(url, run.cwd / f"journal-{uuid.uuid4().hex}", tenant["id"], [DAY])
    sheet = run("usage", "report", "--tenant", tenant["id"], "--by", "tenant,day,tenant", "--format", "csv").stdout
    assert sheet.splitlines()[0].split(",")[:3] == ["tenant", "day", "requests"]
    assert sheet.splitlines()[1].startswith(f"{tenant['id']},2026-01-01,1,")


def test_bootstrap_takes_a_tenant_named_default_in_another_case(tmp_path: Path) -> None:
    """A tenant "Default" made before the first bootstrap (no key yet) is the default tenant: bootstrap
    once failed creating "default" beside it (one name, a conflict), so `make run`, which runs it
    first, never started."""
    config = tmp_path / "boot.yaml"
    config.write_text(f"database:\n  url: sqlite+aiosqlite:///{tmp_path / 'boot.db'}\n")
    run = Cli(config, tmp_path)
    run("db", "upgrade")
    tenant = run.json("tenant", "create", "Default")
    boot = run.json("bootstrap")
    assert boot["created"] and boot["tenant_id"] == tenant["id"]
    assert [t["name"] for t in run.json("tenant", "list")] == ["Default"]
