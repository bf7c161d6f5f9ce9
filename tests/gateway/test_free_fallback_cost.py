"""A request a free (or unpriced) fallback answers costs nothing: its usage row keeps 0.0 rather
than being priced at the requested model's price. The real app on PostgreSQL, the openai SDK as
the client, a primary deployment that is down and the fake upstream behind the free fallback."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest

from gateway.db import Database
from gateway.db.models import UsageRow
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.tenancy_fixtures import migrated_pg_url  # noqa: F401  (fixture)
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import ServerThread
from tests.support.usage_rows import usage_row

DOWN = "http://127.0.0.1:9"  # nothing listens: the primary's connection is refused


async def _row(url: str, request_id: str) -> UsageRow:
    db = Database.from_url(url)
    try:
        return await usage_row(db, request_id)
    finally:
        await db.dispose()


@pytest.mark.parametrize("fallback_price", [{"input_per_million": 0.0, "output_per_million": 0.0}, None],
                         ids=["priced-free", "unpriced"])
async def test_an_answer_from_a_free_fallback_costs_nothing(migrated_pg_url: str,
                                                            fake_upstream_server: FakeUpstream,
                                                            tmp_path_factory: pytest.TempPathFactory,
                                                            fallback_price: dict[str, float] | None) -> None:
    """Priced at 0, or not priced at all (an answer is priced at the model that gave it)."""
    from gateway.app import create_app

    fake_upstream_server.reset()
    dep = {"provider": "openai", "model": "upstream-echo", "api_key": "sk-up",
           "timeouts": {"connect": 2, "first_byte": 5, "total": 10}}
    settings = gateway_settings(
        fake_upstream_server.url, database={"url": migrated_pg_url},
        usage={"journal_dir": str(tmp_path_factory.mktemp("free-fallback") / "journal")},
        models=[{"name": "dear", "deployments": [dep | {"api_base": DOWN}], "fallbacks": ["self-hosted"]},
                {"name": "self-hosted", "deployments": [dep | {"api_base": fake_upstream_server.url}]}],
        prices={"dear": {"input_per_million": 50.0, "output_per_million": 100.0}}
        | ({"self-hosted": fallback_price} if fallback_price else {}),
    )
    with ServerThread(create_app(settings)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30,
                                     headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin:
            tenant = (await admin.post("/admin/v1/tenants", json={"name": f"ff-{uuid.uuid4().hex[:8]}"})).json()
            key = (await admin.post("/admin/v1/keys", json={"tenant_id": tenant["id"]})).json()["key"]
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
        raw = await client.chat.completions.with_raw_response.create(
            model="dear", max_tokens=20, messages=[{"role": "user", "content": "hello there"}])
        reply = raw.parse()
        assert reply.usage is not None and reply.usage.total_tokens > 0
        row = await _row(migrated_pg_url, raw.headers["x-request-id"])
    assert row.status == 200 and row.prompt_tokens > 0, (row.status, row.deployment)
    assert row.cost == 0.0, row.cost
