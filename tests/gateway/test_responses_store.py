"""The Responses API through the real app (build_services) on SQLite and PostgreSQL, with the openai
SDK as the client: answers stored per tenant (``store``, ``previous_response_id``,
``GET``/``DELETE``/``input_items``; one tenant never sees another's), translated to chat for the
loopback echo upstream, and passed through as sent, both ways, to a loopback upstream that serves
Responses itself (``responses_api: true``), metered from its usage."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.db import Database
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.tenancy_fixtures import db, plain_url  # noqa: F401
from tests.gateway.test_tenant_e2e import wait_for_rows
from tests.support.fake_responses import (
    ECHO_FAILURE,
    FAIL_PART_WAY,
    SEARCH,
    SEARCH_FAIL,
    USAGE,
    FailingResponsesUpstream,
    FakeResponsesUpstream,
)
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.servers import ServerThread


@dataclass
class Gateway:
    url: str
    admin: httpx.Client

    def tenant_client(self) -> openai.OpenAI:
        return self.tenant()[1]

    def tenant(self) -> tuple[str, openai.OpenAI]:
        r = self.admin.post("/admin/v1/tenants", json={"name": f"t-{uuid.uuid4().hex[:8]}"})
        key = self.admin.post("/admin/v1/keys", json={"tenant_id": r.json()["id"]}).json()["key"]
        return r.json()["id"], openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=20)


NATIVE_KEY = "sk-native-upstream-secret"  # the native deployment's key: long enough to be redacted


@pytest.fixture(scope="module")
def responses_upstream() -> Iterator[FakeResponsesUpstream]:
    server = FailingResponsesUpstream().start()
    yield server
    server.stop()


@pytest.fixture
def native(responses_upstream: FakeResponsesUpstream) -> FakeResponsesUpstream:
    responses_upstream.received.clear()
    return responses_upstream


@pytest.fixture(scope="module")
def gateway(db: Database, fake_upstream_server: FakeUpstream, responses_upstream: FakeResponsesUpstream,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    deployment = {"provider": "openai", "model": "upstream-echo", "api_base": fake_upstream_server.url,
                  "api_key": "sk-up"}
    native = {"provider": "openai", "model": "up-model", "api_base": responses_upstream.url, "api_key": NATIVE_KEY,
              "responses_api": True}
    settings = gateway_settings(fake_upstream_server.url, auth={"admin_key": ADMIN_KEY},
                                database={"url": plain_url(db)},
                                models=[{"name": "echo", "deployments": [deployment]},
                                        {"name": "native", "deployments": [native]}],
                                prices={"native": {"per_tool_call": {"web_search": 0.01}}})  # tokens free
    settings.usage.journal_dir = str(tmp_path_factory.mktemp("journal"))
    with (
        ServerThread(create_app(settings)) as server,
        httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=20) as admin,
    ):
        yield Gateway(server.url, admin)


def test_a_conversation_continues_by_id(gateway: Gateway, upstream: FakeUpstream) -> None:
    client = gateway.tenant_client()
    first = client.responses.create(model="echo", input="my name is Ada", instructions="be brief")
    assert first.store is True and first.previous_response_id is None
    second = client.responses.create(model="echo", input="what is my name?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    # the earlier turns reach the provider; the first call's instructions are not carried over
    assert upstream.last.json["messages"] == [
        {"role": "user", "content": "my name is Ada"},
        {"role": "assistant", "content": "my name is Ada"},
        {"role": "user", "content": "what is my name?"},
    ]
    third = client.responses.create(model="echo", input="and again", previous_response_id=second.id)
    assert [m["content"] for m in upstream.last.json["messages"]] == [
        "my name is Ada", "my name is Ada", "what is my name?", "what is my name?", "and again"]
    kept = client.responses.retrieve(third.id)
    assert kept.id == third.id and kept.output_text == "and again" and kept.previous_response_id == second.id
    assert kept.usage is not None and kept.usage.output_tokens == third.usage.output_tokens  # type: ignore[union-attr]


def test_a_streamed_answer_is_stored_before_it_completes(gateway: Gateway, upstream: FakeUpstream) -> None:
    client = gateway.tenant_client()
    events = list(client.responses.create(model="echo", input="streamed and kept", stream=True))
    final = events[-1].response  # type: ignore[union-attr]
    assert events[-1].type == "response.completed" and final.store is True
    # continued at once, with no pause after the last event
    client.responses.create(model="echo", input="next", previous_response_id=final.id)
    assert [m["content"] for m in upstream.last.json["messages"]] == ["streamed and kept", "streamed and kept", "next"]
    assert client.responses.retrieve(final.id).output_text == "streamed and kept"


def test_function_calls_are_kept_in_the_conversation(gateway: Gateway, upstream: FakeUpstream) -> None:
    client = gateway.tenant_client()
    tools = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]
    upstream.fail_next(Fault(status=200, body={
        "id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion", "created": 1, "model": "upstream-echo",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}}))
    first = client.responses.create(model="echo", input="look it up", tools=tools)  # type: ignore[arg-type]
    client.responses.create(model="echo", tools=tools, previous_response_id=first.id,  # type: ignore[arg-type]
                            input=[{"type": "function_call_output", "call_id": "call_9", "output": "42"}])
    sent = upstream.last.json["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[1]["tool_calls"][0]["id"] == "call_9" and sent[2]["tool_call_id"] == "call_9"


def test_input_items_are_listed_with_ids_in_either_order(gateway: Gateway) -> None:
    client = gateway.tenant_client()
    response = client.responses.create(model="echo", input=[  # type: ignore[arg-type]
        {"role": "developer", "content": "rules"}, {"role": "user", "content": "one"},
        {"role": "user", "content": [{"type": "input_text", "text": "two"}]}])
    desc = client.responses.input_items.list(response.id)
    texts = [item.content[0].text for item in desc.data]  # type: ignore[union-attr]
    assert texts == ["two", "one", "rules"] and all(item.id for item in desc.data)
    asc = client.responses.input_items.list(response.id, order="asc", limit=2)
    assert [item.content[0].text for item in asc.data] == ["rules", "one"]  # type: ignore[union-attr]
    assert asc.has_more is True
    rest = client.responses.input_items.list(response.id, order="asc", after=asc.data[-1].id)
    assert [item.content[0].text for item in rest.data] == ["two"] and rest.has_more is False  # type: ignore[union-attr]


def test_store_false_keeps_nothing(gateway: Gateway) -> None:
    client = gateway.tenant_client()
    response = client.responses.create(model="echo", input="forget me", store=False)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="echo", input="x", previous_response_id=response.id)
    assert err.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_delete(gateway: Gateway) -> None:
    client = gateway.tenant_client()
    response = client.responses.create(model="echo", input="short lived")
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(response.id)


def test_one_tenant_never_sees_anothers(gateway: Gateway) -> None:
    alice, mallory = gateway.tenant_client(), gateway.tenant_client()
    secret = alice.responses.create(model="echo", input="alice's secret")
    with pytest.raises(openai.NotFoundError):
        mallory.responses.retrieve(secret.id)
    with pytest.raises(openai.NotFoundError):
        mallory.responses.input_items.list(secret.id)
    with pytest.raises(openai.NotFoundError):
        mallory.responses.delete(secret.id)
    with pytest.raises(openai.BadRequestError):
        mallory.responses.create(model="echo", input="continue", previous_response_id=secret.id)
    assert alice.responses.retrieve(secret.id).output_text == "alice's secret"  # untouched by the attempts


def test_another_tenants_id_is_not_passed_to_an_upstream_serving_responses(
        gateway: Gateway, native: FakeResponsesUpstream) -> None:
    """An upstream serving Responses resolves ids for whoever sends them: an id the gateway holds for
    another tenant is refused here, never passed on."""
    alice, mallory = gateway.tenant_client(), gateway.tenant_client()
    secret = alice.responses.create(model="native", input="alice's secret")
    sent_before = len(native.received)
    with pytest.raises(openai.BadRequestError):
        mallory.responses.create(model="native", input="continue", previous_response_id=secret.id)
    assert len(native.received) == sent_before
    mallory.responses.create(model="native", input="go on", previous_response_id="resp_only_upstream_knows")
    assert native.received[-1]["previous_response_id"] == "resp_only_upstream_knows"  # unknown ids still go


def test_bad_listing_parameters_are_400s(gateway: Gateway) -> None:
    client = gateway.tenant_client()
    response = client.responses.create(model="echo", input="x")
    for params in ({"limit": 0}, {"limit": 101}, {"order": "sideways"}, {"after": "msg_nope"}):
        r = httpx.get(f"{gateway.url}/v1/responses/{response.id}/input_items", params=params,
                      headers={"authorization": f"Bearer {client.api_key}"})
        assert r.status_code == 400, (params, r.text)
        assert r.json()["error"]["message"]


def test_what_a_stored_response_cannot_give_is_a_400_naming_it(gateway: Gateway) -> None:
    """A stored response is read back as kept: a replayed stream or fields to add are refused, not ignored."""
    client = gateway.tenant_client()
    response = client.responses.create(model="echo", input="kept")
    for params, param in (({"stream": "true"}, "stream"), ({"include[]": "reasoning.encrypted_content"}, "include"),
                          ({"include": "reasoning.encrypted_content"}, "include")):  # as curl users write it
        r = httpx.get(f"{gateway.url}/v1/responses/{response.id}", params=params,
                      headers={"authorization": f"Bearer {client.api_key}"})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (params, r.text)
    assert client.responses.retrieve(response.id, stream=False).output_text == "kept"


# ---------------------------------------------------------------- translated: fields without a chat twin


def test_translated_requests_map_or_refuse_unmodelled_fields(gateway: Gateway, upstream: FakeUpstream) -> None:
    client = gateway.tenant_client()
    response = client.responses.create(model="echo", input="x", reasoning={"effort": "low"}, metadata={"k": "v"},
                                       parallel_tool_calls=False, include=[], truncation="disabled")
    sent = upstream.last.json
    assert sent["reasoning_effort"] == "low" and "metadata" not in sent  # the response's own: kept, not sent
    assert "parallel_tool_calls" not in sent  # no tools: OpenAI's chat refuses it
    assert "include" not in sent and "truncation" not in sent
    assert response.metadata == {"k": "v"} and client.responses.retrieve(response.id).metadata == {"k": "v"}
    for kwargs, param in (({"include": ["file_search_call.results"]}, "include"),
                          ({"truncation": "auto"}, "truncation"),
                          ({"tools": [{"type": "web_search"}]}, "tools[0]"),
                          ({"extra_body": {"brand_new_field": 1}}, "brand_new_field")):
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="echo", input="x", **kwargs)  # type: ignore[arg-type]
        assert err.value.body["param"] == param, kwargs  # type: ignore[index]


# ---------------------------------------------------------------- passed through (responses_api: true)


def test_passed_through_as_sent_and_relayed_as_it_came(gateway: Gateway, native: FakeResponsesUpstream,
                                                       db: Database) -> None:
    tenant, client = gateway.tenant()
    sent = {"input": "hello native", "reasoning": {"effort": "low", "summary": "detailed"},
            "include": ["reasoning.encrypted_content"], "metadata": {"k": "v"}, "max_output_tokens": 50,
            "tools": [{"type": "web_search"}]}
    response = client.responses.create(model="native", **sent)  # type: ignore[arg-type]
    assert native.received[-1] == sent | {"model": "up-model"}
    assert response.model == "native" and response.output_text == "hello native"
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.model_extra and response.model_extra["x_vendor_field"] == {"kept": True}
    assert response.usage is not None and response.usage.input_tokens == USAGE["input_tokens"]
    row = wait_for_rows(db, tenant, 1)[0]
    assert (row.endpoint, row.prompt_tokens, row.completion_tokens, row.cached_tokens, row.exact) == (
        "responses", 7, 3, 2, True)


def test_a_passed_through_failure_echoing_the_providers_key_does_not_hand_it_over(gateway: Gateway) -> None:
    client = gateway.tenant_client()
    failed = client.responses.create(model="native", input=ECHO_FAILURE)
    assert failed.status == "failed" and failed.error is not None and failed.error.message.startswith("refused ")
    events = list(client.responses.create(model="native", input=ECHO_FAILURE, stream=True))
    assert events[-1].type == "response.failed"
    for answer in (failed, events[-1].response):
        assert NATIVE_KEY not in answer.model_dump_json()


def test_a_passed_through_stream_is_relayed_event_for_event(gateway: Gateway, native: FakeResponsesUpstream) -> None:
    client = gateway.tenant_client()
    events = list(client.responses.create(model="native", input="one two three", stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.reasoning_summary_text.delta" in kinds  # an event the gateway does not model
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "onetwothree"
    final = events[-1].response  # type: ignore[union-attr]
    assert final.model == "native" and final.id.startswith("resp_up_")
    assert native.received[-1]["stream"] is True
    assert client.responses.retrieve(final.id).output_text == "one two three"  # kept by the gateway too


def test_built_in_tool_calls_are_priced_per_call_into_cost_and_budgets(gateway: Gateway, db: Database) -> None:
    """Each web_search_call item of an answer costs the model's per_tool_call price (the file search
    is not priced, the client's function call is not the provider's), stream or not, and the fees
    count against the tenant's money budget (each request reserving its max_tool_calls searches)."""
    tenant, client = gateway.tenant()
    gateway.admin.patch(f"/admin/v1/tenants/{tenant}/limits",
                        json={"cost_budget": 0.04, "budget_period": "total"}).raise_for_status()
    tools: Any = [{"type": "web_search"}, {"type": "file_search", "vector_store_ids": ["vs_1"]}]
    answer = client.responses.create(model="native", input=f"{SEARCH} one", tools=tools, max_tool_calls=3)
    assert [item.type for item in answer.output][-4:] == ["web_search_call", "web_search_call",
                                                          "file_search_call", "function_call"]
    list(client.responses.create(model="native", input=f"{SEARCH} two", tools=tools, max_tool_calls=2, stream=True))
    rows = wait_for_rows(db, tenant, 2)
    assert [row.cost for row in rows] == [pytest.approx(0.02), pytest.approx(0.02)]
    with pytest.raises(openai.RateLimitError) as refused:  # 0.04 spent of 0.04: no room for one search
        client.responses.create(model="native", input="hello", tools=tools, max_tool_calls=1)
    assert "spending budget" in refused.value.message


