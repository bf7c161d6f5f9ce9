"""gateway.calls: each endpoint's call is described once, with what admission and routing need."""

from __future__ import annotations

import msgspec
import pytest

from backends.openai_wire import ChatCompletionRequest, CompletionRequest
from gateway.calls import describe_chat, describe_completion
from gateway.contracts import Principal
from gateway.dialects.anthropic import ANTHROPIC, MessagesRequest, to_chat_request
from gateway.errors import ApiError
from gateway.routing.cache_aware import chat_prefix

WHO = Principal(key_id="k", tenant_id="t")
TURNS = [{"role": "system", "content": "You sell bicycles."}, {"role": "user", "content": "Do you repair tyres?"}]


def test_chat_call_carries_reservation_and_routing_facts() -> None:
    body = msgspec.convert({"model": "m", "messages": TURNS, "n": 3, "max_tokens": 50, "stream": True},
                           ChatCompletionRequest)
    call = describe_chat(WHO, body)
    assert (call.endpoint, call.model, call.stream, call.output_limit, call.sequences) == (
        "chat.completions", "m", True, 50, 3)
    assert call.prompt_tokens > 0 and call.routing_key == chat_prefix(body)


def test_messages_calls_get_the_same_routing_key_as_chat() -> None:
    """/v1/messages used to route with a random key under cache_aware: now the key is the chat's."""
    messages = msgspec.convert({"model": "m", "max_tokens": 20, "system": "You sell bicycles.",
                                "messages": [{"role": "user", "content": "Do you repair tyres?"}]}, MessagesRequest)
    call = describe_chat(WHO, to_chat_request(messages), endpoint="messages", dialect=ANTHROPIC)
    chat = describe_chat(WHO, msgspec.convert({"model": "m", "messages": TURNS}, ChatCompletionRequest))
    assert call.routing_key and call.routing_key == chat.routing_key
    assert call.endpoint == "messages" and call.dialect is ANTHROPIC and call.output_limit == 20


def test_completion_call_counts_every_prompt_and_refuses_mixed_prompts() -> None:
    body = msgspec.convert({"model": "m", "prompt": ["a b", "c"], "n": 2}, CompletionRequest)
    call = describe_completion(WHO, body)
    assert call.sequences == 4 and call.routing_key == "a b" and call.output_limit is None
    mixed = msgspec.convert({"model": "m", "prompt": ["a", [1, 2]]}, CompletionRequest)
    with pytest.raises(ApiError) as refused:
        describe_completion(WHO, mixed)
    assert refused.value.status == 400 and refused.value.param == "prompt"
