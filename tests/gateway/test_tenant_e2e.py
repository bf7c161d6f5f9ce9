"""Tenants and keys end to end: the real app (build_services) on SQLite and PostgreSQL, the
official openai SDK as the client, the fake upstream behind it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select

from gateway.db import Database
from gateway.db.models import UsageRow
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.tenancy_fixtures import db, plain_url  # noqa: F401
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import ServerThread

CHAT = [{"role": "user", "content": "hello there general kenobi"}]


@dataclass
class Gateway:
    url: str
    admin: httpx.Client

    def tenant(self, **limits: Any) -> str:
        r = self.admin.post("/admin/v1/tenants", json={"name": f"t-{uuid.uuid4().hex[:8]}"})
        assert r.status_code == 201, r.text
        tid = r.json()["id"]
        if limits:
            assert self.admin.put(f"/admin/v1/tenants/{tid}/limits", json=limits).status_code == 200
        return tid

    def key(self, tenant_id: str, **fields: Any) -> dict[str, Any]:
        r = self.admin.post("/admin/v1/keys", json={"tenant_id": tenant_id, **fields})
        assert r.status_code == 201, r.text
        return r.json()

    def client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=20)


def settings_for(upstream_url: str, db_url: str) -> Any:
    deployment = {"provider": "openai", "model": "upstream-echo", "api_base": upstream_url, "api_key": "sk-up"}
    return gateway_settings(
        upstream_url,
        auth={"admin_key": ADMIN_KEY, "key_cache_seconds": 2},
        database={"url": db_url},
        models=[
            {"name": "echo", "deployments": [deployment]},
            {"name": "other", "deployments": [deployment | {"name": "other-dep"}]},
        ],
        prices={"echo": {"input_per_million": 1.0, "output_per_million": 2.0}},
    )


@pytest.fixture(scope="module")
def gateway(
    db: Database, fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    from gateway.app import create_app

    settings = settings_for(fake_upstream_server.url, plain_url(db))
    settings.usage.journal_dir = str(tmp_path_factory.mktemp("journal"))
    app = create_app(settings)
    with (
        ServerThread(app) as server,
        httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=20) as admin,
    ):
        yield Gateway(server.url, admin)


def rejected_within(client: openai.OpenAI, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            client.chat.completions.create(model="echo", messages=CHAT)  # type: ignore[arg-type]
        except openai.AuthenticationError:
            return True
        time.sleep(0.1)
    return False


def test_key_lifecycle_create_use_wrong_model_revoke(gateway: Gateway) -> None:
    tid = gateway.tenant()
    key = gateway.key(tid, models=["echo"])
    client = gateway.client(key["key"])
    reply = client.chat.completions.create(model="echo", messages=CHAT)  # type: ignore[arg-type]
    assert reply.choices[0].message.content
    with pytest.raises(openai.PermissionDeniedError) as denied:
        client.chat.completions.create(model="other", messages=CHAT)  # type: ignore[arg-type]
    assert denied.value.status_code == 403
    assert [m.id for m in client.models.list()] == ["echo"]
    assert gateway.admin.post(f"/admin/v1/keys/{key['id']}/revoke").status_code == 200
    assert rejected_within(client)


def test_rotate_keeps_old_key_for_grace_then_rejects(gateway: Gateway) -> None:
    tid = gateway.tenant()
    old = gateway.key(tid)
    r = gateway.admin.post(f"/admin/v1/keys/{old['id']}/rotate", json={"grace_seconds": 3})
    new = r.json()
    for secret in (old["key"], new["key"]):
        assert gateway.client(secret).chat.completions.create(model="echo", messages=CHAT).choices  # type: ignore[arg-type]
    assert rejected_within(gateway.client(old["key"]), 8.0)
    assert gateway.client(new["key"]).chat.completions.create(model="echo", messages=CHAT).choices  # type: ignore[arg-type]


def test_expired_key_is_rejected(gateway: Gateway) -> None:
    tid = gateway.tenant()
    key = gateway.key(tid, expires_in_seconds=3)
    client = gateway.client(key["key"])
    assert client.chat.completions.create(model="echo", messages=CHAT).choices  # type: ignore[arg-type]
    assert rejected_within(client, 8.0)
    assert gateway.admin.get(f"/admin/v1/keys/{key['id']}").json()["status"] == "expired"


def test_disabled_tenant_is_rejected(gateway: Gateway) -> None:
    tid = gateway.tenant()
    client = gateway.client(gateway.key(tid)["key"])
    assert client.chat.completions.create(model="echo", messages=CHAT).choices  # type: ignore[arg-type]
    assert gateway.admin.post(f"/admin/v1/tenants/{tid}/disable").status_code == 200
    assert rejected_within(client)


def test_rate_limit_429_with_openai_headers(gateway: Gateway) -> None:
    tid = gateway.tenant(requests_per_minute=2, tokens_per_minute=100_000)
    client = gateway.client(gateway.key(tid)["key"])
    first = client.chat.completions.with_raw_response.create(model="echo", messages=CHAT, max_tokens=5)  # type: ignore[arg-type]
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert first.headers["x-ratelimit-limit-tokens"] == "100000"
    assert int(first.headers["x-ratelimit-remaining-tokens"]) < 100_000
    assert first.headers["x-ratelimit-reset-requests"].endswith("s")
    second = client.chat.completions.with_raw_response.create(model="echo", messages=CHAT, max_tokens=5)  # type: ignore[arg-type]
    assert second.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError) as limited:
        client.chat.completions.create(model="echo", messages=CHAT, max_tokens=5)  # type: ignore[arg-type]
    headers = limited.value.response.headers
    assert int(headers["retry-after"]) >= 1
    assert headers["x-ratelimit-remaining-requests"] == "0"
    # the tokens/min standing too, as OpenAI's clients read both (the refused request reserved nothing)
    assert headers["x-ratelimit-limit-tokens"] == "100000"
    assert int(second.headers["x-ratelimit-remaining-tokens"]) <= int(headers["x-ratelimit-remaining-tokens"]) < 100_000
    assert headers["x-ratelimit-reset-tokens"].endswith("s")
    assert limited.value.body["code"] == "rate_limit_exceeded"  # type: ignore[index]


def test_a_budget_429_carries_the_rate_limit_headers_of_the_tenant(gateway: Gateway) -> None:
    """A 429 for another reason than requests/min (here the key's token budget) carries the
    requests/min and tokens/min standing too, here the tenant's, as they stand (nothing reserved)."""
    tid = gateway.tenant(requests_per_minute=5, tokens_per_minute=100_000)
    key = gateway.key(tid)
    assert gateway.admin.put(f"/admin/v1/keys/{key['id']}/limits", json={"token_budget": 1}).status_code == 200
    with pytest.raises(openai.RateLimitError) as limited:
        gateway.client(key["key"]).chat.completions.create(model="echo", messages=CHAT, max_tokens=5)  # type: ignore[arg-type]
    headers = limited.value.response.headers
    assert "budget" in limited.value.message
    assert (headers["x-ratelimit-limit-requests"], headers["x-ratelimit-remaining-requests"]) == ("5", "5")
    assert (headers["x-ratelimit-limit-tokens"], headers["x-ratelimit-remaining-tokens"]) == ("100000", "100000")
    assert headers["x-ratelimit-reset-requests"].endswith("s") and headers["x-ratelimit-reset-tokens"].endswith("s")


def wait_for_rows(db: Database, tenant_id: str, count: int, timeout: float = 15.0) -> list[UsageRow]:
    """Poll (from a private event loop: this test is synchronous) until ``count`` rows exist."""
    import asyncio

    other = Database.from_url(plain_url(db))

    async def fetch() -> list[UsageRow]:
        async with other.session() as s:
            return list((await s.scalars(select(UsageRow).where(UsageRow.tenant_id == tenant_id))).all())

    loop = asyncio.new_event_loop()
    deadline = time.monotonic() + timeout
    try:
        while True:
            found = loop.run_until_complete(fetch())
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.1)
    finally:
        loop.run_until_complete(other.dispose())
        loop.close()


