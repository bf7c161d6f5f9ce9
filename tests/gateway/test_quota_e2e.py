"""Quotas across replicas: two gateway processes sharing one Redis and one PostgreSQL database,
hammered concurrently through the openai SDK."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import msgspec
import openai
import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select

from backends.estimate import bound_chat_prompt
from backends.openai_wire import ChatCompletionRequest
from gateway.db import Database
from gateway.db.models import UsageRow
from tests.conftest import ADMIN_KEY
from tests.gateway.tenancy_fixtures import (  # noqa: F401
    REDIS_URL,
    GatewayProcess,
    database,
    gateway_processes,
    pg_url,
    redis,
)
from tests.support.fake_upstream import FakeUpstream

CHAT = [{"role": "user", "content": "hello there general kenobi"}]
# what admission reserves for one of these requests with max_tokens=20: the prompt's byte bound plus 20
RESERVED = bound_chat_prompt(msgspec.convert({"model": "echo", "messages": CHAT}, ChatCompletionRequest)) + 20


def shared_config(pg_url: str, upstream: FakeUpstream) -> dict[str, Any]:
    """Gateways sharing this module's PostgreSQL and Redis, model ``echo`` priced, keys cached for 1 s."""
    return {
        "auth": {"admin_key": ADMIN_KEY, "key_cache_seconds": 1},
        "database": {"url": pg_url},
        "redis": {"url": REDIS_URL},
        "models": [{"name": "echo", "deployments": [
            {"provider": "openai", "model": "upstream-echo", "api_base": upstream.url, "api_key": "sk-up"}]}],
        "prices": {"echo": {"input_per_million": 10.0, "output_per_million": 10.0}},
    }  # fmt: skip


@pytest.fixture(scope="module")
def gateways(
    pg_url: str, database: Database, fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[GatewayProcess]]:
    workdir = tmp_path_factory.mktemp("gateways")
    with gateway_processes(shared_config(pg_url, fake_upstream_server), workdir, ["gw0", "gw1"]) as procs:
        yield procs


def admin(gw: GatewayProcess) -> httpx.Client:
    return httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=20)


ISSUED: list[str] = []  # every key handed out, to check none of them reaches a log
KEY_IDS: dict[str, str] = {}  # tenant id -> its key's id, for cleaning up Redis


def tenant_key(gw: GatewayProcess, **limits: Any) -> tuple[str, str]:
    with admin(gw) as a:
        tid = a.post("/admin/v1/tenants", json={"name": f"q-{uuid.uuid4().hex[:8]}"}).json()["id"]
        assert a.put(f"/admin/v1/tenants/{tid}/limits", json=limits).status_code == 200
        created = a.post("/admin/v1/keys", json={"tenant_id": tid}).json()
        ISSUED.append(created["key"])
        KEY_IDS[tid] = created["id"]
        return tid, created["key"]


async def hammer(gateways: list[GatewayProcess], key: str, n: int, **kwargs: Any) -> list[Any]:
    """``n`` concurrent chat requests, alternating between the gateways; results or exceptions."""
    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=n + 10), timeout=60)
    clients = [
        openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, http_client=http) for gw in gateways
    ]
    try:
        calls = [
            clients[i % len(clients)].chat.completions.create(model="echo", **({"messages": CHAT} | kwargs))
            for i in range(n)
        ]  # type: ignore[arg-type]
        return await asyncio.gather(*calls, return_exceptions=True)
    finally:
        await http.aclose()


async def hammer_past_credit(gateways: list[GatewayProcess], key: str, n: int, more: int, **kwargs: Any) -> list[Any]:
    """``hammer`` with ``n`` requests, then, after two seconds and a quarter, ``more`` (few enough to
    be counted one by one). A replica that admitted 20 requests in a second admits on credit the next
    (credit.py): the credit it has not used (at most a sixteenth of a limit) is refused to the
    others until it hands it back at its next tick. The tick just after the burst hands back and,
    the second before having been busy, takes credit again (what is left of the limit, if any); the
    tick after that, a second later, hands it back for good: two seconds after the burst at most.
    The later requests find it there."""
    results = await hammer(gateways, key, n, **kwargs)
    await asyncio.sleep(2.25)
    return results + await hammer(gateways, key, more, **kwargs)