def test_a_stream_failing_after_a_search_still_prices_it(gateway: Gateway, db: Database) -> None:
    """A web search made before the stream failed (its output item done, no final event to report
    it) costs its per-call price all the same."""
    tenant, client = gateway.tenant()
    events = list(client.responses.create(model="native", input=SEARCH_FAIL, stream=True))
    assert events[-1].type == "error"  # the upstream's own, its last event
    assert [row.cost for row in wait_for_rows(db, tenant, 1)] == [pytest.approx(0.01)]


def test_a_kept_conversation_continues_on_a_native_upstream(gateway: Gateway, native: FakeResponsesUpstream) -> None:
    client = gateway.tenant_client()
    first = client.responses.create(model="native", input="my name is Ada")
    second = client.responses.create(model="native", input="what is my name?", previous_response_id=first.id)
    body = native.received[-1]
    assert "previous_response_id" not in body  # the gateway holds the conversation; the upstream gets it whole
    assert [item["type"] for item in body["input"]] == ["message", "reasoning", "message", "message"]
    assert body["input"][0] == {"type": "message", "role": "user",
                                "content": [{"type": "input_text", "text": "my name is Ada"}]}
    assert body["input"][1]["encrypted_content"] == "opaque"  # the upstream's own item, as it sent it
    assert body["input"][2]["role"] == "assistant" and "id" not in body["input"][2]
    assert second.previous_response_id == first.id
    # an id the gateway never kept goes to the upstream as it is (the provider may hold it)
    client.responses.create(model="native", input="again", previous_response_id="resp_upstream_only")
    assert native.received[-1]["previous_response_id"] == "resp_upstream_only"


