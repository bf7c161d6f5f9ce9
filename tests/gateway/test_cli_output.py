"""The CLI as a user meets it: the installed ``switchyard`` never prints a traceback, but one line
with the fix (unmigrated or unreachable database, unknown tenant, bad duration); tables fit 80
columns with identifiers whole; ``--json`` on every listing; ``usage export`` writes CSV with a
progress line; migrations say what they applied."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import subprocess
import sys
import uuid
from functools import partial
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from gateway.cli import app
from gateway.cli.errors import DEBUG_ENV, GuardedTyper, explain
from gateway.contracts import UsageRecord
from gateway.db import Database
from gateway.usage.pricing import PriceTable
from gateway.usage.writer import UsageWriter
from tests.support.concurrent import concurrently

SWITCHYARD = str(Path(sys.executable).parent / "switchyard")
UNREACHABLE = "postgresql+asyncpg://postgres@127.0.0.1:9/test"  # the discard port: refused at once
ENV = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD")}


def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SWITCHYARD, *args], cwd=cwd, env=ENV | (env or {}), capture_output=True, text=True,
                          timeout=60)


def one_line_error(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def config_for(tmp_path: Path, url: str, name: str = "c.yaml") -> str:
    path = tmp_path / name
    path.write_text(f"database:\n  url: {url}\nmodels: []\n")
    return str(path)


def test_common_mistakes_end_in_one_line_with_the_fix(tmp_path: Path) -> None:
    fresh = config_for(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}", "fresh.yaml")
    gone = config_for(tmp_path, UNREACHABLE, "gone.yaml")
    # serve on a database that was never migrated: no ExceptionGroup, the command to run
    mistakes = (
        (("serve", "--config", fresh, "--port", "0"), ("never migrated", "switchyard db upgrade")),
        (("serve", "--config", gone, "--port", "0"), ("cannot reach the database", "database.url")),
        (("tenant", "list", "--config", gone), ("cannot reach the database",)),
        (("tenant", "list", "--config", fresh), ("switchyard db upgrade",)),
        (("db", "current", "--config", gone), ("cannot reach the database",)),
    )
    for (_, needles), done in zip(mistakes, concurrently(*(partial(run, *args, cwd=tmp_path)
                                                           for args, _ in mistakes)), strict=True):
        one_line_error(done, *needles)

    up = run("db", "upgrade", "--config", fresh, cwd=tmp_path)
    assert up.returncode == 0 and "applied 0001" in up.stderr and "Traceback" not in up.stderr

    # the same mistakes in-process (these paths never reach the guard, they end in `fail`)
    runner, env = CliRunner(), {"SWITCHYARD_CONFIG": fresh}
    for args, needles in (
        (("tenant", "show", "nope"), ("no tenant 'nope'", "switchyard tenant list")),
        (("usage", "report", "--since", "7x"), ("not a duration", "24h")),
        (("usage", "export", "--since", "-3d"), ("not a duration",)),
        (("usage", "report", "--start", "last tuesday"), ("start must be a date",)),
        (("db", "upgrade", "--revision", "nope"), ("Can't locate revision", "nope")),
    ):
        done = runner.invoke(app, list(args), env=env)
        last = done.stderr.strip().splitlines()[-1]
        assert done.exit_code == 1 and last.startswith("error: ") and "Traceback" not in done.stderr, done.stderr
        assert all(n in last for n in needles), (args, last)

    # 80 columns, identifiers whole, even with long names
    tenant = json.loads(runner.invoke(app, ["tenant", "create", "a-tenant-with-a-rather-long-name-indeed",
                                            "--json"], env=env).stdout)
    for _ in range(2):
        runner.invoke(app, ["key", "create", "--tenant", tenant["id"], "--name", "the production backend of the "
                            "web shop", "--model", "gpt-4o-mini", "--expires-in-days", "30"], env=env)
    keys = json.loads(runner.invoke(app, ["key", "list", "--json"], env=env).stdout)
    assert len(keys) == 2
    listings = ((("tenant", "list"), "80"), (("key", "list"), "80"), (("key", "list"), None),
                (("tenant", "show", tenant["id"]), "80"))
    outs = concurrently(*(partial(run, *args, "--config", fresh, cwd=tmp_path,
                                  env={"COLUMNS": columns} if columns else None) for args, columns in listings))
    for (args, _), done in zip(listings, outs, strict=True):
        out = done.stdout
        assert out and max(len(line) for line in out.splitlines()) <= 80, out
        assert tenant["id"] in out and (args[0] == "tenant" and args[1] == "list" or all(k["id"] in out
                                                                                          for k in keys)), out


def test_debugging_shows_the_traceback_of_a_common_mistake(tmp_path: Path) -> None:
    """README: a mistake ends in one line, never a traceback (``SWITCHYARD_DEBUG=1`` shows one): the
    explained mistakes too, not only the unexpected ones."""
    fresh = config_for(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}", "fresh.yaml")
    gone = config_for(tmp_path, UNREACHABLE, "gone.yaml")
    debug = {DEBUG_ENV: "1"}
    mistakes = (("tenant", "list", "--config", gone), ("tenant", "list", "--config", fresh),
                ("db", "current", "--config", gone), ("db", "upgrade", "--config", gone),
                ("bootstrap", "--config", gone), ("serve", "--config", gone, "--port", "0"))
    # without it: the one line. The first three and serve are asserted (as exactly one line) by
    # test_common_mistakes_end_in_one_line_with_the_fix; the two left run here.
    plain_ones = mistakes[3:5]
    runs = concurrently(*(partial(run, *args, cwd=tmp_path, env=debug) for args in mistakes),
                        *(partial(run, *args, cwd=tmp_path) for args in plain_ones))
    for args, done in zip(mistakes, runs[:len(mistakes)], strict=True):
        assert done.returncode != 0 and "Traceback (most recent call last)" in done.stderr, (args, done.stderr)
    for plain in runs[len(mistakes):]:
        assert plain.stderr.splitlines()[-1].startswith("error: ") and "Traceback" not in plain.stderr, plain.stderr
    runner = CliRunner()
    invoked = runner.invoke(app, ["tenant", "show", "nope"], env={"SWITCHYARD_CONFIG": fresh, **debug})
    assert invoked.exception is not None and not isinstance(invoked.exception, SystemExit), invoked.stderr


def test_an_unexpected_error_is_one_line_unless_debugging(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    guarded = GuardedTyper()

    @guarded.command()
    def boom() -> None:
        raise RuntimeError("the flux capacitor\nis out of flux")

    @guarded.command()
    def other() -> None: ...

    with pytest.raises(SystemExit) as exit_:
        guarded(["boom"], prog_name="switchyard")
    assert exit_.value.code == 1
    assert capsys.readouterr().err == (f"error: RuntimeError: the flux capacitor (set {DEBUG_ENV}=1 to see the "
                                       "traceback)\n")
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(RuntimeError):
        guarded(["boom"], prog_name="switchyard")
    assert isinstance(app, typer.Typer) and isinstance(app, GuardedTyper)  # the installed command is guarded


@pytest.fixture
def local(tmp_path: Path) -> tuple[dict[str, str], str, str]:
    """A migrated SQLite database with two tenants' usage; the env for CliRunner."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'u.db'}"
    env = {"SWITCHYARD_CONFIG": config_for(tmp_path, url), "SWITCHYARD__USAGE__JOURNAL_DIR": str(tmp_path / "j")}
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"], env=env).exit_code == 0
    ids = [json.loads(runner.invoke(app, ["tenant", "create", f"t{i}-{uuid.uuid4().hex[:4]}", "--json"],
                                    env=env).stdout)["id"] for i in range(2)]

    async def write() -> None:
        db = Database.from_url(url)
        writer = UsageWriter(db, PriceTable(), journal_dir=tmp_path / "seed")
        import time

        for i in range(5):
            writer.record(UsageRecord(
                request_id=f"req-{i}", key_id="k", tenant_id=ids[i % 2], model="m", deployment="d",
                provider="openai", endpoint="chat.completions", started_at=time.time() - 3600 * i,
                status=200 if i != 3 else 429, error_type=None if i != 3 else "rate_limit_exceeded",
                prompt_tokens=10, completion_tokens=5, cost=0.25, latency_ms=120.0,
            ))  # fmt: skip
        await writer.aclose()
        await db.dispose()

    asyncio.run(write())
    return env, ids[0], ids[1]