async def cleanup(redis: Redis, tid: str) -> None:
    keys = [k for sid in {tid, KEY_IDS.get(tid, tid)} async for k in redis.scan_iter(match=f"sy:q:*{sid}*", count=1000)]
    if keys:
        await redis.delete(*keys)


async def rows_of(db: Database, tid: str) -> tuple[int, int, float]:
    async with db.session() as s:
        q = select(
            func.count(), func.coalesce(func.sum(UsageRow.prompt_tokens + UsageRow.completion_tokens), 0),
            func.coalesce(func.sum(UsageRow.cost), 0.0),
        ).where(UsageRow.tenant_id == tid)  # fmt: skip
        count, tokens, cost = (await s.execute(q)).one()
    return int(count), int(tokens), float(cost)


async def rows_by_status(db: Database, tid: str) -> dict[int, int]:
    async with db.session() as s:
        q = select(UsageRow.status, func.count()).where(UsageRow.tenant_id == tid).group_by(UsageRow.status)
        return {int(status): int(n) for status, n in (await s.execute(q)).all()}


async def wait_rows(db: Database, tid: str, count: int) -> tuple[int, int, float]:
    for _ in range(150):
        got = await rows_of(db, tid)
        if got[0] >= count:
            return got
        await asyncio.sleep(0.1)
    return await rows_of(db, tid)


async def test_requests_per_minute_exact_across_two_replicas(
    gateways: list[GatewayProcess], database: Database, redis: Redis
) -> None:
    tid, key = tenant_key(gateways[0], requests_per_minute=100)
    try:
        results = await hammer_past_credit(gateways, key, 300, 20, max_tokens=3)
        ok = [r for r in results if not isinstance(r, BaseException)]
        limited = [r for r in results if isinstance(r, openai.RateLimitError)]
        assert len(ok) == 100 and len(limited) == 220, {type(r).__name__ for r in results}
        assert all(int(e.response.headers["retry-after"]) >= 1 for e in limited)
        assert (await wait_rows(database, tid, 320))[0] == 320  # one usage row per request, 429s included
        assert (await rows_by_status(database, tid)) == {200: 100, 429: 220}
    finally:
        await cleanup(redis, tid)


async def test_token_budget_never_overspent_under_concurrency(
    gateways: list[GatewayProcess], database: Database, redis: Redis
) -> None:
    budget = 600
    tid, key = tenant_key(gateways[1], token_budget=budget, budget_period="day")
    try:
        admitted = 0
        for _ in range(3):  # waves: reservations are corrected to the actual use in between
            results = await hammer(gateways, key, 60, max_tokens=20)
            admitted += sum(not isinstance(r, BaseException) for r in results)
            assert any(isinstance(r, openai.RateLimitError) for r in results)
            assert all(isinstance(r, openai.RateLimitError) for r in results if isinstance(r, BaseException))
        count, tokens, _ = await wait_rows(database, tid, 180)
        assert count == 180 and (await rows_by_status(database, tid))[200] == admitted
        assert admitted >= budget // RESERVED  # tokens reserved per request
        assert tokens <= budget
    finally:
        await cleanup(redis, tid)


MULTIBYTE = [{"role": "user", "content": "请用中文详细解释量子计算的基本原理 🙂🚀🎉 以及它和经典计算的区别"}]


async def test_multibyte_prompts_never_overspend_the_budget(
    gateways: list[GatewayProcess], database: Database, redis: Redis, fake_upstream_server: FakeUpstream
) -> None:
    """Chinese and emoji cost a token a byte upstream here (a character count would reserve a
    quarter of that): the reservations still bound the spend, under concurrency on two replicas."""
    budget = 4000
    tid, key = tenant_key(gateways[0], token_budget=budget, budget_period="total")
    fake_upstream_server.byte_tokens = True
    try:
        costs: list[int] = []  # of every request admitted (the last round may find the budget spent)
        for _ in range(3):
            results = await hammer(gateways, key, 30, max_tokens=10, messages=MULTIBYTE)
            costs += [r.usage.total_tokens for r in results if not isinstance(r, BaseException)]
        admitted = len(costs)
        count, tokens, _ = await wait_rows(database, tid, 90)
        assert count == 90 and (await rows_by_status(database, tid))[200] == admitted > 0
        assert costs and min(costs) > 100  # what each request really cost upstream
        assert budget // 2 < tokens <= budget  # most of the budget spent, never more
        for _ in range(50):  # a replica on credit sends its corrections with the next second's give-back
            spent = await redis.hget(f"sy:q:tenant:{tid}:bd:total", "tokens")
            if int(spent) == tokens:
                break
            await asyncio.sleep(0.1)
        assert int(spent) == tokens  # the budget counter agrees with the usage rows
    finally:
        fake_upstream_server.byte_tokens = False
        await cleanup(redis, tid)


