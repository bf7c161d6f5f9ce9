"""Faults around a running gateway: Redis going away and coming back, upstreams that fail, reset
or hang, clients that leave mid-stream in bulk. Answers stay typed and OpenAI-shaped, and nothing
leaks: the gateway's open sockets and asyncio tasks return to where they were."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.db import migrate
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.support.doubles import RecordingSink
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.redis_server import RedisProcess
from tests.support.scripted_gateway import scripted_gateway
from tests.support.servers import ServerThread

CHAT = [{"role": "user", "content": "one two three"}]


# ---------------------------------------------------------------- Redis outage


@pytest.fixture
def redis_server() -> Iterator[RedisProcess]:
    server = RedisProcess().start()
    yield server
    server.stop()


def _tenancy_settings(upstream_url: str, db_url: str, redis_url: str, policy: str, journal: Path) -> Any:
    return gateway_settings(
        upstream_url,
        auth={"admin_key": ADMIN_KEY, "key_cache_seconds": 1},
        database={"url": db_url},
        redis={"url": redis_url, "on_unavailable": policy},
        usage={"journal_dir": str(journal)},
    )


def _status(client: openai.OpenAI) -> tuple[int, Any]:
    try:
        client.chat.completions.create(model="echo", messages=CHAT)  # type: ignore[arg-type]
        return 200, None
    except openai.APIStatusError as exc:
        return exc.status_code, exc.body


@contextmanager
def fail_closed_and_fail_open(
    upstream: FakeUpstream, redis_server: RedisProcess, tmp_path: Path
) -> Iterator[tuple[ServerThread, openai.OpenAI, ServerThread, openai.OpenAI]]:
    """Two gateways on one database and one Redis, ``fail_closed`` and ``fail_open``, each with a
    client for one key (10,000 requests a minute) that both have served once."""
    from gateway.app import create_app

    db_url = f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}"
    migrate.upgrade(db_url)
    closed_app = create_app(_tenancy_settings(upstream.url, db_url, redis_server.url, "fail_closed", tmp_path / "j1"))
    open_app = create_app(_tenancy_settings(upstream.url, db_url, redis_server.url, "fail_open", tmp_path / "j2"))
    with ServerThread(closed_app) as closed_gw, ServerThread(open_app) as open_gw:
        admin = httpx.Client(base_url=closed_gw.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
        tid = admin.post("/admin/v1/tenants", json={"name": f"r-{uuid.uuid4().hex[:6]}"}).json()["id"]
        key = admin.post("/admin/v1/keys", json={"tenant_id": tid}).json()
        assert admin.put(f"/admin/v1/keys/{key['id']}/limits", json={"requests_per_minute": 10_000}).status_code == 200
        admin.close()
        closed = openai.OpenAI(base_url=closed_gw.url + "/v1", api_key=key["key"], max_retries=0, timeout=30)
        opened = openai.OpenAI(base_url=open_gw.url + "/v1", api_key=key["key"], max_retries=0, timeout=30)
        time.sleep(1.1)  # past the key cache TTL, so both see the limits just set
        assert _status(closed)[0] == 200 and _status(opened)[0] == 200
        # Each settlement leaves after its answer, without being waited for: let it be answered
        # before a test stops Redis (one still waiting would time out and tell its gateway first).
        time.sleep(0.5)
        yield closed_gw, closed, open_gw, opened


def test_redis_outage_fail_closed_503_fail_open_serves_and_both_recover(
    upstream: FakeUpstream, redis_server: RedisProcess, tmp_path: Path
) -> None:
    with fail_closed_and_fail_open(upstream, redis_server, tmp_path) as (closed_gw, closed, open_gw, opened):

        redis_server.stop()
        status, body = _status(closed)
        assert status == 503
        assert body["code"] == "quota_unavailable" and body["type"] == "service_unavailable" and body["message"]
        assert _status(opened)[0] == 200  # fail-open keeps serving without counting
        not_ready = httpx.get(closed_gw.url + "/readyz", timeout=10)
        assert not_ready.status_code == 503 and not_ready.json()["dependencies"] == {
            "database": True, "redis": False, "accepting_requests": True}
        assert httpx.get(open_gw.url + "/readyz", timeout=10).json()["dependencies"] == {
            "database": True, "accepting_requests": True}

        redis_server.start()  # the same port: the gateways reconnect without a restart
        deadline = time.monotonic() + 15
        while _status(closed)[0] != 200:
            assert time.monotonic() < deadline, "fail-closed gateway did not recover"
            time.sleep(0.2)
        assert _status(opened)[0] == 200
        assert httpx.get(closed_gw.url + "/readyz", timeout=10).json()["dependencies"]["redis"] is True


def test_a_silent_redis_holds_up_the_requests_that_found_it_not_every_one_after(
    upstream: FakeUpstream, redis_server: RedisProcess, tmp_path: Path
) -> None:
    """Redis stops answering (paused: connections open, no replies). The request that finds out
    waits for the 2 s timeout; the ones after it get their policy's answer at once (fail_open:
    served; fail_closed: 503) instead of each waiting 2 s, until Redis answers again."""
    with fail_closed_and_fail_open(upstream, redis_server, tmp_path) as (_, closed, _, opened):

        redis_server.pause()
        try:
            for client, expected in ((closed, 503), (opened, 200)):
                t0 = time.monotonic()
                assert _status(client)[0] == expected  # this one waited for Redis's timeout
                assert time.monotonic() - t0 >= 1.5
                t0 = time.monotonic()
                assert [_status(client)[0] for _ in range(20)] == [expected] * 20
                assert time.monotonic() - t0 < 10  # not 20 x 2 s
        finally:
            redis_server.resume()
        deadline = time.monotonic() + 15
        while _status(closed)[0] != 200:
            assert time.monotonic() < deadline, "fail-closed gateway did not recover"
            time.sleep(0.1)
        assert _status(opened)[0] == 200


def test_a_budget_holds_through_a_redis_pause_under_fail_open(
    upstream: FakeUpstream, redis_server: RedisProcess, tmp_path: Path
) -> None:
    """A tenant's budget leaves room for 11 requests' tokens and one more reservation. It spends 2,
    then 6 more while Redis is paused (served fail-open; the bucket stays in Redis, and the
    reservation of the request that found Redis silent runs there when it resumes). Once Redis
    answers again the budget counts each of the 8 once: exactly 4 more requests are served, then
    ``insufficient_quota``."""
    from gateway.app import create_app

    db_url = f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}"
    migrate.upgrade(db_url)
    app = create_app(_tenancy_settings(upstream.url, db_url, redis_server.url, "fail_open", tmp_path / "j"))
    with ServerThread(app) as gw, httpx.Client(
        base_url=gw.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10
    ) as admin:
        tid = admin.post("/admin/v1/tenants", json={"name": f"b-{uuid.uuid4().hex[:6]}"}).json()["id"]
        key = admin.post("/admin/v1/keys", json={"tenant_id": tid}).json()
        assert admin.put(f"/admin/v1/tenants/{tid}/limits", json={"tokens_per_minute": 10**6}).status_code == 200
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key=key["key"], max_retries=0, timeout=30)
        raw = client.chat.completions.with_raw_response.create(model="echo", messages=CHAT, max_tokens=8)  # type: ignore[arg-type]
        reserved = 10**6 - int(raw.headers["x-ratelimit-remaining-tokens"])  # what each request reserves
        usage = raw.parse().usage
        assert usage is not None
        used = usage.total_tokens  # what each request uses
        limits = {"token_budget": 11 * used + reserved, "budget_period": "total"}
        assert admin.put(f"/admin/v1/tenants/{tid}/limits", json=limits).status_code == 200
        time.sleep(1.1)  # past the limits cache's TTL

        def spend() -> int:
            try:
                client.chat.completions.create(model="echo", messages=CHAT, max_tokens=8)  # type: ignore[arg-type]
                return 200
            except openai.APIStatusError as exc:
                assert exc.code == "insufficient_quota", exc.body
                return exc.status_code

        assert spend() == 200  # the bucket is rebuilt from the records: 2 requests' tokens
        time.sleep(0.5)  # its settlement acknowledged
        redis_server.pause()
        try:
            assert [spend() for _ in range(6)] == [200] * 6  # served without counting
        finally:
            redis_server.resume()
        time.sleep(2.0)  # the gateway finds Redis again
        after = [spend() for _ in range(6)]
        assert after == [200] * 4 + [429] * 2  # 8 + 4 requests' tokens: no room for a 13th reservation


# ---------------------------------------------------------------- upstream faults, leaks


class ResetServer:
    """Accepts TCP connections, reads the request, and resets the connection (RST)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    def close(self) -> None:
        self.sock.close()


