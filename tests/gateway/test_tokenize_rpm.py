"""``POST /tokenize`` and ``/detokenize`` (vLLM's, on engine models) count against requests/min as
the other counts of tokens do (``Pipeline.admit_poll``): their rate-limit headers, then the 429; a
bad request is a 400 before it is counted; they reserve no tokens and are not metered."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from engine.tiny_model import build_tiny_model
from gateway.app import create_app
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.tenancy_fixtures import REDIS_URL, migrated_pg_url  # noqa: F401
from tests.support.servers import ServerThread


@pytest.fixture(scope="module", params=["memory", "redis"])
def gateway(request: pytest.FixtureRequest, migrated_pg_url: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, httpx.Client]]:
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny", seed=5, max_position_embeddings=512)
    tiny = {"provider": "local", "model": str(folder), "options": {"num_kv_blocks": 40, "block_size": 16}}
    settings = gateway_settings(
        "http://127.0.0.1:9", database={"url": migrated_pg_url},
        usage={"journal_dir": str(tmp_path_factory.mktemp("journal"))},
        models=[{"name": "tiny", "deployments": [tiny]}],
        **({"redis": {"url": REDIS_URL}} if request.param == "redis" else {}))
    with ServerThread(create_app(settings)) as server, httpx.Client(
            base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=20) as admin:
        yield server.url, admin


def _key(admin: httpx.Client, limits: dict[str, int]) -> dict[str, str]:
    tenant = admin.post("/admin/v1/tenants", json={"name": f"t-{uuid.uuid4().hex[:8]}"}).json()["id"]
    key = admin.post("/admin/v1/keys", json={"tenant_id": tenant}).json()
    admin.put(f"/admin/v1/keys/{key['id']}/limits", json=limits).raise_for_status()
    return {"authorization": f"Bearer {key['key']}"}


@pytest.mark.parametrize(("path", "body"), [
    ("/tokenize", {"model": "tiny", "prompt": "many words " * 100}),
    ("/detokenize", {"model": "tiny", "tokens": [5, 6, 7]}),
])
def test_a_tokenizer_call_counts_against_requests_per_minute(
        gateway: tuple[str, httpx.Client], path: str, body: dict[str, object]) -> None:
    url, admin = gateway
    auth = _key(admin, {"requests_per_minute": 2, "tokens_per_minute": 50})
    assert httpx.post(url + path, json=body | {"frob": 1}, headers=auth).status_code == 400  # not counted
    first = httpx.post(url + path, json=body, headers=auth)
    assert first.status_code == 200, first.text
    assert (first.headers["x-ratelimit-limit-requests"], first.headers["x-ratelimit-remaining-requests"],
            first.headers["x-ratelimit-remaining-tokens"]) == ("2", "1", "50")
    assert httpx.post(url + path, json=body, headers=auth).status_code == 200
    refused = httpx.post(url + path, json=body, headers=auth)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