def test_reasoning_made_of_a_chat_answer_is_not_sent_to_a_native_upstream(
        gateway: Gateway, upstream: FakeUpstream, native: FakeResponsesUpstream) -> None:
    upstream.fail_next(Fault(status=200, body={
        "id": "chatcmpl-r", "object": "chat.completion", "created": 1, "model": "upstream-echo",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "reasoning_content": "hmm", "content": "Ada"}}]}))
    client = gateway.tenant_client()
    first = client.responses.create(model="echo", input="my name is Ada")
    assert [item.type for item in first.output] == ["reasoning", "message"]
    client.responses.create(model="native", input="what is my name?", previous_response_id=first.id)
    assert [item["type"] for item in native.received[-1]["input"]] == ["message", "message", "message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_kept_turn_chat_cannot_carry_is_a_400_naming_previous_response_id(gateway: Gateway, stream: bool) -> None:
    # kept from a native upstream: an image by file_id, which chat has no field for; the new input is plain text
    client = gateway.tenant_client()
    first = client.responses.create(model="native", input=[{"role": "user", "content": [
        {"type": "input_image", "file_id": "file_1", "detail": "auto"}, {"type": "input_text", "text": "what?"}]}])
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="echo", input="next", previous_response_id=first.id, stream=stream)
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "previous_response_id", error
    assert "file_id" in error["message"]