class LeakCheckedGateway:
    def __init__(self, server: ServerThread, usage: RecordingSink) -> None:
        self.server, self.usage = server, usage
        self.loop: asyncio.AbstractEventLoop = server._server.servers[0].get_loop()

    def tasks(self) -> int:
        async def count() -> int:
            return len(asyncio.all_tasks())

        return asyncio.run_coroutine_threadsafe(count(), self.loop).result(5)


def open_sockets() -> int:
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        try:
            count += os.readlink(fd).startswith("socket:")
        except OSError:
            pass
    return count


@pytest.fixture(scope="module")
def leak_gateway(fake_upstream_server: FakeUpstream) -> Iterator[LeakCheckedGateway]:
    reset = ResetServer()
    timeouts = {"connect": 2, "first_byte": 5, "total": 10}
    deployment = {"provider": "openai", "model": "upstream-echo", "api_base": fake_upstream_server.url,
                  "api_key": "sk-up", "timeouts": timeouts}
    plain = {"max_retries": 0, "circuit": {"failures": 1_000_000}}
    settings = gateway_settings(fake_upstream_server.url, models=[
        {"name": "echo", "deployments": [deployment], **plain},
        {"name": "impatient", "deployments": [deployment | {"name": "impatient-dep",
                                                            "timeouts": timeouts | {"first_byte": 0.5, "total": 1}}],
         **plain},
        {"name": "reset", "deployments": [deployment | {"name": "reset-dep",
                                                        "api_base": f"http://127.0.0.1:{reset.port}/v1"}], **plain},
    ])  # fmt: skip
    usage = RecordingSink()
    with scripted_gateway(settings, usage=usage) as server:
        yield LeakCheckedGateway(server, usage)
    reset.close()


