"""What the admin API stores for the names an operator types: a key's models and a tenant's name,
on SQLite and PostgreSQL. Tenant names that look alike are one name: equal up to case and Unicode
compatibility forms is a 409, an invisible character a 400, and a lookup by name ignores case."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from click.testing import Result
from litestar import Litestar
from typer.testing import CliRunner

from backends.call import MIN_WEIGHT
from gateway.admin.api import admin_routers
from gateway.admin.service import AdminError, TenancyService
from gateway.auth.authenticator import SqlAuthenticator
from gateway.cli import app
from gateway.db import Database
from tests.gateway.tenancy_fixtures import LoopbackServer, db, plain_url  # noqa: F401

ADMIN = "sy-admin-" + uuid.uuid4().hex
H = {"authorization": f"Bearer {ADMIN}"}


@pytest.fixture(scope="module")
async def auth(db: Database) -> SqlAuthenticator:
    return SqlAuthenticator(db, ttl=0.5, admin_key=ADMIN)


@pytest.fixture(scope="module")
async def api(db: Database, auth: SqlAuthenticator) -> AsyncIterator[httpx.AsyncClient]:
    app = Litestar(route_handlers=admin_routers(TenancyService(db, on_change=auth.invalidate), db, auth))
    async with LoopbackServer(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        yield client


async def new_tenant(api: httpx.AsyncClient, name: str | None = None) -> httpx.Response:
    return await api.post("/admin/v1/tenants", json={"name": name or f"n-{uuid.uuid4().hex[:8]}"}, headers=H)


async def test_a_keys_models_are_stored_without_surrounding_blanks(api: httpx.AsyncClient,
                                                                   auth: SqlAuthenticator) -> None:
    tid = (await new_tenant(api)).json()["id"]
    r = await api.post("/admin/v1/keys", json={"tenant_id": tid, "models": [" echo ", "echo\t", "other"]}, headers=H)
    assert r.status_code == 201, r.text
    assert r.json()["allowed_models"] == ["echo", "other"]  # a pasted blank would lock the key out of echo
    principal = await auth.authenticate(r.json()["key"])
    assert principal is not None and principal.may_use("echo") and not principal.may_use(" echo ")


async def test_a_tenant_name_shaped_like_a_tenant_id_is_refused(api: httpx.AsyncClient) -> None:
    first = (await new_tenant(api)).json()
    for r in (await new_tenant(api, first["id"]),  # `--tenant <id>` would still mean the first tenant
              await new_tenant(api, "ten_0123456789abcdef"),
              await new_tenant(api, "TEN_0123456789ABCDEF"),  # the same name, in another case
              await api.patch(f"/admin/v1/tenants/{first['id']}", json={"name": " ten_fedcba9876543210 "},
                              headers=H)):
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "name" and "tenant id" in r.json()["error"]["message"]
    for name in ("ten_0123", "ten_0123456789abcdeg", "tenant_0123456789abcdef"):  # near the form: names
        assert (await new_tenant(api, name)).status_code == 201


async def test_a_tenant_weight_too_small_for_fair_sharing_is_refused(api: httpx.AsyncClient) -> None:
    for weight in (5e-324, 1e-300, MIN_WEIGHT / 2):  # tokens / weight would overflow the engine's virtual time
        r = await api.post("/admin/v1/tenants", json={"name": f"n-{uuid.uuid4().hex[:8]}", "weight": weight},
                           headers=H)
        assert r.status_code == 400 and r.json()["error"]["param"] == "weight", r.text
    light = (await new_tenant(api)).json()["id"]
    r = await api.patch(f"/admin/v1/tenants/{light}", json={"weight": 1e-300}, headers=H)
    assert r.status_code == 400 and r.json()["error"]["param"] == "weight", r.text
    r = await api.patch(f"/admin/v1/tenants/{light}", json={"weight": MIN_WEIGHT}, headers=H)
    assert r.status_code == 200 and r.json()["weight"] == MIN_WEIGHT, r.text


async def test_the_service_refuses_a_tiny_weight_as_the_api_does(db: Database) -> None:
    svc = TenancyService(db)  # the CLI's way in
    with pytest.raises(AdminError) as err:
        await svc.create_tenant(f"n-{uuid.uuid4().hex[:8]}", weight=1e-300)
    assert err.value.param == "weight" and "[1e-06, 1000000]" in err.value.message


# ---------------------------------------------------------------- one name up to case and Unicode form


def fullwidth(text: str) -> str:
    """``text`` in fullwidth forms (NFKC makes them ASCII again): Ａｃｍｅ for Acme."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


def conflict(r: httpx.Response, existing: str) -> None:
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert error["type"] == "conflict_error" and error["param"] == "name", r.text
    assert existing in error["message"], r.text


async def test_names_equal_up_to_case_or_unicode_form_are_one_name(api: httpx.AsyncClient) -> None:
    name = f"Acme Corp {uuid.uuid4().hex[:6]}"
    first = await new_tenant(api, name)
    assert first.status_code == 201, first.text
    for twin in (name.lower(), name.upper(), fullwidth(name), f"{name}\u00a0", f"\u3000{name} ",
                 name.replace(" ", "  "), name.replace("Acme", "ACME").replace("C", "\uff23")):
        conflict(await new_tenant(api, twin), name)
    names = [t["name"] for t in (await api.get("/admin/v1/tenants", headers=H)).json()["data"]]
    assert names.count(name) == 1


