"""``/v1/responses`` on an Anthropic deployment with extended thinking on: a tool-use turn continued
statelessly (``store: false``, each turn's output items sent back with
``include: ["reasoning.encrypted_content"]``, as Codex does) or by ``previous_response_id``. The
reasoning item carries the answer's signed thinking blocks (a redacted block too) in its
``encrypted_content``, or in the kept conversation, and they reach Anthropic first in the assistant
turn; the loopback Messages server refuses a tool turn without them, as Anthropic does. The openai SDK
against a gateway on loopback that keeps responses on SQLite."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from backends.factory import build_backend
from gateway.contracts import Principal
from gateway.db import Database, migrate
from gateway.dialects.responses_reasoning import decoded_blocks, decoded_reasoning
from gateway.routing.router import Router
from gateway.services import Services
from gateway.settings import parse_settings
from gateway.stored_responses import ResponseStore
from tests.backends.claude_gateway import upstream  # noqa: F401  (a fixture)
from tests.conftest import ADMIN_KEY
from tests.support.doubles import RecordingSink, ScriptedAdmission, StaticKeys
from tests.support.fake_anthropic import ScriptedAnthropic
from tests.support.servers import ServerThread

ENCRYPTED = "reasoning.encrypted_content"
TOOL: Any = {"type": "function", "name": "search", "parameters": {"type": "object"}}
THINK: Any = dict(model="claude", tools=[TOOL], reasoning={"effort": "low"}, max_output_tokens=4000)
STATELESS: Any = dict(store=False, include=[ENCRYPTED])
SIGNED = {"type": "thinking", "thinking": "let me think", "signature": "sig-1"}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "x"}}
USAGE = {"input_tokens": 3, "output_tokens": 4}


@pytest.fixture(scope="module")
def gateway_url(upstream: ScriptedAnthropic, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway serving ``claude`` from ``upstream`` to the admin key, keeping responses on SQLite."""
    from gateway.app import create_app

    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('db') / 'switchyard.db'}"
    migrate.upgrade(url)
    db = Database.from_url(url)
    deployment = {"provider": "anthropic", "model": "claude-test", "api_base": upstream.url, "api_key": "sk"}
    settings = parse_settings({"models": [{"name": "claude", "max_retries": 0, "deployments": [deployment]}]}, env={})
    admin = Principal(key_id="admin", tenant_id=None, is_admin=True)
    services = Services(authenticator=StaticKeys({ADMIN_KEY: admin}), admission=ScriptedAdmission(),
                        usage=RecordingSink(), router=Router.from_settings(settings, build_backend),
                        responses=ResponseStore(db), closers=[db.dispose])
    with ServerThread(create_app(settings, services)) as server:
        yield server.url


@pytest.fixture
def client(gateway_url: str, upstream: ScriptedAnthropic) -> openai.OpenAI:
    upstream.received.clear()
    upstream.script = None
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=ADMIN_KEY, max_retries=0)


def respond(client: openai.OpenAI, stream: bool, **kw: Any) -> Any:
    """A response, whole or streamed (then its ``output_item.done`` items must be its output)."""
    if not stream:
        return client.responses.create(**kw)
    with client.responses.stream(**kw) as events:
        done = [e.item for e in events if e.type == "response.output_item.done"]
        final = events.get_final_response()
    assert [i.model_dump(exclude_none=True) for i in done] == [i.model_dump(exclude_none=True) for i in final.output]
    return final


def as_codex_sends(output: list[Any]) -> list[dict[str, Any]]:
    """Output items as Codex sends them back: no ids or status, a reasoning item without its text."""
    items = []
    for item in output:
        sent = {k: v for k, v in item.model_dump(exclude_none=True).items() if k not in ("id", "status", "content")
                or item.type != "reasoning" and k == "content"}
        items.append(sent)
    return items


def shape(output: list[Any]) -> list[Any]:
    """Output items without their ids, arguments parsed (a stream's keep the upstream's spacing): what a
    whole answer and its stream must agree on."""
    return [{k: json.loads(v) if k == "arguments" else v for k, v in item.model_dump(exclude_none=True).items()
             if k != "id"} for item in output]


def assistant_turn(upstream: ScriptedAnthropic) -> list[dict[str, Any]]:
    turns = [m["content"] for m in upstream.received[-1]["messages"] if m["role"] == "assistant"]
    assert len(turns) == 1
    return turns[0]


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_turn_continues_statelessly_with_its_signed_thinking(
        client: openai.OpenAI, upstream: ScriptedAnthropic, stream: bool) -> None:
    first = respond(client, stream, **THINK, **STATELESS, input="tool:weather")
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    reasoning = first.output[0]
    assert reasoning.content[0].text == "let me think"
    assert decoded_blocks(reasoning.encrypted_content) == [SIGNED]
    assert decoded_reasoning(reasoning.encrypted_content) == "let me think"
    second = respond(client, stream, **THINK, **STATELESS, input=[
        {"role": "user", "content": "tool:weather"}, *as_codex_sends(first.output),
        {"type": "function_call_output", "call_id": first.output[1].call_id, "output": "sunny"}])
    assert second.status == "completed" and second.output_text  # Anthropic took the turn back
    assert assistant_turn(upstream) == [SIGNED, {"type": "tool_use", "id": "toolu_1", "name": "search",
                                                 "input": {"q": "weather"}}]


