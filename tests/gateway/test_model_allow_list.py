"""A key's model allow-list against groups served under a wildcard name (``gpt-*``)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway.contracts import Principal
from tests.conftest import gateway_settings
from tests.support.fake_upstream import FakeUpstream
from tests.support.scripted_gateway import scripted_gateway
from tests.support.servers import ServerThread

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
NAMED = "sk-test-named"  # may use "gpt-4o" alone, a name the group "gpt-*" serves
PATTERN = "sk-test-pattern"  # may use the group "gpt-*" itself: every name it serves


@pytest.fixture(scope="module")
def gateway(fake_upstream_server: FakeUpstream) -> Iterator[ServerThread]:
    deployment = {"provider": "openai", "model": "upstream-echo", "api_base": fake_upstream_server.url,
                  "api_key": "sk-up"}
    settings = gateway_settings(fake_upstream_server.url, models=[
        {"name": "echo", "deployments": [deployment]},
        {"name": "gpt-*", "deployments": [deployment | {"name": "gpt-dep"}]},
    ])
    keys = {NAMED: Principal(key_id="named", tenant_id="t1", allowed_models=frozenset({"gpt-4o"})),
            PATTERN: Principal(key_id="pattern", tenant_id="t1", allowed_models=frozenset({"gpt-*"}))}
    with scripted_gateway(settings, keys) as server:
        yield server


def sdk(server: ServerThread, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def test_a_key_allowed_a_name_a_wildcard_serves_may_use_that_name(gateway: ServerThread,
                                                                  upstream: FakeUpstream) -> None:
    client = sdk(gateway, NAMED)
    assert client.chat.completions.create(model="gpt-4o", messages=MESSAGES).choices
    assert client.models.retrieve("gpt-4o").id == "gpt-4o"
    assert [m.id for m in client.models.list()] == ["gpt-4o"]  # what it may use, though a wildcard serves it
    for other in ("gpt-3.5-turbo", "echo"):  # the allow-list names one model, not the wildcard's group
        with pytest.raises(openai.PermissionDeniedError) as err:
            client.chat.completions.create(model=other, messages=MESSAGES)
        assert err.value.code == "model_not_allowed"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve(other)


def test_a_key_allowed_the_wildcard_may_use_every_name_it_serves(gateway: ServerThread,
                                                                 upstream: FakeUpstream) -> None:
    client = sdk(gateway, PATTERN)
    for name in ("gpt-4o", "gpt-3.5-turbo"):
        assert client.chat.completions.create(model=name, messages=MESSAGES).choices
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model="echo", messages=MESSAGES)
    assert [m.id for m in client.models.list()] == []  # a wildcard's names cannot be listed
