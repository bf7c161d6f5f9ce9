"""Faults with real processes: a replica SIGKILLed under load, and Redis restarted empty.

Afterwards every request has exactly one usage row (those the process died in are settled from
their reservations, marked incomplete), the Redis budget equals what the rows show, and the tenant
is served again within the concurrency lease (2 s here, ``quotas.lease_seconds``).
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis import Redis

from gateway.db import migrate
from tests.conftest import ADMIN_KEY
from tests.support.fake_upstream import FakeUpstream
from tests.support.redis_server import RedisProcess
from tests.support.serve_process import start_serve

LEASE = 2.0
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "你好，世界 🙂 hello"}], "max_tokens": 50}


@pytest.fixture
def redis_server() -> Any:
    server = RedisProcess().start()
    yield server
    server.stop()


def _config(tmp_path: Path, upstream: FakeUpstream, redis_url: str) -> dict[str, Any]:
    return {
        "auth": {"admin_key": ADMIN_KEY, "key_cache_seconds": 1},
        "database": {"url": f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}"},
        "redis": {"url": redis_url},
        "quotas": {"lease_seconds": LEASE},
        "usage": {"journal_dir": str(tmp_path / "journal")},
        "models": [{"name": "echo", "deployments": [
            {"provider": "openai", "model": "upstream-echo", "api_base": upstream.url, "api_key": "k"}]}],
        "prices": {"echo": {"input_per_million": 10.0, "output_per_million": 20.0}},
    }  # fmt: skip


def _tenant(url: str, **limits: Any) -> tuple[str, str]:
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=20) as a:
        tid = a.post("/admin/v1/tenants", json={"name": f"f-{uuid.uuid4().hex[:8]}"}).json()["id"]
        assert a.put(f"/admin/v1/tenants/{tid}/limits", json=limits).status_code == 200
        return tid, a.post("/admin/v1/keys", json={"tenant_id": tid}).json()["key"]


def _rows(tmp_path: Path, tid: str) -> list[tuple[int, str | None, int]]:
    with sqlite3.connect(tmp_path / "usage.db") as conn:
        return conn.execute("SELECT status, error_type, prompt_tokens + completion_tokens FROM usage_records "
                            "WHERE tenant_id = ?", (tid,)).fetchall()


def _money(tmp_path: Path, tid: str) -> float:
    with sqlite3.connect(tmp_path / "usage.db") as conn:
        return float(conn.execute("SELECT SUM(cost) FROM usage_records WHERE tenant_id = ?", (tid,)).fetchone()[0])


def _wait_rows(tmp_path: Path, tid: str, count: int) -> list[tuple[int, str | None, int]]:
    deadline = time.monotonic() + 20
    while len(rows := _rows(tmp_path, tid)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return rows


def _budget_tokens(redis_url: str, tid: str, field: str = "tokens") -> int:
    with Redis.from_url(redis_url) as r:
        return int(r.hget(f"sy:q:tenant:{tid}:bd:total", field) or 0)


def _post(url: str, key: str) -> int:
    return httpx.post(url + "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {key}"},
                      timeout=20).status_code


async def test_sigkill_mid_load_meters_every_request_and_frees_the_slots_within_the_lease(
    upstream: FakeUpstream, redis_server: RedisProcess, tmp_path: Path
) -> None:
    await asyncio.to_thread(migrate.upgrade, f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    upstream.options.output_words, upstream.options.chunk_delay = 40, 0.25  # a stream takes ~10 s
    config = _config(tmp_path, upstream, redis_server.url)
    proc, url, _ = start_serve(config, tmp_path)
    statuses: list[int] = []
    try:
        tid, key = _tenant(url, max_concurrency=3, token_budget=1_000_000, budget_period="total")
        statuses += [_post(url, key) for _ in range(5)]
        started = asyncio.Event()
        firsts = 0

        async def stream(client: httpx.AsyncClient) -> None:
            nonlocal firsts
            async with client.stream("POST", "/v1/chat/completions", json=CHAT | {"stream": True}) as response:
                first = True
                async for _ in response.aiter_bytes():  # read on until the process dies
                    firsts += first
                    first = False
                    if firsts == 3:
                        started.set()

        async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=30) as c:
            streams = [asyncio.create_task(stream(c)) for _ in range(3)]
            await asyncio.wait_for(started.wait(), 20)
            statuses.append(await asyncio.to_thread(_post, url, key))  # a 4th at once: concurrency 3
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            await asyncio.gather(*streams, return_exceptions=True)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert statuses == [200] * 5 + [429]
    proc, url, log = start_serve(config, tmp_path)  # the replacement replays the dead writer's files
    try:
        killed_at = time.monotonic()
        while (status := _post(url, key)) == 429 and time.monotonic() - killed_at < 30:
            statuses.append(status)
            time.sleep(0.2)
        statuses.append(status)
        assert status == 200, log.read_text()[-2000:]
        served_after = time.monotonic() - killed_at
        rows = _wait_rows(tmp_path, tid, len(statuses) + 3)
    finally:
        proc.terminate()
        proc.wait(30)
    assert served_after <= LEASE + 5  # the dead replica's slots freed themselves within about a lease
    assert len(rows) == len(statuses) + 3  # every answered request, and the three it died in
    assert sorted(s for s, e, _ in rows if e != "incomplete") == sorted(statuses)
    incomplete = [t for s, e, t in rows if e == "incomplete"]
    assert len(incomplete) == 3 and all(t > 50 for t in incomplete)  # settled at what they reserved
    assert _budget_tokens(redis_server.url, tid) == sum(t for _, _, t in rows)  # the budget and the rows agree
    picos = _budget_tokens(redis_server.url, tid, "micros") * 10**6 + _budget_tokens(redis_server.url, tid, "picos")
    assert abs(picos - _money(tmp_path, tid) * 1e12) <= len(rows)  # in money too (to a pico-dollar a row)


async def test_redis_restarted_empty_never_hands_the_budget_out_twice(
    upstream: FakeUpstream, redis_server: RedisProcess, tmp_path: Path
) -> None:
    await asyncio.to_thread(migrate.upgrade, f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    upstream.options.output_words = 30
    proc, url, log = start_serve(_config(tmp_path, upstream, redis_server.url), tmp_path)
    try:
        tid, key = _tenant(url, token_budget=1200, budget_period="total")
        first = [_post(url, key) for _ in range(3)]
        rows = _wait_rows(tmp_path, tid, 3)
        spent = sum(t for _, _, t in rows)
        redis_server.stop()
        redis_server.start()  # same port, no data
        statuses: list[int] = []
        while len(statuses) < 40 and (not statuses or statuses[-1] == 200):
            statuses.append(_post(url, key))
        rows = _wait_rows(tmp_path, tid, 3 + len(statuses))
    finally:
        proc.terminate()
        proc.wait(30)
    assert first == [200, 200, 200] and spent > 0
    assert statuses[-1] == 429, log.read_text()[-2000:]  # the budget ran out, counting what was spent before
    total = sum(t for _, _, t in rows)
    assert len(rows) == 3 + len(statuses) and total <= 1200
    assert _budget_tokens(redis_server.url, tid) == total  # rebuilt from the rows, then counted on
