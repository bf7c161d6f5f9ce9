"""A /v1/messages request to an Anthropic deployment goes as the client sent it (block, source and
tool types the gateway does not know included; headers anthropic-version and anthropic-beta too),
count_tokens counts the body as sent, and a stream that ends without message_stop fails instead of
passing for a finished answer; the anthropic and openai SDKs against a gateway on loopback, a
loopback server speaking the Messages API and one speaking OpenAI's (a fallback)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from backends.dev.echo_server import Exchange
from gateway import streaming
from gateway.settings import parse_settings
from tests.backends.conftest import sse_events
from tests.conftest import ADMIN_KEY
from tests.support.doubles import CutAfter, RecordingSink
from tests.support.fake_anthropic import FakeAnthropic, _text, send_events
from tests.support.fake_upstream import FakeUpstream
from tests.support.scripted_gateway import scripted_gateway
from tests.support.servers import ServerThread

PARTIAL: list[tuple[str, dict[str, Any]]] = [
    ("message_start", {"message": {"id": "msg_cut", "type": "message", "role": "assistant", "model": "claude-test",
                                   "content": [], "usage": {"input_tokens": 5, "output_tokens": 1}}}),
    ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
    ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "partial"}}),
]
OVERLOADED = ("error", {"error": {"type": "overloaded_error", "message": "Overloaded"}})


NULLS: list[tuple[str, dict[str, Any]]] = [  # a message_delta's null counts: message_start's stand
    ("message_start", {"message": {"id": "msg_n", "type": "message", "role": "assistant", "model": "claude-test",
                                   "content": [], "usage": {"input_tokens": 5, "cache_read_input_tokens": 3,
                                                            "output_tokens": 1}}}),
    *PARTIAL[1:], ("content_block_stop", {"index": 0}),
    ("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None},
                       "usage": {"input_tokens": None, "cache_read_input_tokens": None, "output_tokens": 2}}),
    ("message_stop", {}),
]


class CuttingAnthropic(FakeAnthropic):
    """When the text starts with CUT, ends the stream after the first text delta without message_stop;
    with FAIL, closes that block and sends an error event; with DROP, drops the connection after it;
    with NULLS, answers ``NULLS``."""

    async def _stream(self, ex: Exchange, payload: dict[str, Any], blocks: list[dict[str, Any]], stop: str,
                      usage: dict[str, int], matched: str | None = None) -> None:
        text = _text(payload["messages"][-1]["content"])
        if text.startswith("CUT"):
            return await send_events(ex, [*PARTIAL, ("ping", {})])
        if text.startswith("FAIL"):
            return await send_events(ex, [*PARTIAL, ("content_block_stop", {"index": 0}), ("ping", {}), OVERLOADED])
        if text.startswith("NULLS"):
            return await send_events(ex, NULLS)
        if text.startswith("DROP"):
            await send_events(ex, [*PARTIAL, ("ping", {})], end=False)
            raise ConnectionResetError("dropped")  # uvicorn closes the connection mid-body
        return await super()._stream(ex, payload, blocks, stop, usage, matched)


@pytest.fixture(scope="module")
def anthropic_upstream() -> Iterator[CuttingAnthropic]:
    server = CuttingAnthropic().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(anthropic_upstream: CuttingAnthropic,
            fake_upstream_server: FakeUpstream) -> Iterator[tuple[ServerThread, RecordingSink]]:
    deployment = {"provider": "anthropic", "model": "claude-test", "api_base": anthropic_upstream.url,
                  "api_key": "sk-ant", "anthropic_betas": ["files-api-2025-04-14", "interleaved-thinking-2025-05-14",
                                                           "token-counting-2024-11-01"],
                  "server_tools": ["web_search_20250305", "mcp_toolset"]}  # what the tests below opt into
    settings = parse_settings({"models": [
        {"name": "claude", "max_retries": 0, "deployments": [deployment]},
        {"name": "claude-fb", "max_retries": 0, "fallbacks": ["oai"], "deployments": [deployment | {"name": "fb"}]},
        {"name": "oai", "max_retries": 0, "deployments": [{"provider": "openai", "model": "upstream-echo",
                                                           "api_base": fake_upstream_server.url}]},
    ]}, env={})
    usage = RecordingSink()
    with scripted_gateway(settings, usage=usage) as server:
        yield server, usage


@pytest.fixture
def upstream(anthropic_upstream: CuttingAnthropic, fake_upstream_server: FakeUpstream,
             gateway: tuple[ServerThread, RecordingSink]) -> CuttingAnthropic:
    anthropic_upstream.received.clear()
    anthropic_upstream.headers.clear()
    anthropic_upstream.faults.clear()
    fake_upstream_server.reset()
    gateway[1].records.clear()
    return anthropic_upstream


@pytest.fixture
def ant(gateway: tuple[ServerThread, RecordingSink]) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway[0].url, api_key=ADMIN_KEY, max_retries=0)


USER = [{"role": "user", "content": "hi"}]
# Valid Messages requests that OpenAI's chat shape cannot carry: an Anthropic deployment gets them as sent.
AS_SENT: dict[str, dict[str, Any]] = {
    "document with a url source": {"messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}},
        {"type": "text", "text": "summarise"}]}]},
    "document with a content source": {"messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": "abc"}]}},
        {"type": "text", "text": "summarise"}]}]},
    "image from the Files API": {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "file", "file_id": "file_123"}}, {"type": "text", "text": "what"}]}]},
    "a server tool without input_schema": {"messages": USER, "tools": [
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}], "tool_choice": {"type": "any"}},
    "a tool result holding an image": {
        "messages": [{"role": "user", "content": "x"},
                     {"role": "assistant", "content": [{"type": "tool_use", "id": "tu1", "name": "shot", "input": {}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": [
                         {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                      "data": "iVBORw0KGgo="}}]}]}],
        "tools": [{"name": "shot", "input_schema": {"type": "object"}}]},
    "a search_result block": {"messages": [{"role": "user", "content": [
        {"type": "search_result", "source": "https://x", "title": "t", "content": [{"type": "text", "text": "abc"}]},
        {"type": "text", "text": "q"}]}]},
    "a block and a tool of types not yet known": {"messages": [{"role": "user", "content": [
        {"type": "hologram", "frames": 3}, {"type": "text", "text": "q"}]}],
        "tools": [{"type": "mcp_toolset", "mcp_server_name": "files"}]},
    "tool_choice with disable_parallel_tool_use": {
        "messages": USER, "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}},
}


@pytest.mark.parametrize("case", list(AS_SENT))
def test_anthropic_deployment_gets_the_request_as_sent(ant: anthropic.Anthropic, upstream: CuttingAnthropic,
                                                        case: str) -> None:
    body = {"max_tokens": 16} | AS_SENT[case]
    message = ant.messages.create(model="claude", **body, extra_body={"future_field": {"a": 1}})  # type: ignore[call-overload]
    assert message.model == "claude"
    assert upstream.received[-1] == body | {"model": "claude-test", "future_field": {"a": 1}}


def test_streamed_request_goes_as_sent_too(ant: anthropic.Anthropic, upstream: CuttingAnthropic) -> None:
    body = {"max_tokens": 16} | AS_SENT["a search_result block"]
    with ant.messages.stream(model="claude", **body) as stream:  # type: ignore[arg-type]
        final = stream.get_final_message()
    assert final.content[0].text == "q"  # type: ignore[union-attr]
    assert upstream.received[-1] == body | {"model": "claude-test", "stream": True}


def test_a_fallback_to_another_provider_refuses_what_it_cannot_carry(
        ant: anthropic.Anthropic, upstream: CuttingAnthropic, fake_upstream_server: FakeUpstream) -> None:
    """claude-fb's Anthropic deployment is overloaded; its fallback speaks OpenAI's chat: a request it
    cannot carry is a 400 naming the field there (never a silent loss), one it can is served."""
    upstream.fail_next(529, "overloaded_error", "overloaded")
    with pytest.raises(anthropic.BadRequestError) as refused:
        ant.messages.create(model="claude-fb", max_tokens=16, **AS_SENT["document with a url source"])
    assert "messages[0].content[0].source.type" in refused.value.message
    assert len(upstream.received) == 1 and fake_upstream_server.received == []
    upstream.fail_next(529, "overloaded_error", "overloaded")
    message = ant.messages.create(model="claude-fb", max_tokens=16, messages=[{"role": "user", "content": "a b"}])
    assert message.content[0].text == "a b"  # type: ignore[union-attr]
    assert fake_upstream_server.last.json["messages"] == [{"role": "user", "content": "a b"}]


COUNTED = {
    "system": [{"type": "text", "text": "Sys A.", "cache_control": {"type": "ephemeral"}},
               {"type": "text", "text": "Sys B."}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "sig"},
                                          {"type": "tool_use", "id": "tu1", "name": "f", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": "ok", "is_error": True}]},
    ],
    "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    "thinking": {"type": "enabled", "budget_tokens": 2048},
}


def test_count_tokens_counts_the_body_as_sent(ant: anthropic.Anthropic, upstream: CuttingAnthropic) -> None:
    counted = ant.messages.count_tokens(model="claude", **COUNTED)  # type: ignore[arg-type]
    assert counted.input_tokens > 0
    assert upstream.received[-1] == COUNTED | {"model": "claude-test"}  # thinking, cache_control, is_error kept


def test_count_tokens_leaves_out_what_the_gateway_sets(gateway: tuple[ServerThread, RecordingSink],
                                                      upstream: CuttingAnthropic) -> None:
    body = COUNTED | {"model": "claude", "max_tokens": 9, "stream": True}
    response = httpx.post(gateway[0].url + "/v1/messages/count_tokens", json=body,
                          headers={"x-api-key": ADMIN_KEY, "anthropic-beta": "token-counting-2024-11-01"})
    assert response.status_code == 200, response.text
    assert upstream.received[-1] == COUNTED | {"model": "claude-test"}
    assert upstream.headers[-1]["anthropic-beta"] == "token-counting-2024-11-01"


def test_client_anthropic_headers_are_forwarded(ant: anthropic.Anthropic, upstream: CuttingAnthropic,
                                                gateway: tuple[ServerThread, RecordingSink]) -> None:
    beta = "files-api-2025-04-14,interleaved-thinking-2025-05-14"
    ant.messages.create(model="claude", max_tokens=8, messages=USER, extra_headers={"anthropic-beta": beta})
    assert upstream.headers[-1]["anthropic-beta"] == beta
    assert upstream.headers[-1]["anthropic-version"] == ant.default_headers["anthropic-version"]  # the SDK's
    with ant.messages.stream(model="claude", max_tokens=8, messages=USER,
                             extra_headers={"anthropic-beta": beta}) as stream:
        stream.get_final_message()
    assert upstream.headers[-1]["anthropic-beta"] == beta
    httpx.post(gateway[0].url + "/v1/messages", json={"model": "claude", "max_tokens": 8, "messages": USER},
               headers={"x-api-key": ADMIN_KEY, "anthropic-version": "2099-01-01"}).raise_for_status()
    assert upstream.headers[-1]["anthropic-version"] == "2099-01-01"
    assert "anthropic-beta" not in upstream.headers[-1]
    openai.OpenAI(base_url=gateway[0].url + "/v1", api_key=ADMIN_KEY, max_retries=0).chat.completions.create(
        model="claude", messages=[{"role": "user", "content": "hi"}], extra_headers={"anthropic-beta": beta})
    assert upstream.headers[-1]["anthropic-version"] == "2023-06-01"  # an OpenAI client's request: the default
    assert "anthropic-beta" not in upstream.headers[-1]


def test_a_cut_stream_ends_with_an_error_event(gateway: tuple[ServerThread, RecordingSink],
                                               upstream: CuttingAnthropic, ant: anthropic.Anthropic) -> None:
    body = {"model": "claude", "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": "CUT"}]}
    events = sse_events(gateway[0].url + "/v1/messages", body, {"x-api-key": ADMIN_KEY})
    kinds = [kind for kind, _ in events]
    assert kinds == ["message_start", "content_block_start", "content_block_delta", "ping", "error"]
    assert "message_stop" in events[-1][1]["error"]["message"]
    record = gateway[1].wait_for(1)[0]
    assert record.extra == {"outcome": "failed"} and record.error_type is not None
    assert record.prompt_tokens == 5  # what message_start reported
    with pytest.raises(anthropic.APIStatusError):
        with ant.messages.stream(model="claude", max_tokens=16, messages=[{"role": "user", "content": "CUT"}]) as s:
            list(s)


def test_a_cut_stream_fails_for_openai_clients_too(gateway: tuple[ServerThread, RecordingSink],
                                                   upstream: CuttingAnthropic) -> None:
    client = openai.OpenAI(base_url=gateway[0].url + "/v1", api_key=ADMIN_KEY, max_retries=0)
    stream = client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "CUT"}],
                                            stream=True)
    texts: list[str] = []
    with pytest.raises(openai.APIError):
        for chunk in stream:
            texts.extend(c.delta.content or "" for c in chunk.choices)
    assert "".join(texts) == "partial"
    assert gateway[1].wait_for(1)[0].extra == {"outcome": "failed"}
    whole = client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "a whole answer"}],
                                           stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in whole if c.choices) == "a whole answer"


def test_null_counts_in_message_delta_keep_message_starts(gateway: tuple[ServerThread, RecordingSink],
                                                          upstream: CuttingAnthropic) -> None:
    """A null count in ``message_delta`` is no count (as the anthropic SDK reads it): the prompt's
    tokens are message_start's, in the usage chunk and in what is billed."""
    client = openai.OpenAI(base_url=gateway[0].url + "/v1", api_key=ADMIN_KEY, max_retries=0)
    chunks = list(client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "NULLS"}],
                                                 stream=True, stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (8, 2)
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 3
    record = gateway[1].wait_for(1)[0]
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (8, 3, 2)


