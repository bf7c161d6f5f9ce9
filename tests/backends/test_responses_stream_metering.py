"""What a passed-through Responses stream that ends before its usage is charged: an estimate of
everything the upstream generated up to then, its reasoning (``response.reasoning_text.delta``,
``response.reasoning_summary_text.delta``), refusals, custom tool inputs and code interpreter code as
well as its text and function arguments, as a chat stream cut short is charged its
``reasoning_content``. A whole answer without usage is charged an estimate of the same kinds of
generated text in its output items. The openai SDK against a gateway on loopback and a loopback
Responses upstream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from backends.dev.echo_server import Exchange, send_json
from backends.estimate import estimate_text
from tests.backends.conftest import admin_gateway
from tests.conftest import ADMIN_KEY
from tests.support.doubles import RecordingSink
from tests.support.fake_responses import FakeResponsesUpstream, send_events

REASONING = "first I weigh every option there is, then I pick the cheapest one of them all"
# the deltas streamed before the upstream fails, by event type
DELTAS = {"response.output_text.delta": REASONING, "response.function_call_arguments.delta": REASONING,
          "response.reasoning_text.delta": REASONING, "response.reasoning_summary_text.delta": REASONING,
          "response.refusal.delta": REASONING, "response.custom_tool_call_input.delta": REASONING,
          "response.code_interpreter_call_code.delta": REASONING}

# the output item each delta type builds, holding REASONING as a whole answer carries it
ITEMS: dict[str, Any] = {
    "response.output_text.delta": {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                                   "content": [{"type": "output_text", "text": REASONING, "annotations": []}]},
    "response.function_call_arguments.delta": {"type": "function_call", "id": "fc_1", "call_id": "call_1",
                                               "name": "pick", "arguments": REASONING, "status": "completed"},
    "response.reasoning_text.delta": {"type": "reasoning", "id": "rs_1", "summary": [],
                                      "content": [{"type": "reasoning_text", "text": REASONING}]},
    "response.reasoning_summary_text.delta": {"type": "reasoning", "id": "rs_1",
                                              "summary": [{"type": "summary_text", "text": REASONING}]},
    "response.refusal.delta": {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                               "content": [{"type": "refusal", "refusal": REASONING}]},
    "response.custom_tool_call_input.delta": {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1",
                                              "name": "pick", "input": REASONING, "status": "completed"},
    "response.code_interpreter_call_code.delta": {"type": "code_interpreter_call", "id": "ci_1", "code": REASONING,
                                                  "container_id": "cntr_1", "outputs": None, "status": "completed"},
}


class ReasoningThenFailing(FakeResponsesUpstream):
    """Streams one delta of the event type the input names, then an ``error`` event: no usage comes.
    Unstreamed, answers the output item that delta builds, without usage."""

    async def handle(self, ex: Exchange) -> None:
        body = ex.json()
        if not body.get("stream"):
            return await send_json(ex, 200, self.response(body) | {"output": [ITEMS[body["input"]]], "usage": None})
        start = self.response(body, "in_progress") | {"output": []}
        events: list[dict[str, Any]] = [{"type": "response.created", "response": start},
                                        {"type": body["input"], "item_id": "rs_1", "output_index": 0,
                                         "content_index": 0, "delta": DELTAS[body["input"]]},
                                        {"type": "error", "code": "server_error", "message": "broke", "param": None}]
        await send_events(ex, events)


@pytest.fixture(scope="module")
def usage() -> RecordingSink:
    return RecordingSink()


@pytest.fixture(scope="module")
def client(usage: RecordingSink) -> Iterator[openai.OpenAI]:
    upstream = ReasoningThenFailing().start()
    deployment = {"provider": "openai", "model": "up", "api_base": upstream.url, "responses_api": True}
    prices = {"native": {"input_per_million": 1.0, "output_per_million": 10.0}}
    with admin_gateway([{"name": "native", "max_retries": 0, "deployments": [deployment]}], prices, usage) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key=ADMIN_KEY, max_retries=0)
    upstream.stop()


@pytest.mark.parametrize("event", sorted(DELTAS))
def test_a_stream_failing_after_its_reasoning_is_charged_the_reasoning(client: openai.OpenAI, usage: RecordingSink,
                                                                      event: str) -> None:
    before = len(usage.records)
    events = list(client.responses.create(model="native", input=event, stream=True))
    assert events[-1].type in ("error", "response.failed")
    record = usage.wait_for(before + 1)[before]
    assert record.exact is False
    assert record.completion_tokens == estimate_text(REASONING)
    assert record.cost == pytest.approx((record.prompt_tokens * 1.0 + record.completion_tokens * 10.0) / 1e6)


@pytest.mark.parametrize("event", sorted(ITEMS))
def test_a_whole_answer_without_usage_is_charged_its_generated_text(client: openai.OpenAI, usage: RecordingSink,
                                                                   event: str) -> None:
    before = len(usage.records)
    client.responses.create(model="native", input=event)
    record = usage.wait_for(before + 1)[before]
    assert record.exact is False
    assert record.completion_tokens == estimate_text(REASONING)
    assert record.cost == pytest.approx((record.prompt_tokens * 1.0 + record.completion_tokens * 10.0) / 1e6)