async def test_twin_names_sent_at_once_make_one_tenant(api: httpx.AsyncClient) -> None:
    name = f"Race-{uuid.uuid4().hex[:6]}"
    done = await asyncio.gather(*(new_tenant(api, twin) for twin in [name, name.lower(), name.upper(),
                                                                      fullwidth(name)] * 2))
    assert sorted(r.status_code for r in done) == [201] + [409] * 7, [r.text for r in done]
    ids = [(await new_tenant(api)).json()["id"] for _ in range(4)]
    done = await asyncio.gather(*(api.patch(f"/admin/v1/tenants/{tid}", json={"name": twin}, headers=H)
                                  for tid, twin in zip(ids, [f"x{name}", f"X{name}", f"x{name.upper()}",
                                                             fullwidth(f"x{name}")], strict=True)))
    assert sorted(r.status_code for r in done) == [200] + [409] * 3, [r.text for r in done]


async def test_a_name_is_stored_in_its_nfkc_form(api: httpx.AsyncClient) -> None:
    name = f"Full {uuid.uuid4().hex[:6]}"
    r = await new_tenant(api, f" {fullwidth(name)}\u00a0")
    assert r.status_code == 201 and r.json()["name"] == name, r.text


async def test_renaming_onto_another_tenants_name_up_to_case_is_a_409(api: httpx.AsyncClient) -> None:
    taken, mine = f"taken-{uuid.uuid4().hex[:6]}", f"mine-{uuid.uuid4().hex[:6]}"
    assert (await new_tenant(api, taken)).status_code == 201
    tid = (await new_tenant(api, mine)).json()["id"]
    for twin in (taken.upper(), fullwidth(taken)):
        conflict(await api.patch(f"/admin/v1/tenants/{tid}", json={"name": twin}, headers=H), taken)
    assert (await api.get(f"/admin/v1/tenants/{tid}", headers=H)).json()["name"] == mine
    r = await api.patch(f"/admin/v1/tenants/{tid}", json={"name": mine.upper()}, headers=H)  # its own name
    assert r.status_code == 200 and r.json()["name"] == mine.upper(), r.text


@pytest.mark.parametrize("hidden", ["\u200b", "\u200d", "\u00ad", "\u2060", "\ufeff", "\u202e", "\x07", "\x1b",
                                    "\t", "\u2028", "\u115f", "\ufe0f", "\U000e0041"])
async def test_a_name_holding_an_invisible_character_is_a_400(api: httpx.AsyncClient, hidden: str) -> None:
    tid = (await new_tenant(api)).json()["id"]
    for r in (await new_tenant(api, f"Ac{hidden}me-{uuid.uuid4().hex[:6]}"),
              await api.patch(f"/admin/v1/tenants/{tid}", json={"name": f"Ac{hidden}me"}, headers=H)):
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "name" and error["type"] == "invalid_request_error", r.text
        assert f"U+{ord(hidden):04X}" in error["message"] and hidden not in error["message"], r.text


async def test_a_tenant_is_found_by_its_name_whatever_the_case(api: httpx.AsyncClient) -> None:
    name = f"Found-{uuid.uuid4().hex[:6]}"
    tid = (await new_tenant(api, name)).json()["id"]
    for ref in (name, name.lower(), name.upper(), fullwidth(name)):
        r = await api.get(f"/admin/v1/tenants/{ref}", headers=H)
        assert r.status_code == 200 and r.json()["id"] == tid, r.text
    r = await api.post("/admin/v1/keys", json={"tenant_id": name.swapcase()}, headers=H)
    assert r.status_code == 201 and r.json()["tenant_id"] == tid, r.text


async def test_the_cli_finds_tenants_whatever_the_case_and_refuses_twins(db: Database, tmp_path: Path) -> None:
    config = tmp_path / "switchyard.yaml"
    config.write_text(f"database:\n  url: {plain_url(db)}\n")

    def cli(*args: str) -> Result:
        return CliRunner().invoke(app, list(args), env={"SWITCHYARD_CONFIG": str(config)})

    name = f"Beta-{uuid.uuid4().hex[:6]}"
    created = await asyncio.to_thread(cli, "tenant", "create", name, "--json")
    assert created.exit_code == 0, created.output
    tid = json.loads(created.output)["id"]
    twin = await asyncio.to_thread(cli, "tenant", "create", fullwidth(name.upper()))
    assert twin.exit_code != 0 and "already exists" in twin.output and name in twin.output, twin.output
    hidden = await asyncio.to_thread(cli, "tenant", "create", f"{name}\u200b")
    assert hidden.exit_code != 0 and "U+200B" in hidden.output, hidden.output
    key = await asyncio.to_thread(cli, "key", "create", "--tenant", name.lower(), "--json")
    assert key.exit_code == 0 and json.loads(key.output)["tenant_id"] == tid, key.output
    shown = await asyncio.to_thread(cli, "tenant", "show", name.upper(), "--json")
    assert shown.exit_code == 0 and json.loads(shown.output)["id"] == tid, shown.output
