"""Security properties as tests: keys never reach the logs, secrets are compared in constant time,
every admin route refuses tenant keys, and one tenant never sees another's data."""

from __future__ import annotations

import inspect
import logging
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from gateway.auth import authenticator, keys
from gateway.db import migrate
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.servers import ServerThread

UPSTREAM_SECRET = "sk-upstream-secret-DO-NOT-LOG"
CHAT = [{"role": "user", "content": "secret test"}]


@dataclass
class Tenant:
    id: str
    key: str
    key_id: str


@dataclass
class Served:
    url: str
    admin: httpx.Client
    a: Tenant
    b: Tenant


def _tenant(admin: httpx.Client) -> Tenant:
    tid = admin.post("/admin/v1/tenants", json={"name": f"sec-{uuid.uuid4().hex[:6]}"}).json()["id"]
    key = admin.post("/admin/v1/keys", json={"tenant_id": tid}).json()
    return Tenant(tid, key["key"], key["id"])


@pytest.fixture(scope="module")
def served(fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from gateway.app import create_app

    work = tmp_path_factory.mktemp("security")
    db_url = f"sqlite+aiosqlite:///{work / 'gw.db'}"
    migrate.upgrade(db_url)
    deployment = {"provider": "openai", "model": "upstream-echo", "api_base": fake_upstream_server.url,
                  "api_key": UPSTREAM_SECRET}
    settings = gateway_settings(fake_upstream_server.url, database={"url": db_url},
                                usage={"journal_dir": str(work / "journal")},
                                models=[{"name": "echo", "max_retries": 0, "circuit": {"failures": 50},
                                         "deployments": [deployment]}])
    with ServerThread(create_app(settings)) as server, httpx.Client(
        base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10
    ) as admin:
        yield Served(server.url, admin, _tenant(admin), _tenant(admin))


def client(served: Served, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key=key, max_retries=0, timeout=10)


def test_keys_never_reach_the_logs(served: Served, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    fresh = served.admin.post("/admin/v1/keys", json={"tenant_id": served.a.id}).json()
    good = client(served, fresh["key"])
    good.chat.completions.create(model="echo", messages=CHAT)  # type: ignore[arg-type]
    for _ in good.chat.completions.create(model="echo", messages=CHAT, stream=True):  # type: ignore[arg-type]
        pass
    upstream.fail_next(Fault(status=500), Fault(status=401))
    for _ in range(2):
        with pytest.raises(openai.APIStatusError):
            good.chat.completions.create(model="echo", messages=CHAT)  # type: ignore[arg-type]
    wrong = fresh["key"][:-4] + "zzzz"  # a near miss of a real key
    with pytest.raises(openai.AuthenticationError):
        client(served, wrong).models.list()
    served.admin.post(f"/admin/v1/keys/{fresh['id']}/rotate", json={"grace_seconds": 0})
    served.admin.post(f"/admin/v1/keys/{fresh['id']}/revoke")
    with pytest.raises(openai.AuthenticationError):
        good.models.list()

    text = "\n".join(f"{r.getMessage()} {r.exc_text or ''} {r.__dict__}" for r in caplog.records)
    assert caplog.records  # the run did log
    for secret in (ADMIN_KEY, UPSTREAM_SECRET):
        assert secret not in text
    for secret in (fresh["key"], wrong, served.a.key, served.b.key):  # issued keys: not even their random tail
        assert secret not in text and secret[-16:] not in text


def test_secrets_are_compared_in_constant_time() -> None:
    assert "compare_digest" in inspect.getsource(keys.same_hash)
    assert "same_hash" in inspect.getsource(authenticator.SqlAuthenticator.authenticate)
    digest = keys.hash_key(ADMIN_KEY)
    assert keys.same_hash(digest, keys.hash_key(ADMIN_KEY))
    assert not keys.same_hash(digest, keys.hash_key(ADMIN_KEY + "x"))


def _admin_operations(served: Served) -> list[tuple[str, str]]:
    schema = served.admin.get("/schema/openapi.json").json()
    operations = []
    for path, item in schema["paths"].items():
        if path.startswith("/admin/"):
            concrete = re.sub(r"\{[^}]+\}", "x", path)
            operations += [(method.upper(), concrete) for method in item if method in ("get", "post", "put", "patch",
                                                                                        "delete")]
    return operations


def test_every_admin_route_refuses_tenant_keys(served: Served, upstream: FakeUpstream) -> None:
    operations = _admin_operations(served)
    assert len(operations) >= 10
    for key, expected in ((served.a.key, 403), ("sk-bogus", 401), (None, 401)):
        headers = {"authorization": f"Bearer {key}"} if key else {}
        for method, path in operations:
            r = httpx.request(method, served.url + path, headers=headers, json={}, timeout=10)
            assert r.status_code == expected, (method, path, r.status_code, r.text[:200])
            assert r.json()["error"]["type"] in ("permission_error", "authentication_error")


def test_tenants_are_isolated_across_routes(served: Served, upstream: FakeUpstream) -> None:
    a, b = served.a, served.b
    raw = client(served, a.key).chat.completions.with_raw_response.create(model="echo", messages=CHAT)  # type: ignore[arg-type]
    a_request = raw.headers["x-request-id"]
    # tenant usage: each sees only its own rows
    seen_by_b = httpx.get(served.url + "/v1/usage", headers={"authorization": f"Bearer {b.key}"}, timeout=10)
    assert seen_by_b.status_code == 200 and a_request not in seen_by_b.text and a.id not in seen_by_b.text
    for query in ({"tenant_id": a.id}, {"key_id": a.key_id}):  # asking for another tenant's data gets nothing of it
        r = httpx.get(served.url + "/v1/usage", params=query, headers={"authorization": f"Bearer {b.key}"}, timeout=10)
        assert r.status_code in (200, 400, 403) and a_request not in r.text
    # the admin API is closed to tenant keys, including for their own tenant and key
    for path in (f"/admin/v1/tenants/{b.id}", f"/admin/v1/tenants/{a.id}", f"/admin/v1/keys/{a.key_id}",
                 f"/admin/v1/tenants/{a.id}/limits", "/admin/v1/usage"):
        assert httpx.get(served.url + path, headers={"authorization": f"Bearer {b.key}"}).status_code == 403
    # models: a tenant key lists models, never another tenant's ids
    models = httpx.get(served.url + "/v1/models", headers={"authorization": f"Bearer {b.key}"})
    assert models.status_code == 200 and a.id not in models.text


def test_an_upstream_error_echoing_the_providers_key_does_not_hand_it_over(
    served: Served, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    echo = {"error": {"message": f"bad header Authorization: Bearer {UPSTREAM_SECRET}", "type": "x", "code": None}}
    tenant = httpx.Client(base_url=served.url, headers={"authorization": f"Bearer {served.a.key}"}, timeout=10)
    # relayed as the client's fault (400), as the upstream's (418), and as an error object in a 2xx answer
    for status, stream in ((400, False), (400, True), (418, False), (418, True), (200, False)):
        upstream.fail_next(Fault(status=status, body=echo))
        r = tenant.post("/v1/chat/completions", json={"model": "echo", "messages": CHAT, "stream": stream})
        assert r.status_code >= 400 and "bad header" in r.text and UPSTREAM_SECRET not in r.text
    assert UPSTREAM_SECRET not in "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