# ---------------------------------------------------------------- ids: an upstream's reused ids never collide


def _answer_with_id(upstream: FakeUpstream, text: str, completion_id: str = "chatcmpl-123") -> None:
    upstream.fail_next(Fault(status=200, body={
        "id": completion_id, "object": "chat.completion", "created": 1, "model": "upstream-echo",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}))


def test_an_upstreams_reused_completion_ids_never_collide(gateway: Gateway, upstream: FakeUpstream) -> None:
    """The upstream answers every completion as ``chatcmpl-123`` (as Ollama reuses ids): each stored
    response still has an id of its own, and no tenant's answer replaces or takes over another's."""
    alice, bob = gateway.tenant_client(), gateway.tenant_client()
    _answer_with_id(upstream, "alice's secret")
    secret = alice.responses.create(model="echo", input="x")
    _answer_with_id(upstream, "bob's answer")
    other = bob.responses.create(model="echo", input="y")
    assert other.id != secret.id
    assert alice.responses.retrieve(secret.id).output_text == "alice's secret"
    assert bob.responses.retrieve(other.id).output_text == "bob's answer"
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(secret.id)
    _answer_with_id(upstream, "alice's second")
    second = alice.responses.create(model="echo", input="z")
    assert second.id != secret.id and alice.responses.retrieve(secret.id).output_text == "alice's secret"
    alice.responses.create(model="echo", input="go on", previous_response_id=secret.id)
    assert [m["content"] for m in upstream.last.json["messages"]] == ["x", "alice's secret", "go on"]