def _fault_round(client: openai.OpenAI, upstream: FakeUpstream) -> list[tuple[str, int | str]]:
    """One pass over every upstream fault; what the client saw for each."""
    seen: list[tuple[str, int | str]] = []

    def call(name: str, model: str = "echo", stream: bool = False) -> None:
        try:
            if stream:
                for _ in client.chat.completions.create(model=model, messages=CHAT, stream=True):  # type: ignore[arg-type]
                    pass
            else:
                client.chat.completions.create(model=model, messages=CHAT)  # type: ignore[arg-type]
            seen.append((name, 200))
        except openai.APIStatusError as exc:
            seen.append((name, exc.status_code))
        except openai.APIError as exc:  # an error event mid-stream
            seen.append((name, f"stream-error:{exc.message[:20]}"))

    for status in (500, 502, 503):
        upstream.fail_next(Fault(status=status))
        call(f"http-{status}")
    upstream.fail_next(Fault(status=200, body=b"{not json"))
    call("garbage-200")
    upstream.fail_next(Fault(error_after_chunks=2))
    call("error-mid-stream", stream=True)
    upstream.fail_next(Fault(hang_after_chunks=1))
    call("hang-mid-stream", "impatient", stream=True)
    upstream.fail_next(Fault(delay=3))
    call("hang-before-headers", "impatient")
    call("reset", "reset")
    call("reset-stream", "reset", stream=True)
    return seen


