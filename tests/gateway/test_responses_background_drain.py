"""SIGTERM on ``switchyard serve`` while a background response streams (an event every 0.1 s, for
longer than the drain): when the drain time is over its stream ends with an ``error`` event saying
the response still runs upstream and how to resume it (no ``response.incomplete``), the process
exits 0, and the next process resumes its stream from the last event sent, to its end; the response
is metered once, when it ends."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.db import migrate
from tests.gateway.test_crash_recovery import _config, _tenant, _wait_rows, redis_server  # noqa: F401
from tests.support.fake_responses import USAGE, FakeResponsesUpstream
from tests.support.fake_upstream import FakeUpstream
from tests.support.redis_server import RedisProcess
from tests.support.serve_process import start_serve

WORDS = " ".join(f"w{n}" for n in range(40))  # an input answered in as many deltas: 4 s of them


@pytest.fixture
def native() -> Iterator[FakeResponsesUpstream]:
    server = FakeResponsesUpstream().start()
    server.event_seconds = 0.1
    yield server
    server.stop()


def _native_config(tmp_path: Path, upstream: FakeUpstream, native: FakeResponsesUpstream,
                   redis_url: str) -> dict[str, Any]:
    """Model ``native`` served by ``native``, and a drain of 0.2 + 0.5 s."""
    config = _config(tmp_path, upstream, redis_url)
    config["models"] = [{"name": "native", "deployments": [{"provider": "openai", "model": "up", "api_key": "k",
                                                            "api_base": native.url, "responses_api": True}]}]
    config["prices"] = {"native": {"input_per_million": 10.0, "output_per_million": 20.0}}
    config["server"] = {"drain_readiness_seconds": 0.2, "drain_seconds": 0.5}
    return config


async def test_a_drained_background_stream_says_it_runs_on_and_the_next_process_resumes_it(
        upstream: FakeUpstream, native: FakeResponsesUpstream, redis_server: RedisProcess,
        tmp_path: Path) -> None:
    await asyncio.to_thread(migrate.upgrade, f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    config = _native_config(tmp_path, upstream, native, redis_server.url)
    proc, url, log = start_serve(config, tmp_path)
    try:
        tid, key = _tenant(url, token_budget=1_000_000, budget_period="total")
        client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=20)
        events: list[Any] = []
        with client.responses.create(model="native", input=WORDS, background=True, stream=True) as stream:
            for event in stream:  # the upstream's stream waits before its last event: cut by the drain
                events.append(event)
                if len(events) == 1:
                    proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, log.read_text()[-3000:]
    *relayed, error = events
    response_id, last = relayed[0].response.id, relayed[-1].sequence_number
    assert not {"response.failed", "response.incomplete"} & {event.type for event in events}
    assert error.type == "error"
    assert (error.code, error.param, error.sequence_number) == ("server_shutting_down", None, last + 1)
    assert f"still running: resume its stream with GET /v1/responses/{response_id}?stream=true" \
           f"&starting_after={last}," in error.message
    assert [row[2] for row in _wait_rows(tmp_path, tid, 1)] == [0]  # held: metered when it ends

    (again := tmp_path / "again").mkdir()
    proc, url, _ = start_serve(config, again)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=20)
        rest: list[Any] = []
        with client.responses.retrieve(response_id, stream=True, starting_after=last) as resumed:
            for event in resumed:
                rest.append(event)
                if len(rest) == 1:
                    native.finish(response_id)
        rows = _wait_rows(tmp_path, tid, 2)
    finally:
        proc.kill()
        await asyncio.to_thread(proc.wait, 30)
    assert [event.sequence_number for event in rest] == list(range(last + 1, last + 1 + len(rest)))
    assert rest[-1].type == "response.completed" and rest[-1].response.model == "native"
    assert sorted(row[2] for row in rows) == [0, USAGE["total_tokens"]]


async def test_a_background_stream_silent_when_the_drain_time_ends_is_cut_then_too(
        upstream: FakeUpstream, native: FakeResponsesUpstream, redis_server: RedisProcess,
        tmp_path: Path) -> None:
    """Its upstream silent before its last event (a model thinking) when the drain time ends: the
    stream is cut then, as a flowing one is, not dropped when the process exits."""
    await asyncio.to_thread(migrate.upgrade, f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    native.event_seconds = 0.0  # every event but the last at once, then silence
    proc, url, log = start_serve(_native_config(tmp_path, upstream, native, redis_server.url), tmp_path)
    try:
        tid, key = _tenant(url, token_budget=1_000_000, budget_period="total")
        client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=20)
        with client.responses.create(model="native", input="hi there", background=True, stream=True) as stream:
            events = [next(stream)]
            proc.send_signal(signal.SIGTERM)
            events += list(stream)  # the SDK raises on a body cut before its last event
        code = await asyncio.to_thread(proc.wait, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, log.read_text()[-3000:]
    assert events[-1].type == "error" and events[-1].code == "server_shutting_down"
    assert [row[2] for row in _wait_rows(tmp_path, tid, 1)] == [0]  # held: metered when it ends
