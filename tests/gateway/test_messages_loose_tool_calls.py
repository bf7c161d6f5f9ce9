"""``POST /v1/messages`` served by an OpenAI-compatible upstream whose tool calls are off OpenAI's
schema: call deltas with no ``index`` or a null one (Gemini, older Ollama, mistral.rs), parallel calls
streamed all under index 0 each with its own id (Ollama), whole answers whose calls have no ``id``.
Each call is a ``tool_use`` block of its own with its whole input and an id (the upstream's, else one
of the gateway's own in Anthropic's ``toolu_`` form), as ``/v1/responses`` makes them function calls.
The anthropic SDK against a gateway in front of the fake OpenAI upstream."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import GatewayEnv
from tests.support.fake_upstream import FakeUpstream
from tests.support.loose_tool_calls import ANSWERED, STREAMED, Call, answered, ids_kept, streamed

KW: Any = {"model": "echo", "max_tokens": 64, "messages": [{"role": "user", "content": "weather?"}],
           "tools": [{"name": n, "input_schema": {"type": "object"}} for n in "fg"]}


@pytest.fixture
def client(env: GatewayEnv) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=env.server.url, api_key=ADMIN_KEY, max_retries=0)


def _check(blocks: list[Any], expected: list[Call]) -> None:
    """The tool_use blocks are the ``expected`` calls, in order, each with an id (its own where the
    upstream gave none)."""
    assert [(b.type, b.name, b.input) for b in blocks] == [("tool_use", n, json.loads(a)) for _, n, a in expected]
    ids = [b.id for b in blocks]
    assert ids_kept(expected, ids)
    assert all(i.startswith("toolu_") for (given, _, _), i in zip(expected, ids, strict=True) if given is None)


@pytest.mark.parametrize("case", list(STREAMED))
def test_calls_streamed_off_openais_schema_are_tool_use_blocks_each(client: anthropic.Anthropic,
                                                                    upstream: FakeUpstream, case: str) -> None:
    upstream.fail_next(streamed(case))
    with client.messages.stream(**KW) as stream:
        events = list(stream)
        message = stream.get_final_message()
    _check(message.content, STREAMED[case][1])
    assert message.stop_reason == "tool_use"
    started = [e.content_block.id for e in events if e.type == "content_block_start"]  # type: ignore[union-attr]
    assert started == [b.id for b in message.content]  # type: ignore[union-attr]


def test_answered_calls_without_an_id_get_ids_of_their_own(client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    upstream.fail_next(answered())
    message = client.messages.create(**KW)
    _check(message.content, ANSWERED)
    assert message.stop_reason == "tool_use"
