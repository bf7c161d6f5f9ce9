"""A conversation kept by the gateway that began from a response only an upstream serving Responses
holds (``upstream_previous_id``), continued where it would be translated to chat: refused as a 400
naming ``previous_response_id``, never answered without its first turns."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.db import Database
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.tenancy_fixtures import db, plain_url  # noqa: F401
from tests.gateway.test_responses_store import Gateway, native, responses_upstream  # noqa: F401
from tests.support.fake_responses import FakeResponsesUpstream
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import ServerThread


@pytest.fixture(scope="module")
def chains(db: Database, fake_upstream_server: FakeUpstream, responses_upstream: FakeResponsesUpstream,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    chat = {"provider": "openai", "model": "upstream-echo", "api_base": fake_upstream_server.url, "api_key": "sk-up"}
    native = {"provider": "openai", "model": "up-model", "api_base": responses_upstream.url, "api_key": "sk-n",
              "responses_api": True}
    down = native | {"api_base": "http://127.0.0.1:9"}  # refuses connections: its fallback answers
    settings = gateway_settings(fake_upstream_server.url, auth={"admin_key": ADMIN_KEY},
                                database={"url": plain_url(db)},
                                models=[{"name": "echo", "deployments": [chat]},
                                        {"name": "native", "deployments": [native]},
                                        {"name": "native-down", "deployments": [down], "max_retries": 0,
                                         "fallbacks": ["echo"]}])
    settings.usage.journal_dir = str(tmp_path_factory.mktemp("journal"))
    with (
        ServerThread(create_app(settings)) as server,
        httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=20) as admin,
    ):
        yield Gateway(server.url, admin)


def _refused(err: pytest.ExceptionInfo[openai.BadRequestError]) -> None:
    assert err.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert "upstream" in err.value.body["message"]  # type: ignore[index]


def test_a_chain_from_an_upstream_only_response_is_not_continued_through_chat(
        chains: Gateway, native: FakeResponsesUpstream, upstream: FakeUpstream) -> None:
    """Turn B continued A, which only the upstream holds: chat cannot reach A, so B's conversation
    continued on a chat model is a 400, not an answer that never saw A."""
    client = chains.tenant_client()
    b = client.responses.create(model="native", input="turn B", previous_response_id="resp_upstream_only_A")
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="echo", input="turn C", previous_response_id=b.id)
    _refused(err)
    assert not upstream.received
    plain = client.responses.create(model="native", input="turn B2")  # a chain kept whole goes on through chat
    client.responses.create(model="echo", input="turn C2", previous_response_id=plain.id)
    assert [m["role"] for m in upstream.last.json["messages"]] == ["user", "assistant", "user"]


def test_an_upstream_only_previous_id_is_not_sent_to_a_chat_fallback(
        chains: Gateway, upstream: FakeUpstream) -> None:
    """An id the gateway does not hold goes to the upstream serving Responses; a chat fallback
    cannot resolve it, so the call is a 400 rather than an answer without the conversation."""
    client = chains.tenant_client()
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="native-down", input="go on", previous_response_id="resp_upstream_only_A")
    _refused(err)
    assert not upstream.received
    assert client.responses.create(model="native-down", input="fresh").output_text == "fresh"  # the fallback serves


def test_a_chain_of_long_upstream_ids_is_kept(chains: Gateway, native: FakeResponsesUpstream,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Response ids an upstream mints are of any length (a proxy encodes its route into them): a
    response under such an id, continuing another, is kept (on PostgreSQL VARCHAR(80) refused the
    row: ``store: true`` answered, then a 404) and continues by id."""
    monkeypatch.setattr(native, "id_prefix", "resp_" + "r" * 150 + "_")
    client = chains.tenant_client()
    first_id = "resp_" + "a" * 150  # only the upstream holds it
    b = client.responses.create(model="native", input="turn B", previous_response_id=first_id)
    assert len(b.id) > 150
    kept = client.responses.retrieve(b.id)
    assert kept.id == b.id and kept.output_text == "turn B"
    client.responses.create(model="native", input="turn C", previous_response_id=b.id)
    sent = native.received[-1]
    assert sent["previous_response_id"] == first_id and sent["input"][0]["content"][0]["text"] == "turn B"
    client.responses.delete(b.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(b.id)


def test_a_deleted_id_is_not_passed_to_an_upstream_serving_responses(chains: Gateway,
                                                                      native: FakeResponsesUpstream) -> None:
    """The upstream that answered a response still holds it once the gateway's copy is deleted, and
    resolves it for whoever sends its id: the deleted id is refused as not found, for its owner (as
    OpenAI refuses a deleted response) and for any other tenant, never passed on."""
    alice, mallory = chains.tenant_client(), chains.tenant_client()
    secret = alice.responses.create(model="native", input="alice's secret")
    alice.responses.delete(secret.id)
    sent_before = len(native.received)
    for client in (alice, mallory):
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="native", input="go on", previous_response_id=secret.id)
        assert err.value.body["code"] == "previous_response_not_found"  # type: ignore[index]
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(secret.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.delete(secret.id)
    assert len(native.received) == sent_before


def test_a_kept_conversation_goes_on_with_its_items_as_sent(chains: Gateway, native: FakeResponsesUpstream) -> None:
    """Items of kinds the gateway does not model go back to the upstream as the client sent them,
    with no id or status of the gateway's making (an upstream serving Responses refuses an id not
    of its own form, and a field an item kind lacks); the listing still gives each an id."""
    client = chains.tenant_client()
    items: list[Any] = [{"type": "custom_tool_call", "call_id": "call_c", "name": "apply_patch", "input": "diff"},
             {"type": "custom_tool_call_output", "call_id": "call_c", "output": "done"},
             {"type": "item_reference", "id": "msg_abc"}]
    first = client.responses.create(model="native", input=[{"role": "user", "content": "patch it"}, *items])
    client.responses.create(model="native", input=items[1:2], previous_response_id=first.id)
    sent = native.received[-1]["input"]
    assert sent[1:4] == items and sent[-1] == items[1]
    listed = client.responses.input_items.list(first.id, order="asc").data
    assert [item.type for item in listed] == ["message", *(item["type"] for item in items)]
    assert all(item.id for item in listed)