def test_a_streamed_response_has_one_id_in_every_event_and_in_the_store(gateway: Gateway,
                                                                      upstream: FakeUpstream) -> None:
    client = gateway.tenant_client()
    chunk = {"id": "chatcmpl-123", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": "streamed"}, "finish_reason": "stop"}]}
    stream = Fault(status=200, headers={"content-type": "text/event-stream"},
                   body=b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n")
    upstream.fail_next(stream, stream)
    ids = []
    for _ in range(2):
        events = list(client.responses.create(model="echo", input="x", stream=True))
        seen = {e.response.id for e in events if hasattr(e, "response")}  # type: ignore[union-attr]
        assert len(seen) == 1 and events[-1].type == "response.completed"
        ids += seen
    assert ids[0] != ids[1]
    assert [client.responses.retrieve(i).id for i in ids] == ids


def test_a_passed_through_id_already_stored_is_not_replaced(gateway: Gateway, native: FakeResponsesUpstream) -> None:
    """An upstream serving Responses that reuses its ids: the first answer stored under an id keeps
    it (and its owner); a later one under the same id is answered but not stored."""
    alice, bob = gateway.tenant_client(), gateway.tenant_client()
    ids = native._ids
    native._ids = itertools.repeat(uuid.uuid4().hex)  # every answer under one id
    try:
        first = alice.responses.create(model="native", input="alice's secret")
        again = bob.responses.create(model="native", input="bob's text")
        assert again.id == first.id and again.output_text == "bob's text"  # answered as the upstream sent it
        with pytest.raises(openai.NotFoundError):
            bob.responses.retrieve(again.id)  # not stored: the id is taken
        assert alice.responses.retrieve(first.id).output_text == "alice's secret"
        alice.responses.create(model="native", input="alice's other")
        assert alice.responses.retrieve(first.id).output_text == "alice's secret"  # not replaced either
    finally:
        native._ids = ids


# ---------------------------------------------------------------- a chain that starts at the upstream


def test_a_chain_from_an_upstream_only_response_keeps_it(gateway: Gateway, native: FakeResponsesUpstream) -> None:
    """Turn B continues a response only the upstream holds (A); the gateway keeps B. Turn C, from
    B, goes with B's turn and A's id, so the upstream still reaches A, and so does turn D."""
    client = gateway.tenant_client()
    b = client.responses.create(model="native", input="turn B", previous_response_id="resp_upstream_only_A")
    assert native.received[-1]["previous_response_id"] == "resp_upstream_only_A"
    c = client.responses.create(model="native", input="turn C", previous_response_id=b.id)
    sent = native.received[-1]
    assert sent["previous_response_id"] == "resp_upstream_only_A"
    assert [item.get("role", item["type"]) for item in sent["input"]] == ["user", "reasoning", "assistant", "user"]
    assert sent["input"][0]["content"][0]["text"] == "turn B" and sent["input"][3]["content"][0]["text"] == "turn C"
    assert c.previous_response_id == b.id
    client.responses.create(model="native", input="turn D", previous_response_id=c.id)
    sent = native.received[-1]
    assert sent["previous_response_id"] == "resp_upstream_only_A" and len(sent["input"]) == 7
    # the record of the chain's start stays inside the gateway
    assert [item.id for item in client.responses.input_items.list(c.id).data] and \
        all(item.type == "message" for item in client.responses.input_items.list(c.id).data)


# ---------------------------------------------------------------- a stream that fails part-way


def test_a_stream_failing_part_way_ends_failed_and_is_not_stored(gateway: Gateway, upstream: FakeUpstream) -> None:
    client = gateway.tenant_client()
    upstream.fail_next(Fault(error_after_chunks=2))
    events = list(client.responses.create(model="echo", input="one two three four", stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and "response.output_text.delta" in kinds
    assert kinds[-2:] == ["error", "response.failed"] and "response.completed" not in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    failed = events[-1].response  # type: ignore[union-attr]
    assert failed.status == "failed" and failed.error is not None and failed.error.message
    assert events[-2].code == failed.error.code and not events[-2].code.isdigit()  # type: ignore[union-attr]
    assert failed.id == events[0].response.id  # type: ignore[union-attr]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(failed.id)


def test_an_upstream_stream_cut_short_ends_failed_and_is_not_stored(gateway: Gateway, upstream: FakeUpstream) -> None:
    """A chat upstream's stream that ends with no finish_reason (the connection closed) is an error
    of the backend's, so the response fails: never ``response.completed``, never stored."""
    client = gateway.tenant_client()
    chunk = {"id": "chatcmpl-cut", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": "partial"}, "finish_reason": None}]}
    upstream.fail_next(Fault(status=200, headers={"content-type": "text/event-stream"},
                             body=b"data: " + json.dumps(chunk).encode() + b"\n\n"))
    events = list(client.responses.create(model="echo", input="x", stream=True))
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
    assert events[-1].response.status == "failed"  # type: ignore[union-attr]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(events[-1].response.id)  # type: ignore[union-attr]


def test_a_passed_through_stream_failing_part_way_ends_with_its_error(
        gateway: Gateway, native: FakeResponsesUpstream) -> None:
    """The upstream's own ``error`` event, its last, is relayed as it came: no ``response.failed``
    made up after it; the response, never finished, is not stored."""
    client = gateway.tenant_client()
    events = list(client.responses.create(model="native", input=FAIL_PART_WAY, stream=True))
    kinds = [e.type for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added", "error"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].model_dump() == {"type": "error", "code": "server_error", "message": "the upstream broke",
                                       "param": None, "sequence_number": 3}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(events[0].response.id)  # type: ignore[union-attr]
