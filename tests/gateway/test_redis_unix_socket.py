"""A Redis reached over a Unix socket (``redis.url: unix:///path/redis.sock?db=N``, which the
settings accept): the gateway starts on it and counts its quotas there."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis

from gateway.quotas.redis_client import RespClient
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.tenancy_fixtures import migrated_pg_url  # noqa: F401
from tests.support.fake_upstream import FakeUpstream
from tests.support.redis_server import RedisProcess
from tests.support.servers import ServerThread


@pytest.fixture
def socket_path(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "redis.sock")
    server = RedisProcess(unix_socket=path).start()
    yield path
    server.stop()


async def test_the_client_talks_over_a_unix_socket(socket_path: str) -> None:
    client = RespClient.from_url(f"unix://{socket_path}?db=4")
    try:
        assert await client.ping()
        await client.execute("SET", "where", "db4")
        script = client.register_script("return redis.call('GET', KEYS[1])")
        assert await script(keys=["where"], args=[]) == b"db4"
        heard: list[bytes] = []
        subscription = await client.subscribe("news", heard.append)
        subscription.close()
    finally:
        await client.aclose()
    assert redis.Redis(unix_socket_path=socket_path, db=4).get("where") == b"db4"  # the ?db= was selected


def test_a_gateway_counts_its_quotas_in_redis_over_a_unix_socket(
        socket_path: str, migrated_pg_url: str, upstream: FakeUpstream, tmp_path: Path) -> None:
    from gateway.app import create_app

    settings = gateway_settings(upstream.url, database={"url": migrated_pg_url},
                                redis={"url": f"unix://{socket_path}?db=2"},
                                usage={"journal_dir": str(tmp_path / "journal")})
    with ServerThread(create_app(settings)) as server, httpx.Client(
            base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=20) as admin:
        tid = admin.post("/admin/v1/tenants", json={"name": uuid.uuid4().hex[:8]}).json()["id"]
        assert admin.put(f"/admin/v1/tenants/{tid}/limits", json={"requests_per_minute": 2}).status_code == 200
        key = admin.post("/admin/v1/keys", json={"tenant_id": tid}).json()["key"]
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=20)
        def chat() -> str:  # the requests left
            return client.chat.completions.with_raw_response.create(
                model="echo", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
            ).headers["x-ratelimit-remaining-requests"]

        assert [chat() for _ in range(2)] == ["1", "0"]
        with pytest.raises(openai.RateLimitError):
            chat()
    assert redis.Redis(unix_socket_path=socket_path, db=2).exists(f"sy:q:tenant:{tid}:win")
