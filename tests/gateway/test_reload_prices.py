"""A config reload that adds or reprices a model: every consumer of prices sees the new ones (the
money admission reserves, the cost of usage records, the model_prices table), so a tenant's cost
budget holds for the new model. The real app on PostgreSQL and Redis, the fake upstream behind it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import select

from gateway.contracts import UsageRecord
from gateway.db import Database, migrate
from gateway.db.models import ModelPrice, UsageRow
from gateway.services import Tenancy
from gateway.settings import load_settings, parse_settings
from tests.conftest import ADMIN_KEY
from tests.gateway.tenancy_fixtures import REDIS_URL, migrated_pg_url  # noqa: F401  (fixture)
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import ServerThread

BUDGET = 0.25  # USD
PRICE = 1000.0  # USD per million tokens, input and output: each request reserves about $0.19
WORDS = " ".join(f"w{i}" for i in range(20))


def _config(upstream: str, db_url: str, journal: Path, *, pricey: bool) -> dict[str, Any]:
    dep = {"provider": "openai", "model": "upstream-echo", "api_base": upstream, "api_key": "sk-up"}
    config: dict[str, Any] = {
        "auth": {"admin_key": ADMIN_KEY},
        "database": {"url": db_url},
        "redis": {"url": REDIS_URL},
        "usage": {"journal_dir": str(journal)},
        "models": [{"name": "echo", "deployments": [dep]}],
        "prices": {"echo": {"input_per_million": 1.0, "output_per_million": 2.0}},
    }
    if pricey:
        config["models"].append({"name": "pricey", "deployments": [dep | {"name": "pricey-dep"}]})
        config["prices"]["pricey"] = {"input_per_million": PRICE, "output_per_million": PRICE}
    return config


@pytest.fixture(scope="module")
def gateway(migrated_pg_url: str, fake_upstream_server: FakeUpstream,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, Path, dict[str, Any]]]:
    from gateway.app import create_app

    work = tmp_path_factory.mktemp("reload-prices")
    path = work / "gw.yaml"
    path.write_text(yaml.safe_dump(_config(fake_upstream_server.url, migrated_pg_url, work / "journal", pricey=False)))
    app = create_app(load_settings(path, env={}), config_path=path)
    with ServerThread(app) as server:
        yield server, path, {"upstream": fake_upstream_server.url, "db": migrated_pg_url, "journal": work / "journal"}


def _admin() -> dict[str, str]:
    return {"authorization": f"Bearer {ADMIN_KEY}"}


async def _chat(client: httpx.AsyncClient, key: str, model: str) -> int:
    r = await client.post("/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                          json={"model": model, "max_tokens": 30, "messages": [{"role": "user", "content": WORDS}]})
    return r.status_code


async def test_a_reloaded_price_holds_the_cost_budget(gateway: tuple[ServerThread, Path, dict[str, Any]],
                                                     migrated_pg_url: str) -> None:
    server, path, where = gateway
    path.write_text(yaml.safe_dump(_config(where["upstream"], where["db"], where["journal"], pricey=True)))
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        r = await client.post("/admin/v1/reload", headers=_admin())
        assert r.status_code == 200 and "pricey" in r.json()["models"], r.text
        t = (await client.post("/admin/v1/tenants", json={"name": f"rp-{uuid.uuid4().hex[:8]}"},
                               headers=_admin())).json()
        key = (await client.post("/admin/v1/keys", json={"tenant_id": t["id"]}, headers=_admin())).json()["key"]
        r = await client.put(f"/admin/v1/tenants/{t['id']}/limits", headers=_admin(),
                             json={"cost_budget": BUDGET, "budget_period": "day"})
        assert r.status_code == 200, r.text

        # Ten at once: admission reserves each one's worst-case price, so only what fits is admitted.
        codes = await asyncio.gather(*[_chat(client, key, "pricey") for _ in range(10)])
        assert set(codes) <= {200, 429} and 429 in codes, codes
        for _ in range(10):  # then one by one until the budget refuses
            if await _chat(client, key, "pricey") == 429:
                break
        else:
            raise AssertionError("the cost budget never refused a request")

    db = Database.from_url(migrated_pg_url)
    try:
        deadline = time.monotonic() + 10
        while True:  # the usage writer flushes in the background
            async with db.session() as s:
                rows = (await s.scalars(select(UsageRow).where(UsageRow.tenant_id == t["id"]))).all()
            if len(rows) >= len(codes) + 1 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        served = [r for r in rows if r.status == 200]
        assert served and all(r.cost > 0 for r in served), [(r.status, r.cost) for r in rows]
        assert sum(r.cost for r in served) <= BUDGET, [r.cost for r in served]
        async with db.session() as s:  # as at start-up, the reloaded prices are in model_prices
            price = await s.get(ModelPrice, "pricey")
        assert price is not None and price.input_per_million == PRICE and price.output_per_million == PRICE
    finally:
        await db.dispose()


def test_every_price_consumer_shares_the_reloaded_table(gateway: tuple[ServerThread, Path, dict[str, Any]]) -> None:
    """Admission and the usage writer read the one table a reload updates (a repriced model here)."""
    server, path, where = gateway
    config = _config(where["upstream"], where["db"], where["journal"], pricey=True)
    config["prices"]["pricey"] = {"input_per_million": 7.0, "output_per_million": 9.0}
    path.write_text(yaml.safe_dump(config))
    assert httpx.post(server.url + "/admin/v1/reload", headers=_admin()).status_code == 200
    services = server.app.state["services"]
    writer = getattr(services.usage, "inner", services.usage)  # under the metrics wrapper
    assert services.admission.prices.max_per_million("pricey") == 9.0
    assert writer.prices.max_per_million("pricey") == 9.0


async def test_a_request_cut_short_is_priced_at_the_reloaded_price(tmp_path: Path) -> None:
    """What a killed process leaves of a request (its reservation, journaled by ``begin``) is
    priced as admission reserved it, with the price the reload brought."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'sy.db'}"
    await asyncio.to_thread(migrate.upgrade, url)
    dep = {"provider": "openai", "model": "m", "api_base": "http://127.0.0.1:9", "api_key": "k"}
    base = {"database": {"url": url}, "usage": {"journal_dir": str(tmp_path / "journal")},
            "models": [{"name": "echo", "deployments": [dep]}]}
    tenancy = Tenancy.from_settings(parse_settings(base, env={}))
    await tenancy.start()
    try:
        fresh = {**base, "models": [*base["models"], {"name": "new", "deployments": [dep | {"name": "d2"}]}],
                 "prices": {"new": {"input_per_million": 2.0, "output_per_million": 4.0}}}
        tenancy.reload_prices(parse_settings(fresh, env={}))
        record = UsageRecord(request_id=f"req-{uuid.uuid4().hex}", key_id="key_x", tenant_id=None, model="new",
                             deployment=None, provider=None, endpoint="chat.completions", started_at=time.time(),
                             status=200, prompt_tokens=100, completion_tokens=150)
        tenancy.usage.begin(record)
        assert record.cost == pytest.approx(250 * 4.0 / 1e6)
        tenancy.usage.record(record)  # settled: the row is no longer open
        await asyncio.wait(list(tenancy._syncing), timeout=10)
        async with tenancy.db.session() as s:
            stored = await s.get(ModelPrice, "new")
        assert stored is not None and stored.output_per_million == 4.0
    finally:
        await tenancy.aclose()