def test_stream_cut_off_mid_way_records_its_tokens(gateway: Gateway, db: Database, upstream: FakeUpstream) -> None:
    upstream.options.chunk_delay = 0.05
    tid = gateway.tenant()
    client = gateway.client(gateway.key(tid)["key"])
    words = " ".join(f"w{i}" for i in range(60))
    stream = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": words}], stream=True)  # type: ignore[arg-type]
    got = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            got += 1
        if got == 5:
            break
    stream.close()
    full = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "a b c"}])  # type: ignore[arg-type]
    assert full.usage is not None
    rows = wait_for_rows(db, tid, 2)
    assert len(rows) == 2
    cut = next(r for r in rows if r.stream)
    assert 5 <= cut.completion_tokens < 60 and cut.prompt_tokens > 0 and cut.status == 200
    whole = next(r for r in rows if not r.stream)
    assert (whole.prompt_tokens, whole.completion_tokens) == (full.usage.prompt_tokens, full.usage.completion_tokens)
    assert whole.exact and whole.cost == pytest.approx(
        (whole.prompt_tokens * 1.0 + whole.completion_tokens * 2.0) / 1e6
    )


def test_tenant_isolation_through_every_endpoint(gateway: Gateway, db: Database) -> None:
    a, b = gateway.tenant(), gateway.tenant()
    ka, kb = gateway.key(a), gateway.key(b)
    for key in (ka, kb):
        gateway.client(key["key"]).chat.completions.create(model="echo", messages=CHAT)  # type: ignore[arg-type]
    wait_for_rows(db, a, 1)
    wait_for_rows(db, b, 1)
    with httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {ka['key']}"}) as as_a:
        own = as_a.get("/v1/usage", params={"group_by": "tenant,key"}).json()["data"]
        assert [(r["tenant"], r["key"]) for r in own] == [(a, ka["id"])]
        assert as_a.get("/v1/usage", params={"key_id": kb["id"]}).json()["data"] == []
        for path in ("/admin/v1/tenants", f"/admin/v1/tenants/{b}", f"/admin/v1/tenants/{b}/keys",
                     f"/admin/v1/keys/{kb['id']}", f"/admin/v1/tenants/{b}/limits", "/admin/v1/usage"):  # fmt: skip
            r = as_a.get(path)
            assert r.status_code == 403 and kb["id"] not in r.text and b not in r.text
        for path in (f"/admin/v1/keys/{kb['id']}/revoke", f"/admin/v1/tenants/{b}/disable"):
            assert as_a.post(path).status_code == 403
    assert gateway.client(kb["key"]).chat.completions.create(model="echo", messages=CHAT).choices  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # uvicorn's exit(3)
def test_unmigrated_database_refuses_to_start(fake_upstream_server: FakeUpstream, tmp_path: Path) -> None:
    from gateway.app import create_app

    app = create_app(settings_for(fake_upstream_server.url, f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"))
    with pytest.raises(RuntimeError, match="did not start"):
        ServerThread(app, startup_timeout=20).start()
