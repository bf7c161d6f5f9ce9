"""Hostile numbers and text on the admin side (issue 22): the admin API on PostgreSQL answers a 400
naming the field and its range, and the `switchyard` CLI, run as a real process, prints one line and
exits non-zero (never a traceback) and never prints a tenant's chosen name raw to the terminal."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from functools import partial
from pathlib import Path

import httpx
import pytest
from click.testing import Result
from typer.testing import CliRunner

from gateway.cli import app
from gateway.db.names import name_key
from tests.gateway.tenancy_fixtures import migrated_pg_url, pg_admin_api  # noqa: F401  (fixtures)
from tests.support.concurrent import concurrently

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def admin(pg_admin_api: httpx.Client) -> httpx.Client:
    return pg_admin_api


@pytest.fixture(scope="module")
def tenant_id(admin: httpx.Client) -> str:
    response = admin.post("/admin/v1/tenants", json={"name": "hostile-numbers"})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _assert_400(response: httpx.Response, param: str) -> None:
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.text


@pytest.mark.parametrize(("field", "value"), [
    ("cost_budget", 1e308), ("cost_budget", 1e13), ("token_budget", 2**63), ("requests_per_minute", 2**31),
    ("max_concurrency", 2**40), ("tokens_per_minute", -1),
])
def test_limits_out_of_range_are_a_400_naming_the_field(admin: httpx.Client, tenant_id: str, field: str,
                                                        value: float) -> None:
    for method in ("PUT", "PATCH"):
        _assert_400(admin.request(method, f"/admin/v1/tenants/{tenant_id}/limits", json={field: value}), field)


def test_a_large_but_allowed_budget_keeps_the_tenant_serving(admin: httpx.Client, tenant_id: str) -> None:
    response = admin.patch(f"/admin/v1/tenants/{tenant_id}/limits", json={"cost_budget": 1e12})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(("body", "param"), [
    ({"expires_in_seconds": 1e300}, "expires_in_seconds"),
    ({"expires_in_seconds": 4e9}, "expires_in_seconds"),
    ({"expires_at": "9999-12-31T23:00:00-05:00"}, "expires_at"),
])
def test_key_expiry_out_of_range_is_a_400(admin: httpx.Client, tenant_id: str, body: dict[str, object],
                                          param: str) -> None:
    _assert_400(admin.post("/admin/v1/keys", json={"tenant_id": tenant_id, **body}), param)


def test_key_expiry_at_the_end_of_the_calendar_is_stored(admin: httpx.Client, tenant_id: str) -> None:
    response = admin.post("/admin/v1/keys", json={"tenant_id": tenant_id, "expires_at": "9999-12-31T00:00:00Z"})
    assert response.status_code == 201, response.text
    rotated = admin.post(f"/admin/v1/keys/{response.json()['id']}/rotate", json={"grace_seconds": 1e300})
    _assert_400(rotated, "grace_seconds")


def test_tenant_weight_out_of_range_is_a_400(admin: httpx.Client, tenant_id: str) -> None:
    _assert_400(admin.post("/admin/v1/tenants", json={"name": "heavy", "weight": 1e308}), "weight")
    _assert_400(admin.patch(f"/admin/v1/tenants/{tenant_id}", json={"weight": 1e308}), "weight")


@pytest.mark.parametrize("query", [
    {"start": "0001-01-01", "end": "9999-12-31"},
    {"end": "9999-12-31"},
    {"start": "9999-12-31"},
])
def test_usage_reports_accept_the_whole_calendar(admin: httpx.Client, query: dict[str, str]) -> None:
    response = admin.get("/admin/v1/usage", params=query)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("query", [{"end": "9999-12-31T23:00:00-05:00"}, {"start": "0001-01-01T00:00:00+05:00"},
                                   {"start": "10000-01-01"}])
def test_usage_report_dates_past_the_calendar_are_a_400(admin: httpx.Client, query: dict[str, str]) -> None:
    _assert_400(admin.get("/admin/v1/usage", params=query), next(iter(query)))


# ---------------------------------------------------------------- the CLI as a real process


def switchyard(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"SWITCHYARD_CONFIG": str(config), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", "from gateway.cli import app; app()", *args],
                          capture_output=True, text=True, env=env, cwd=config.parent, timeout=60)


def in_process(config: Path, *args: str) -> Result:
    """A step that sets up or reads back state, not the one under test: no process needed."""
    return CliRunner().invoke(app, list(args), env={"SWITCHYARD_CONFIG": str(config)})


def _one_line_error(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode != 0, done
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def cli_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("hostile-cli")
    config = work / "switchyard.yaml"
    config.write_text(f"database:\n  url: sqlite+aiosqlite:///{work / 'cli.db'}\n")
    assert switchyard(config, "db", "upgrade").returncode == 0
    return config


def test_cli_unreachable_database_is_one_line_and_exit_1(tmp_path: Path) -> None:
    config = tmp_path / "switchyard.yaml"
    config.write_text("database:\n  url: postgresql+asyncpg://nobody@127.0.0.1:9/nothing\n")
    for done in concurrently(*(partial(switchyard, config, *args)
                               for args in (["tenant", "list"], ["key", "list"], ["usage", "report"]))):
        _one_line_error(done, "database", "127.0.0.1:9")


def test_cli_out_of_range_numbers_are_one_line_errors(cli_config: Path) -> None:
    assert in_process(cli_config, "tenant", "create", "nums").exit_code == 0
    errors = (
        (("limits", "set", "--tenant", "nums", "--cost-budget", "1e308"), ("--cost-budget",)),
        (("limits", "set", "--tenant", "nums", "--token-budget", str(2**63)), ("--token-budget",)),
        (("key", "create", "--tenant", "nums", "--expires-in-days", "1e300"), ("--expires-in-days",)),
        (("limits", "set", "--tenant", "nums", "--period", "week"), ("--period", "week")),
        (("usage", "report", "--end", "9999-12-31T23:00:00-05:00"), ("end",)),
    )
    *done, allowed = concurrently(*(partial(switchyard, cli_config, *args) for args, _ in errors),
                                  partial(switchyard, cli_config, "usage", "report", "--end", "9999-12-31"))
    for (_, needles), result in zip(errors, done, strict=True):
        _one_line_error(result, *needles)
    assert allowed.returncode == 0


def test_cli_prints_tenant_names_with_escapes_shown_not_obeyed(cli_config: Path) -> None:
    """Such a name is refused now; one stored before (its row written here as an older version did)
    is still shown escaped."""
    evil = "evil\x1b]0;pwned\x07\x1b[2J[bold red]x\u202e"
    refused = switchyard(cli_config, "tenant", "create", evil)
    assert "\x1b" not in refused.stderr
    _one_line_error(refused, "U+001B")
    with sqlite3.connect(cli_config.parent / "cli.db") as conn:
        conn.execute("INSERT INTO tenants (id, name, name_key, status, weight, created_at) VALUES "
                     "('ten_evil', ?, ?, 'active', 1.0, '2026-12-09 00:00:00')", (evil, name_key(evil)))
    listed = switchyard(cli_config, "tenant", "list")
    assert listed.returncode == 0, listed.stderr
    assert "\x1b" not in listed.stdout and "\x07" not in listed.stdout and "\u202e" not in listed.stdout
    assert "\\x1b" in listed.stdout and "[bold red]x" in listed.stdout
    dup = switchyard(cli_config, "tenant", "create", "EVIL]0;PWNED[2J[BOLD RED]X")  # the same name, visibly
    assert "\x1b" not in dup.stderr
    _one_line_error(dup, "already exists", "\\x1b")


# ---------------------------------------------------------------- NUL characters, blank names


@pytest.mark.parametrize(("method", "path", "body", "param"), [
    ("POST", "/admin/v1/tenants", {"name": "a\x00b"}, "name"),
    ("PATCH", "/admin/v1/tenants/{tenant}", {"name": "a\x00b"}, "name"),
    ("POST", "/admin/v1/keys", {"tenant_id": "x\x00"}, "tenant_id"),
    ("POST", "/admin/v1/keys", {"tenant_id": "{tenant}", "models": ["ok", "m\x00"]}, "models[1]"),
    ("GET", "/admin/v1/tenants/ab%00", None, "tenant_id"),
    ("GET", "/admin/v1/tenants/ab%00/limits", None, "tenant_id"),
    ("GET", "/admin/v1/keys/ab%00", None, "key_id"),
    ("POST", "/admin/v1/keys/ab%00/revoke", None, "key_id"),
    ("GET", "/admin/v1/keys?tenant_id=%00", None, "tenant_id"),
    ("GET", "/admin/v1/usage?key_id=%00", None, "key_id"),
    ("GET", "/admin/v1/audit?client=%00", None, "client"),
])
def test_nul_anywhere_in_an_admin_request_is_a_400_naming_it(
    admin: httpx.Client, tenant_id: str, method: str, path: str, body: dict[str, object] | None, param: str,
) -> None:
    if body is not None:
        body = {k: v.replace("{tenant}", tenant_id) if isinstance(v, str) else v for k, v in body.items()}
    response = admin.request(method, path.replace("{tenant}", tenant_id), json=body)
    _assert_400(response, param)
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and "NUL" in error["message"] and "\x00" not in error["message"]


def test_nul_in_the_tenants_own_usage_query_is_a_400(admin: httpx.Client, tenant_id: str) -> None:
    key = admin.post("/admin/v1/keys", json={"tenant_id": tenant_id}).json()["key"]
    response = admin.get("/v1/usage", params={"key_id": "\x00"}, headers={"authorization": f"Bearer {key}"})
    _assert_400(response, "key_id")
    assert admin.get("/v1/usage", headers={"authorization": f"Bearer {key}"}).status_code == 200


def test_a_blank_tenant_name_is_refused_on_update_as_on_create(admin: httpx.Client, tenant_id: str) -> None:
    _assert_400(admin.post("/admin/v1/tenants", json={"name": "   "}), "name")
    _assert_400(admin.patch(f"/admin/v1/tenants/{tenant_id}", json={"name": "   "}), "name")
    assert admin.get(f"/admin/v1/tenants/{tenant_id}").json()["name"] == "hostile-numbers"


def test_cli_key_name_too_long_is_a_validation_message(cli_config: Path) -> None:
    assert in_process(cli_config, "tenant", "create", "names").exit_code == 0
    done = switchyard(cli_config, "key", "create", "--tenant", "names", "--name", "n" * 300)
    _one_line_error(done, "name", "200")
    assert "database" not in done.stderr.lower()


def test_cli_negative_limits_other_than_minus_one_are_errors(cli_config: Path) -> None:
    """Only -1 removes a limit: another negative number is a one-line error, and changes nothing."""
    wrong = {"--rpm": "-5", "--cost-budget": "-0.5", "--tpm": "-2", "--concurrency": "-100", "--token-budget": "-3"}
    assert in_process(cli_config, "tenant", "create", "negatives").exit_code == 0
    limits = ["limits", "set", "--tenant", "negatives"]
    assert in_process(cli_config, *limits, *(a for option in wrong for a in (option, "7"))).exit_code == 0
    done = concurrently(*(partial(switchyard, cli_config, *limits, option, value) for option, value in wrong.items()))
    for option, result in zip(wrong, done, strict=True):
        _one_line_error(result, option, "-1")
        assert result.returncode == 1
    shown = json.loads(in_process(cli_config, "limits", "show", "--tenant", "negatives", "--json").stdout)
    assert [v for k, v in shown.items() if k != "budget_period"] == [7, 7, 7, 7, 7.0]
    removed = switchyard(cli_config, *limits, *(a for option in wrong for a in (option, "-1")), "--json")
    assert removed.returncode == 0, removed.stderr
    assert all(v is None for k, v in json.loads(removed.stdout).items() if k != "budget_period")