def test_every_listing_has_json_and_export_writes_csv(local: tuple[dict[str, str], str, str], tmp_path: Path) -> None:
    env, first, second = local
    runner = CliRunner()
    for args in (("tenant", "list"), ("key", "list"), ("limits", "show", "--tenant", first),
                 ("usage", "report", "--since", "1d"), ("db", "current"), ("tenant", "show", first)):
        done = runner.invoke(app, [*args, "--json"], env=env)
        assert done.exit_code == 0, (args, done.stderr)
        json.loads(done.stdout)

    done = runner.invoke(app, ["usage", "export", "--since", "1d"], env=env)
    assert done.exit_code == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert sorted(r["request_id"] for r in rows) == [f"req-{i}" for i in range(5)]
    assert "exported 5 requests" in done.stderr and "exporting: 5 requests" in done.stderr
    assert [r["status"] for r in rows if r["error_type"]] == ["429"]

    out = tmp_path / "first.csv"
    done = runner.invoke(app, ["usage", "export", "--tenant", first, "--since", "2h", "-o", str(out)], env=env)
    assert done.exit_code == 0, done.stderr
    rows = list(csv.DictReader(out.open()))
    assert {r["request_id"] for r in rows} == {"req-0"} and f"to {out}" in done.stderr  # req-2 is 2 h old
    assert runner.invoke(app, ["usage", "export", "--tenant", "nobody"], env=env).exit_code == 1


