"""Authentication abuse across two replicas sharing PostgreSQL and a Redis of the test's own:
failed keys and dashboard sign-ins are throttled per client address and per key prefix on every
replica at once (429, Retry-After, OpenAI's shape); sign-ins, failures and key use are audited and
listed by the admin API and the CLI; sign-out and key revocation end a dashboard session on every
replica. Client addresses come from X-Forwarded-For, which uvicorn trusts from loopback."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.auth.throttle import AuthThrottle, MemoryFailures, Throttled
from gateway.auth.throttle_redis import RedisFailures
from gateway.db import migrate
from gateway.quotas.redis_client import RespClient
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.dashboard_fixtures import login
from tests.gateway.tenancy_fixtures import drop_pg_database, new_pg_database
from tests.support.redis_server import RedisProcess
from tests.support.servers import ServerThread, free_port

PER_ADDRESS, PER_PREFIX = 3, 2
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


@dataclass
class Replicas:
    urls: list[str]
    db_url: str
    tenant_id: str
    key: str  # a tenant key
    key_id: str
    workdir: Path

    def new_key(self) -> dict[str, Any]:
        return httpx.post(self.urls[0] + "/admin/v1/keys", json={"tenant_id": self.tenant_id}, headers=ADMIN).json()


@pytest.fixture(scope="module")
async def replicas(fake_upstream_server, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Replicas]:  # type: ignore[no-untyped-def]
    from gateway.app import create_app

    work = tmp_path_factory.mktemp("abuse")
    pg, db_url = await new_pg_database()
    await asyncio.to_thread(migrate.upgrade, db_url)
    redis = RedisProcess().start()
    auth = {"admin_key": ADMIN_KEY, "max_failures_per_address": PER_ADDRESS, "max_failures_per_prefix": PER_PREFIX,
            "failure_window": 120}
    servers = []
    try:
        for i in range(2):
            settings = gateway_settings(fake_upstream_server.url, auth=auth, database={"url": db_url},
                                        redis={"url": redis.url}, usage={"journal_dir": str(work / f"journal{i}")},
                                        dashboard={"session_secret": "shared-by-both-replicas"})
            servers.append(ServerThread(create_app(settings)).start())
        urls = [s.url for s in servers]
        tid = httpx.post(urls[0] + "/admin/v1/tenants", json={"name": f"abuse-{uuid.uuid4().hex[:6]}"},
                         headers=ADMIN).json()["id"]
        key = httpx.post(urls[0] + "/admin/v1/keys", json={"tenant_id": tid}, headers=ADMIN).json()
        yield Replicas(urls, db_url, tid, key["key"], key["id"], work)
    finally:
        for server in servers:
            server.stop()
        redis.stop()
        await drop_pg_database(pg)


def _from(address: str, key: str | None = None) -> dict[str, str]:
    headers = {"x-forwarded-for": address}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return headers


def _models(url: str, address: str, key: str) -> httpx.Response:
    return httpx.get(url + "/v1/models", headers=_from(address, key))


def _assert_throttled(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    assert 0 < int(response.headers["retry-after"]) <= 120
    error = response.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "too_many_failed_attempts"


def _wrong_key() -> str:
    return "sk-sy-" + uuid.uuid4().hex * 2


def _audit(url: str, until: Callable[[list[dict[str, Any]]], bool], **params: str) -> list[dict[str, Any]]:
    """The admin API's audit listing, once it satisfies ``until`` (events are written within a second)."""
    deadline = time.monotonic() + 15
    while True:
        rows = httpx.get(url + "/admin/v1/audit", params=params, headers=ADMIN).json()["data"]
        if until(rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def test_failed_keys_are_throttled_per_address_on_every_replica(replicas: Replicas) -> None:
    a, b = replicas.urls
    for i in range(PER_ADDRESS):  # the failures alternate between the replicas; Redis counts them all
        assert _models((a, b)[i % 2], "198.51.100.1", _wrong_key()).status_code == 401
    for url in (a, b):
        _assert_throttled(_models(url, "198.51.100.1", _wrong_key()))
        _assert_throttled(_models(url, "198.51.100.1", replicas.key))  # refused before any lookup
    assert _models(b, "198.51.100.2", replicas.key).status_code == 200  # other addresses are unaffected
    _assert_throttled(httpx.get(a + "/admin/v1/tenants", headers=_from("198.51.100.1", ADMIN_KEY)))


def test_the_admin_api_counts_failures_too(replicas: Replicas) -> None:
    a, b = replicas.urls
    for _ in range(PER_ADDRESS):
        assert httpx.get(a + "/admin/v1/tenants", headers=_from("198.51.100.3", "sk-wrong-admin")).status_code == 401
    _assert_throttled(httpx.get(b + "/admin/v1/tenants", headers=_from("198.51.100.3", ADMIN_KEY)))
    assert httpx.get(b + "/admin/v1/tenants", headers=_from("198.51.100.4", ADMIN_KEY)).status_code == 200


def test_guessing_one_key_from_many_addresses_is_throttled_by_its_prefix(replicas: Replicas) -> None:
    a, b = replicas.urls
    victim = replicas.new_key()
    prefix = victim["key"][:12]
    for i in range(PER_PREFIX):
        guess = prefix + uuid.uuid4().hex * 2
        assert _models((a, b)[i % 2], f"203.0.113.{i + 1}", guess).status_code == 401
    _assert_throttled(_models(b, "203.0.113.50", prefix + uuid.uuid4().hex * 2))
    assert _models(a, "203.0.113.51", replicas.key).status_code == 200  # keys with other prefixes still work
    rows = _audit(a, bool, event="key_failed", client="203.0.113.1")
    assert rows and rows[0]["key_prefix"] == prefix and rows[0]["key_id"] is None and rows[0]["surface"] == "api"


def test_failing_under_a_keys_prefix_does_not_lock_its_holder_out(replicas: Replicas) -> None:
    """The prefix is no secret (listings and dashboards show it): whoever knows it may have the
    guesses under it refused, never the key itself, on the API, the admin API or the dashboard."""
    a, b = replicas.urls
    victim = replicas.new_key()
    prefix = victim["key"][:12]
    for i in range(PER_PREFIX + 2):
        _models((a, b)[i % 2], f"203.0.114.{i + 1}", prefix + uuid.uuid4().hex * 2)
    _assert_throttled(_models(a, "203.0.114.60", prefix + uuid.uuid4().hex * 2))
    assert _models(a, "203.0.114.61", victim["key"]).status_code == 200
    assert _models(b, "203.0.114.62", victim["key"]).status_code == 200
    with httpx.Client(base_url=a, headers=_from("203.0.114.63")) as client:
        assert login(client, victim["key"]).status_code == 303


def test_dashboard_sign_in_is_throttled_and_audited(replicas: Replicas) -> None:
    a, b = replicas.urls
    with httpx.Client(base_url=a, headers=_from("192.0.2.7")) as client:
        for _ in range(PER_ADDRESS):
            assert login(client, _wrong_key()).status_code == 401
    with httpx.Client(base_url=b, headers=_from("192.0.2.7")) as client:
        refused = login(client, replicas.key)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0
        assert "Too many failed" in refused.text and "sy_session" not in client.cookies
    with httpx.Client(base_url=b, headers=_from("192.0.2.8")) as client:
        assert login(client, replicas.key).status_code == 303
    failed = _audit(a, lambda r: len(r) >= PER_ADDRESS, event="login_failed", client="192.0.2.7")
    assert len(failed) == PER_ADDRESS and {r["surface"] for r in failed} == {"dashboard"}
    signed_in = _audit(a, bool, event="login", client="192.0.2.8")
    assert signed_in[0]["key_id"] == replicas.key_id and signed_in[0]["tenant_id"] == replicas.tenant_id


def test_key_use_is_audited_once_per_address(replicas: Replicas) -> None:
    a, b = replicas.urls
    key = replicas.new_key()
    for url in (a, a, a):
        assert _models(url, "192.0.2.20", key["key"]).status_code == 200
    assert _models(b, "192.0.2.21", key["key"]).status_code == 200
    rows = _audit(b, lambda r: len(r) >= 2, event="key_used", key_id=key["id"])
    assert sorted(r["client"] for r in rows) == ["192.0.2.20", "192.0.2.21"]  # not one row per request
    assert {r["tenant_id"] for r in rows} == {replicas.tenant_id}
    time.sleep(1.5)  # past a flush: repeated use from a seen address added nothing
    assert len(_audit(b, bool, event="key_used", key_id=key["id"])) == 2


def test_the_cli_lists_the_audit_trail(replicas: Replicas) -> None:
    key = replicas.new_key()
    assert _models(replicas.urls[0], "192.0.2.30", key["key"]).status_code == 200
    _audit(replicas.urls[0], bool, event="key_used", key_id=key["id"])
    config = replicas.workdir / "cli.yaml"
    config.write_text(yaml.safe_dump({"database": {"url": replicas.db_url}}))
    cli = [str(Path(sys.executable).parent / "switchyard"), "audit", "list", "--config", str(config)]
    out = subprocess.run([*cli, "--key", key["id"], "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert '"client": "192.0.2.30"' in out.stdout and '"event": "key_used"' in out.stdout


def test_the_audit_listing_refuses_bad_filters(replicas: Replicas) -> None:
    url = replicas.urls[0] + "/admin/v1/audit"
    for params, param in (({"event": "x"}, "event"), ({"limit": "0"}, "limit"), ({"since": "soon"}, "since")):
        response = httpx.get(url, params=params, headers=ADMIN)
        assert response.status_code == 400 and response.json()["error"]["param"] == param
    assert httpx.get(url, headers={"authorization": f"Bearer {replicas.key}"}).status_code == 403


def test_sign_out_ends_the_session_on_every_replica(replicas: Replicas) -> None:
    a, b = replicas.urls
    with httpx.Client(base_url=a) as client:
        assert login(client, replicas.key).status_code == 303
        cookie = client.cookies["sy_session"]
        assert httpx.get(b + "/dashboard/api/me", cookies={"sy_session": cookie}).status_code == 200
        csrf = client.get("/dashboard/api/me").json()["csrf"]
        assert client.post("/dashboard/logout", data={"csrf": csrf}).status_code == 303
    for url in (a, b):  # the copied cookie is dead on both replicas, for data and for the page
        assert httpx.get(url + "/dashboard/api/me", cookies={"sy_session": cookie}).status_code == 401
        page = httpx.get(url + "/dashboard", cookies={"sy_session": cookie})
        assert page.status_code == 303 and page.headers["location"].endswith("/dashboard/login")
    assert _audit(a, bool, event="logout", key_id=replicas.key_id)


def test_revoking_a_key_ends_its_sessions_on_every_replica(replicas: Replicas) -> None:
    a, b = replicas.urls
    key = replicas.new_key()
    with httpx.Client(base_url=b) as client:
        assert login(client, key["key"]).status_code == 303
        assert client.get("/dashboard/api/summary").status_code == 200
        assert httpx.post(f"{a}/admin/v1/keys/{key['id']}/revoke", headers=ADMIN).status_code == 200
        assert client.get("/dashboard/api/summary").status_code == 401  # at once, on the other replica
        assert client.get("/dashboard").status_code == 303


async def test_the_in_process_throttle_blocks_for_the_rest_of_the_window() -> None:
    """The embedded default (no Redis): the same rules, counted in process."""
    throttle = AuthThrottle(MemoryFailures(), per_address=2, per_prefix=0, window=0.5)
    await throttle.check("10.0.0.1")
    for _ in range(2):
        await throttle.failed("10.0.0.1", _wrong_key())
    with pytest.raises(Throttled) as err:
        await throttle.check("10.0.0.1")
    assert err.value.scope == "address" and err.value.retry_after == 1
    await throttle.check("10.0.0.2")
    await asyncio.sleep(0.6)
    await throttle.check("10.0.0.1")  # the window ended


async def test_an_unreachable_redis_does_not_stop_authentication() -> None:
    """The throttle lets requests through (the key check still decides) while Redis is away."""
    redis = RespClient("127.0.0.1", free_port(), timeout=0.5)
    throttle = AuthThrottle(RedisFailures(redis), per_address=1, per_prefix=1, window=60)
    try:
        await throttle.failed("10.0.0.3", _wrong_key())
        await throttle.check("10.0.0.3")
        await throttle.failed("10.0.0.3", _wrong_key())  # nor does a prefix over its limit
    finally:
        await redis.aclose()


async def test_audit_events_are_kept_for_the_retention_period(tmp_path: Path) -> None:
    from gateway.auth.audit import AuditLog, list_events
    from gateway.contracts import Principal
    from gateway.db.engine import Database

    url = f"sqlite+aiosqlite:///{tmp_path / 'audit.db'}"
    await asyncio.to_thread(migrate.upgrade, url)
    db = Database.from_url(url)
    try:
        audit = AuditLog(db, retention=3600)
        audit.record("login", client="10.1.1.1\x1b[31m", surface="dashboard",
                     principal=Principal(key_id="key_x", tenant_id="ten_x"))
        await audit.flush()
        assert await audit.prune() == 0  # an event of now stays
        rows = await list_events(db)
        assert rows[0]["client"] == "10.1.1.1?[31m" and rows[0]["key_id"] == "key_x"  # no control characters
        audit.retention = 0.0
        assert await audit.prune() == 1 and await list_events(db) == []
    finally:
        await db.dispose()


async def test_audit_events_the_database_does_not_take_at_shutdown_wait_for_the_next_start(tmp_path: Path) -> None:
    """Shutdown with the database unreachable: the buffered events go to a file beside the usage
    journal, and the next audit log started on that folder writes them (once: the file is claimed)."""
    from gateway.auth.audit import AuditLog, list_events
    from gateway.contracts import Principal
    from gateway.db.engine import Database

    spill = tmp_path / "journal"
    down = Database.from_url(f"postgresql+asyncpg://nobody@127.0.0.1:{free_port()}/gone")  # refuses connections
    audit = AuditLog(down, spill_dir=spill)
    for client in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        audit.record("key_used", client=client, surface="api", principal=Principal(key_id="key_s", tenant_id="ten_s"))
    await audit.aclose(timeout=3)
    await down.dispose()
    assert [p.name.startswith("audit-") for p in spill.iterdir()] == [True]

    url = f"sqlite+aiosqlite:///{tmp_path / 'audit.db'}"
    await asyncio.to_thread(migrate.upgrade, url)
    db = Database.from_url(url)
    try:
        second, third = AuditLog(db, spill_dir=spill), AuditLog(db, spill_dir=spill)
        second.start()
        third.start()  # started together: only one of them takes the file
        await asyncio.gather(second.aclose(), third.aclose())
        rows = await list_events(db)
        assert sorted(r["client"] for r in rows) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
        assert {r["key_id"] for r in rows} == {"key_s"} and list(spill.iterdir()) == []
    finally:
        await db.dispose()


def test_dashboard_pages_carry_the_full_policy(replicas: Replicas) -> None:
    """Every dashboard page, the sign-in form included, gets the one strict policy (no page sets a
    weaker one of its own): scripts only from the gateway, no plugins, no foreign form targets."""
    for path in ("/dashboard/login", "/dashboard/static/app.js", "/dashboard"):
        response = httpx.get(replicas.urls[0] + path)
        csp = response.headers["content-security-policy"]
        for directive in ("script-src 'self'", "object-src 'none'", "form-action 'self'", "frame-ancestors 'none'",
                          "base-uri 'none'"):
            assert directive in csp, (path, csp)
        assert response.headers["x-frame-options"] == "DENY" and response.headers["cache-control"] == "no-store"