def test_upstream_failures_are_typed_and_leak_nothing(leak_gateway: LeakCheckedGateway,
                                                       upstream: FakeUpstream) -> None:
    with openai.OpenAI(base_url=leak_gateway.server.url + "/v1", api_key=ADMIN_KEY, max_retries=0,
                       timeout=15) as client:
        first = _fault_round(client, upstream)
        time.sleep(0.3)
        sockets, tasks = open_sockets(), leak_gateway.tasks()
        for _ in range(2):
            assert _fault_round(client, upstream) == first
        time.sleep(0.3)
        assert open_sockets() <= sockets and leak_gateway.tasks() <= tasks
    outcome = dict(first)
    assert {name: outcome[name] for name in ("http-500", "http-502", "http-503", "garbage-200", "hang-before-headers",
                                             "reset", "reset-stream")} == {
        "http-500": 503, "http-502": 503, "http-503": 503, "garbage-200": 502, "hang-before-headers": 504,
        "reset": 503, "reset-stream": 503,
    }  # fmt: skip
    assert str(outcome["error-mid-stream"]).startswith("stream-error")  # an OpenAI error event, then the end
    assert str(outcome["hang-mid-stream"]).startswith("stream-error")
    assert all(r.status != 500 for r in leak_gateway.usage.records)


async def test_bulk_client_disconnects_mid_stream(leak_gateway: LeakCheckedGateway, upstream: FakeUpstream) -> None:
    upstream.options.output_words, upstream.options.chunk_delay = 50, 0.05  # 2.5 s per stream
    count = 40
    tasks_before = leak_gateway.tasks()
    leak_gateway.usage.records.clear()
    body = {"model": "echo", "stream": True, "messages": CHAT}

    async def leave_early(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            seen = 0
            async for _ in response.aiter_lines():
                seen += 1
                if seen >= 6:
                    return  # closing the response mid-stream: the client is gone

    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=leak_gateway.server.url, limits=limits, timeout=20,
                                 headers={"authorization": f"Bearer {ADMIN_KEY}"}) as client:
        await asyncio.gather(*(leave_early(client) for _ in range(count)))
    records = await asyncio.to_thread(leak_gateway.usage.wait_for, count, 15)
    assert len(records) == count  # every abandoned stream is settled and metered
    assert all(r.extra.get("outcome") == "client_disconnected" and r.completion_tokens > 0 for r in records)
    streams = upstream.streams[-count:]
    assert all(s.wait(10) and s.completed is False for s in streams)  # every upstream stream was closed
    deadline = time.monotonic() + 5
    while leak_gateway.tasks() > tasks_before and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert leak_gateway.tasks() <= tasks_before


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_before_the_answer_began_ends_its_request_at_once(
        leak_gateway: LeakCheckedGateway, upstream: FakeUpstream, stream: bool,
        caplog: pytest.LogCaptureFixture) -> None:
    """The upstream is slow to answer (3 s); the client gives up after 0.3 s: the request is
    cancelled then (the upstream call abandoned, its slots freed), settled as client_disconnected,
    and nothing is logged as the app's failure."""
    upstream.fail_next(Fault(delay=3))
    leak_gateway.usage.records.clear()
    tasks_before = leak_gateway.tasks()
    body = httpx.Request("POST", "/", json={"model": "echo", "messages": CHAT, "stream": stream}).content
    host, port = leak_gateway.server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as client:
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                       b"authorization: Bearer " + ADMIN_KEY.encode() + b"\r\ncontent-length: %d\r\n\r\n" % len(body)
                       + body)
        time.sleep(0.3)
    left = time.monotonic()
    [record] = leak_gateway.usage.wait_for(1, 10)
    assert time.monotonic() - left < 1.5  # settled when the client left, not when the upstream answered
    assert record.status == 499 and record.error_type == "client_disconnected"
    deadline = time.monotonic() + 5
    while leak_gateway.tasks() > tasks_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leak_gateway.tasks() <= tasks_before
    assert "Exception in ASGI application" not in caplog.text