def test_events_before_an_error_event_are_relayed_in_order(gateway: tuple[ServerThread, RecordingSink],
                                                           upstream: CuttingAnthropic,
                                                           ant: anthropic.Anthropic) -> None:
    body = {"model": "claude", "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": "FAIL"}]}
    events = sse_events(gateway[0].url + "/v1/messages", body, {"x-api-key": ADMIN_KEY})
    assert [kind for kind, _ in events] == ["message_start", "content_block_start", "content_block_delta",
                                            "content_block_stop", "ping", "error"]
    assert events[-1][1]["error"]["type"] == "overloaded_error" and "Overloaded" in events[-1][1]["error"]["message"]
    assert gateway[1].wait_for(1)[0].extra == {"outcome": "failed"}
    seen: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as failed:
        with ant.messages.stream(model="claude", max_tokens=16, messages=[{"role": "user", "content": "FAIL"}]) as s:
            seen.extend(event.type for event in s)
    assert seen[-1] == "content_block_stop"  # the SDK leaves out pings
    assert failed.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]


def test_a_dropped_connection_relays_what_came_then_an_error_event(gateway: tuple[ServerThread, RecordingSink],
                                                                   upstream: CuttingAnthropic) -> None:
    body = {"model": "claude", "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": "DROP"}]}
    events = sse_events(gateway[0].url + "/v1/messages", body, {"x-api-key": ADMIN_KEY})
    assert [kind for kind, _ in events] == ["message_start", "content_block_start", "content_block_delta", "ping",
                                            "error"]
    assert events[-1][1]["error"]["type"] in ("overloaded_error", "api_error")
    assert gateway[1].wait_for(1)[0].extra == {"outcome": "failed"}


def test_a_drained_relay_ends_as_a_whole_message(gateway: tuple[ServerThread, RecordingSink],
                                                 upstream: CuttingAnthropic, ant: anthropic.Anthropic,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The drain time runs out mid-stream: the open block is closed and the message ends with
    max_tokens and the usage so far, as a translated stream's does (finish_reason length)."""
    monkeypatch.setattr(streaming, "DRAIN", CutAfter(reads=1))
    body = {"model": "claude", "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": "CUT"}]}
    events = sse_events(gateway[0].url + "/v1/messages", body, {"x-api-key": ADMIN_KEY})
    assert [kind for kind, _ in events] == ["message_start", "content_block_start", "content_block_delta",
                                            "content_block_stop", "message_delta", "message_stop"]
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens" and events[-2][1]["usage"]["output_tokens"] > 0
    assert gateway[1].wait_for(1)[0].extra == {"outcome": "drained"}
    monkeypatch.setattr(streaming, "DRAIN", CutAfter(reads=1))
    with ant.messages.stream(model="claude", max_tokens=16, messages=[{"role": "user", "content": "CUT"}]) as s:
        final = s.get_final_message()
    assert final.content[0].text == "partial" and final.stop_reason == "max_tokens"  # type: ignore[union-attr]