async def test_money_budget_never_overspent_under_concurrency(
    gateways: list[GatewayProcess], database: Database, redis: Redis
) -> None:
    budget = 0.01  # USD; at 10 USD per million tokens a request reserving ~110 tokens reserves ~0.0011
    tid, key = tenant_key(gateways[0], cost_budget=budget, budget_period="total")
    try:
        admitted = 0
        for _ in range(2):
            results = await hammer(gateways, key, 40, max_tokens=20)
            admitted += sum(not isinstance(r, BaseException) for r in results)
            assert any(isinstance(r, openai.RateLimitError) for r in results)
        count, _, cost = await wait_rows(database, tid, 80)
        assert count == 80 and (await rows_by_status(database, tid))[200] == admitted >= budget // (RESERVED * 1e-5)
        assert 0 < cost <= budget
    finally:
        await cleanup(redis, tid)


async def test_busy_key_on_credit_is_counted_exactly(
    gateways: list[GatewayProcess], database: Database, redis: Redis
) -> None:
    """Hundreds of requests a second on one key: both replicas admit on credit (credit.py), and
    once they hand back what they did not use, Redis holds exactly what the usage records hold."""
    tid, key = tenant_key(gateways[0], requests_per_minute=100_000, token_budget=10**8, budget_period="day")
    seen: list[bytes] = []  # concurrency slots a replica took with its credit

    async def watch() -> None:
        while not seen:
            seen.extend(m for m in await redis.zrange(f"sy:q:tenant:{tid}:cc", 0, -1) if m.startswith(b"pool:"))
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    try:
        for _ in range(4):
            results = await hammer(gateways, key, 100, max_tokens=5)
            assert not [r for r in results if isinstance(r, BaseException)]
        await asyncio.wait_for(watcher, 5)
        count, tokens, _ = await wait_rows(database, tid, 400)
        assert count == 400
        budget = f"sy:q:tenant:{tid}:bd:{datetime.now(UTC).strftime('d%Y%m%d')}"
        for _ in range(50):  # the next second's give-back (acknowledged a moment later)
            counted = await redis.hmget(f"sy:q:tenant:{tid}:win", ["rs"])
            spent = await redis.hmget(budget, ["tokens"])
            if int(counted[0] or 0) == 400 and int(spent[0] or 0) == tokens:
                break
            await asyncio.sleep(0.1)
        assert (int(counted[0] or 0), int(spent[0] or 0)) == (400, tokens)
        for _ in range(50):  # and the slots once the key is quiet
            if not await redis.zcard(f"sy:q:tenant:{tid}:cc"):
                break
            await asyncio.sleep(0.1)
        assert await redis.zcard(f"sy:q:tenant:{tid}:cc") == 0
    finally:
        watcher.cancel()
        await cleanup(redis, tid)


async def test_concurrency_limit_across_replicas(
    gateways: list[GatewayProcess], redis: Redis, upstream: FakeUpstream
) -> None:
    upstream.options.latency = 0.5  # every admitted request stays in flight for a while
    tid, key = tenant_key(gateways[1], max_concurrency=3)
    try:
        results = await hammer(gateways, key, 20, max_tokens=2)
        assert sum(not isinstance(r, BaseException) for r in results) >= 3
        assert any(isinstance(r, openai.RateLimitError) for r in results)
        # leases are released at settle: a later request is admitted again
        upstream.options.latency = 0.0
        assert not isinstance((await hammer(gateways, key, 1, max_tokens=2))[0], BaseException)
    finally:
        await cleanup(redis, tid)


def test_replica_logs_have_no_tracebacks_and_no_keys(gateways: list[GatewayProcess]) -> None:
    assert ISSUED
    for gw in gateways:
        log = gw.log_path.read_text()
        assert "Traceback" not in log
        assert not [k for k in ISSUED if k in log or k[12:] in log]