def test_a_stream_gives_the_items_a_whole_answer_does(client: openai.OpenAI) -> None:
    whole, streamed = (respond(client, stream, **THINK, **STATELESS, input="tool:weather") for stream in (False, True))
    assert shape(whole.output) == shape(streamed.output)


@pytest.mark.parametrize("stream", [False, True])
def test_a_stored_tool_turn_continues_by_id_with_its_signed_thinking(
        client: openai.OpenAI, upstream: ScriptedAnthropic, stream: bool) -> None:
    """Kept with the conversation whether or not ``include`` asked for ``encrypted_content``; the
    client, which did not ask, sees none, in the answer or read back."""
    first = respond(client, stream, **THINK, input="tool:weather")
    assert first.output[0].type == "reasoning" and first.output[0].encrypted_content is None
    second = respond(client, stream, **THINK, previous_response_id=first.id, input=[
        {"type": "function_call_output", "call_id": first.output[1].call_id, "output": "sunny"}])
    assert second.status == "completed" and second.output_text
    assert assistant_turn(upstream)[0] == SIGNED
    assert client.responses.retrieve(first.id).output[0].encrypted_content is None  # type: ignore[union-attr]
    third = respond(client, stream, **THINK, previous_response_id=second.id, input="and then?")
    assert third.status == "completed"


def test_a_stored_interleaved_answer_continues_by_id_in_its_order(
        client: openai.OpenAI, upstream: ScriptedAnthropic) -> None:
    """A whole answer's thinking, tool_use, thinking, tool_use: each thinking block kept with its own
    reasoning item, so the turn goes back in the order it came."""
    later = {"type": "thinking", "thinking": "and y", "signature": "sig-2"}
    other = {"type": "tool_use", "id": "toolu_2", "name": "search", "input": {"q": "y"}}
    upstream.script = (200, {"id": "msg_i", "type": "message", "role": "assistant", "model": "m",
                             "content": [SIGNED, TOOL_USE, later, other], "stop_reason": "tool_use", "usage": USAGE})
    first = client.responses.create(**THINK, input="tool:x")
    assert [item.type for item in first.output] == ["reasoning", "function_call", "reasoning", "function_call"]
    client.responses.create(**THINK, previous_response_id=first.id, input=[
        {"type": "function_call_output", "call_id": call_id, "output": "found"} for call_id in ("toolu_1", "toolu_2")])
    assert assistant_turn(upstream) == [SIGNED, TOOL_USE, later, other]


def _redacted_script(stream: bool) -> Any:
    """An answer whose thinking is one redacted block (no text at all), then a tool call."""
    if not stream:
        return (200, {"id": "msg_r", "type": "message", "role": "assistant", "model": "m",
                      "content": [REDACTED, TOOL_USE], "stop_reason": "tool_use", "usage": USAGE})
    return [("message_start", {"message": {"id": "msg_r", "type": "message", "role": "assistant", "model": "m",
                                           "content": [], "usage": {"input_tokens": 3, "output_tokens": 1}}}),
            ("content_block_start", {"index": 0, "content_block": REDACTED}), ("content_block_stop", {"index": 0}),
            ("content_block_start", {"index": 1, "content_block": TOOL_USE | {"input": {}}}),
            ("content_block_delta", {"index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"q": "x"}'}}),
            ("content_block_stop", {"index": 1}),
            ("message_delta", {"delta": {"stop_reason": "tool_use", "stop_sequence": None},
                               "usage": {"output_tokens": 4}}), ("message_stop", {})]


@pytest.mark.parametrize("stream", [False, True])
def test_redacted_thinking_comes_back_unchanged(client: openai.OpenAI, upstream: ScriptedAnthropic,
                                                stream: bool) -> None:
    upstream.script = _redacted_script(stream)
    first = respond(client, stream, **THINK, **STATELESS, input="tool:x")
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    assert not first.output[0].content and decoded_blocks(first.output[0].encrypted_content) == [REDACTED]
    respond(client, stream, **THINK, **STATELESS, input=[
        {"role": "user", "content": "tool:x"}, *as_codex_sends(first.output),
        {"type": "function_call_output", "call_id": "toolu_1", "output": "sunny"}])
    assert assistant_turn(upstream) == [REDACTED, TOOL_USE]


def test_an_old_text_only_blob_and_another_providers_item_are_accepted(
        client: openai.OpenAI, upstream: ScriptedAnthropic) -> None:
    """A ``swy1.`` blob made before blocks were kept (text only) still reads, and, like another
    provider's reasoning item, brings no thinking blocks: the turn goes as it did (thinking off)."""
    old = "swy1." + base64.urlsafe_b64encode(json.dumps({"text": "earlier"}).encode()).rstrip(b"=").decode()
    assert decoded_reasoning(old) == "earlier" and decoded_blocks(old) is None
    reasoning = [{"type": "reasoning", "summary": [], "encrypted_content": blob} for blob in (old, "gAAAAABoxx")]
    answer = client.responses.create(model="claude", **STATELESS, input=[  # type: ignore[arg-type]
        {"role": "user", "content": "hi"}, *reasoning, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"}])
    assert answer.status == "completed"
    assert upstream.received[-1]["messages"][1] == {"role": "assistant", "content": [{"type": "text", "text": "hello"}]}
