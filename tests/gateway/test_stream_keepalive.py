"""Keep-alives on a relayed stream whose upstream goes silent mid-stream (``server.stream_keepalive_seconds``):
a gateway set to 1 s writes one (an SSE comment; Anthropic's ``ping`` event under /v1/messages) while
its upstream says nothing for 3.5 s; the SDKs see exactly the stream a gateway with keep-alives off
relays, which sends nothing more, and the usage rows are the same. Each test runs its streams
through both gateways at once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.contracts import UsageRecord
from gateway.db import migrate
from gateway.settings import Settings
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.support.doubles import RecordingSink
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fake_upstream import FakeUpstream, Fault, silent_after
from tests.support.scripted_gateway import scripted_gateway
from tests.support.servers import ServerThread

SILENCE = 3.5  # seconds the upstream says nothing, mid-stream
KEEP_ALIVE = ": keep-alive"
HEADERS = {"authorization": f"Bearer {ADMIN_KEY}"}


class SilentForAWhile(FakeAnthropic):
    """Streams a message's start, its upstream ping, its text block's start and first text, then says
    nothing for ``SILENCE`` seconds before the rest."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await super().__call__(scope, receive, silent_after(send, 4, SILENCE))


def _settings(upstream: str, claude: str, keepalive: float) -> Settings:
    timeouts = {"connect": 2, "first_byte": 5, "total": 20}
    return gateway_settings(upstream, server={"stream_keepalive_seconds": keepalive}, models=[
        {"name": "echo", "max_retries": 0, "deployments": [
            {"provider": "openai", "model": "upstream-echo", "api_base": upstream, "api_key": "sk-up",
             "timeouts": timeouts}]},
        {"name": "claude", "max_retries": 0, "deployments": [
            {"provider": "anthropic", "model": "claude-test", "api_base": claude, "api_key": "sk-ant",
             "timeouts": timeouts}]},
    ])


@pytest.fixture(scope="module")
def gateways(fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[ServerThread, RecordingSink, ServerThread, RecordingSink]]:
    """A gateway with keep-alives every second and one with them off (each storing Responses answers
    in a SQLite database of its own), and their usage rows."""
    claude = SilentForAWhile().start()
    on, off = RecordingSink(), RecordingSink()
    kept_db, plain_db = (f"sqlite+aiosqlite:///{tmp_path_factory.mktemp(name) / 'responses.db'}"
                         for name in ("kept", "plain"))
    for url in (kept_db, plain_db):
        migrate.upgrade(url)
    try:
        with scripted_gateway(_settings(fake_upstream_server.url, claude.url, 1.0), usage=on,
                              responses_db=kept_db) as kept, \
                scripted_gateway(_settings(fake_upstream_server.url, claude.url, 0), usage=off,
                                 responses_db=plain_db) as plain:
            yield kept, on, plain, off
    finally:
        claude.stop()


@pytest.fixture
def served(gateways: tuple[ServerThread, RecordingSink, ServerThread, RecordingSink],
           upstream: FakeUpstream) -> tuple[ServerThread, RecordingSink, ServerThread, RecordingSink]:
    for sink in (gateways[1], gateways[3]):
        sink.records.clear()
    return gateways


async def _raw(url: str, path: str, body: dict[str, Any]) -> list[str]:
    """The lines of a streamed answer, as they came."""
    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=30) as client, \
            client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        return [line async for line in response.aiter_lines()]


def _data(lines: list[str]) -> list[Any]:
    """The events' data, their ids and creation times left out (each stream has its own)."""
    return [line if line == "data: [DONE]" else
            {k: v for k, v in json.loads(line[6:]).items() if k not in ("id", "created")}
            for line in lines if line.startswith("data: ")]


def _without_pings(lines: list[str]) -> list[str]:
    """``lines`` less their ``ping`` events (each three lines: its type, its data, the blank after)."""
    pings = {i + d for i, line in enumerate(lines) if line == "event: ping" for d in range(3)}
    return [line for i, line in enumerate(lines) if i not in pings]


def _row(sink: RecordingSink) -> tuple[Any, ...]:
    [record] = sink.wait_for(1)
    return _metered(record)


def _metered(record: UsageRecord) -> tuple[Any, ...]:
    """What a usage row says the request did and cost (not when, nor its ids)."""
    return (record.status, record.error_type, record.prompt_tokens, record.completion_tokens, record.exact,
            record.cost, record.stream, record.endpoint, record.extra)


CHAT = {"model": "echo", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "one two three four five"}]}