def test_a_file_the_command_cannot_use_is_not_called_an_unreachable_database() -> None:
    """An OSError naming a file (an --output that is a folder, a path in the way) says so; one without a
    file name (a refused or unresolvable connection) is the database's."""
    assert explain(IsADirectoryError(21, "Is a directory", "/tmp/out"), UNREACHABLE) == "/tmp/out: Is a directory"
    assert explain(FileExistsError(17, "File exists", "/tmp/m")) == "/tmp/m: File exists"
    assert explain(OSError(111, "Connect call failed"), UNREACHABLE).startswith("cannot reach the database at ")


def test_a_full_disk_under_the_output_is_not_called_an_unreachable_database(tmp_path: Path) -> None:
    """A listing redirected onto a full disk, or ``usage export -o`` onto one, once said "cannot reach
    the database ...: [Errno 28] No space left on device. Check that it is running": the database is
    fine, the output's disk is full."""
    fresh = config_for(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'full.db'}")
    assert run("db", "upgrade", "--config", fresh, cwd=tmp_path).returncode == 0
    with open("/dev/full", "w") as full:
        listing = subprocess.run([SWITCHYARD, "tenant", "list", "--json", "--config", fresh], cwd=tmp_path, env=ENV,
                                 stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    export = run("usage", "export", "-o", "/dev/full", "--config", fresh, cwd=tmp_path)
    for done in (listing, export):
        assert done.returncode == 1 and done.stderr == "error: cannot write the output: No space left on device\n", \
            done.stderr



def test_an_output_whose_reader_has_gone_is_not_called_an_unreachable_database(tmp_path: Path) -> None:
    """``switchyard usage export | head``: once head has exited, the next write fails with EPIPE, which
    once read "cannot reach the database ...: [Errno 32] Broken pipe. Check that it is running". Every
    command ends there as Click ends the others: exit 1, nothing said (its reader is gone)."""
    fresh = config_for(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'pipe.db'}")
    assert run("db", "upgrade", "--config", fresh, cwd=tmp_path).returncode == 0
    for args in (("usage", "export"), ("tenant", "list", "--json"), ("usage", "report", "--format", "csv")):
        read, write = os.pipe()
        os.close(read)  # the reader is gone before the first line
        try:
            done = subprocess.run([SWITCHYARD, *args, "--config", fresh], cwd=tmp_path, env=ENV, stdout=write,
                                  stderr=subprocess.PIPE, text=True, timeout=60)
        finally:
            os.close(write)
        assert (done.returncode, done.stderr) == (1, ""), args
