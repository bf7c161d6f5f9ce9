"""A conversation kept by the gateway that began from a response only an upstream serving Responses
holds (``upstream_previous_id``), continued where it would be translated to chat: refused as a 400
naming ``previous_response_id``, never answered without its first turns."""

from __future__ import annotations

from collections.abc import Iterator

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