async def test_a_silent_chat_stream_gets_keep_alives_only_when_they_are_on(
        served: tuple[ServerThread, RecordingSink, ServerThread, RecordingSink], upstream: FakeUpstream) -> None:
    kept, on, plain, off = served
    upstream.fail_next(Fault(silence=(2, SILENCE)), Fault(silence=(2, SILENCE)))  # the role, a word, then silence
    with_keepalives, without = await asyncio.gather(_raw(kept.url, "/v1/chat/completions", CHAT),
                                                    _raw(plain.url, "/v1/chat/completions", CHAT))
    assert with_keepalives.count(KEEP_ALIVE) >= 1
    first = with_keepalives.index(KEEP_ALIVE)
    assert with_keepalives[first + 1] == ""  # a whole SSE comment, between two events
    assert sum(line.startswith("data: ") for line in with_keepalives[:first]) == 2  # in the silence after them
    assert all(line.startswith("data: ") or line == "" for line in without)  # off: nothing else
    kept_lines = [line for i, line in enumerate(with_keepalives)
                  if KEEP_ALIVE not in (line, with_keepalives[i - 1] if i else None)]  # each with its blank line
    assert len(kept_lines) == len(without) and _data(kept_lines) == _data(without)
    assert _data(without)[-1] == "data: [DONE]"
    assert _row(on) == _row(off)


async def test_the_openai_sdk_sees_the_same_chunks_and_usage(
        served: tuple[ServerThread, RecordingSink, ServerThread, RecordingSink], upstream: FakeUpstream) -> None:
    kept, on, plain, off = served
    upstream.fail_next(Fault(silence=(2, SILENCE)), Fault(silence=(2, SILENCE)))

    async def chunks(url: str) -> list[Any]:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=ADMIN_KEY, max_retries=0, timeout=30) as client:
            stream = await client.chat.completions.create(**CHAT)
            return [(c.choices[0].delta.content if c.choices else None,
                     c.choices[0].finish_reason if c.choices else None, c.usage) async for c in stream]

    with_keepalives, without = await asyncio.gather(chunks(kept.url), chunks(plain.url))
    assert with_keepalives == without
    assert "".join(content or "" for content, _, _ in without).split() == "one two three four five".split()
    assert without[-1][2] is not None and without[-1][2].completion_tokens > 0  # include_usage's chunk
    assert _row(on) == _row(off)


async def test_the_responses_stream_keeps_its_events_and_sequence_numbers(
        served: tuple[ServerThread, RecordingSink, ServerThread, RecordingSink], upstream: FakeUpstream) -> None:
    kept, on, plain, off = served
    upstream.fail_next(Fault(silence=(2, SILENCE)), Fault(silence=(2, SILENCE)))
    body = {"model": "echo", "stream": True, "input": "one two three four five"}  # stored: its last event waits
    raw, _ = await asyncio.gather(_raw(kept.url, "/v1/responses", body), _raw(plain.url, "/v1/responses", body))
    assert raw.count(KEEP_ALIVE) >= 1
    upstream.fail_next(Fault(silence=(2, SILENCE)), Fault(silence=(2, SILENCE)))

    async def events(url: str) -> list[tuple[str, int]]:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=ADMIN_KEY, max_retries=0, timeout=30) as client:
            stream = await client.responses.create(**body)
            return [(event.type, event.sequence_number) async for event in stream]

    with_keepalives, without = await asyncio.gather(events(kept.url), events(plain.url))
    assert [kind for kind, _ in with_keepalives] == [kind for kind, _ in without]
    assert [seq for _, seq in with_keepalives] == list(range(len(without)))
    assert without[-1][0] == "response.completed"


async def test_a_silent_messages_stream_gets_pings_the_anthropic_sdk_ignores(
        served: tuple[ServerThread, RecordingSink, ServerThread, RecordingSink]) -> None:
    kept, on, plain, off = served
    body = {"model": "claude", "max_tokens": 100, "stream": True,
            "messages": [{"role": "user", "content": "one two three four five"}]}

    async def events(url: str) -> list[Any]:
        async with anthropic.AsyncAnthropic(base_url=url, api_key=ADMIN_KEY, max_retries=0, timeout=30) as client:
            stream = await client.messages.create(**body)
            return [event.model_dump() async for event in stream]

    raw_kept, raw_plain, with_keepalives, without = await asyncio.gather(
        _raw(kept.url, "/v1/messages", body), _raw(plain.url, "/v1/messages", body),
        events(kept.url), events(plain.url))
    pings = [i for i, line in enumerate(raw_kept) if line == "event: ping"]
    assert len(pings) >= 1 + raw_plain.count("event: ping")  # the upstream's own, and one in the silence at least
    assert all(raw_kept[i + 1] == 'data: {"type":"ping"}' and raw_kept[i + 2] == "" for i in pings)
    assert _without_pings(raw_kept) == _without_pings(raw_plain)
    assert with_keepalives == without
    assert [event["type"] for event in without][-2:] == ["message_delta", "message_stop"]
    assert "".join(e["delta"].get("text", "") for e in without if e["type"] == "content_block_delta").split() \
        == "one two three four five".split()
    rows_on, rows_off = on.wait_for(2), off.wait_for(2)
    assert len(rows_on) == 2 and [_metered(r) for r in rows_on] == [_metered(r) for r in rows_off]
