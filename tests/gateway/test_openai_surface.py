"""The OpenAI SDK round-trips every request shape through the gateway to a loopback upstream."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from backends.factory import build_backend
from gateway.contracts import Principal
from gateway.routing.router import Router
from gateway.services import Services
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.conftest import GatewayEnv
from tests.support.doubles import RecordingSink, ScriptedAdmission, StaticKeys
from tests.support.fake_upstream import FakeUpstream, Fault


@pytest.fixture
def client(env: GatewayEnv) -> openai.OpenAI:
    return openai.OpenAI(base_url=env.base_url, api_key=ADMIN_KEY, max_retries=0)


@pytest.fixture
def aclient(env: GatewayEnv) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=env.base_url, api_key=ADMIN_KEY, max_retries=0)


def test_chat_completion_round_trip(client: openai.OpenAI, upstream: FakeUpstream, env: GatewayEnv) -> None:
    reply = client.chat.completions.create(
        model="echo",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there world"}],
        max_tokens=50, temperature=0.5, top_p=0.9, seed=7, stop=["\n\n"], presence_penalty=0.1,
        frequency_penalty=0.2, user="u-1",
    )
    assert reply.choices[0].message.content == "hello there world"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == "echo"
    assert reply.usage is not None and reply.usage.completion_tokens == 3
    sent = upstream.last.json
    assert upstream.last.path == "/v1/chat/completions"
    assert upstream.last.headers["authorization"] == "Bearer sk-up"
    assert sent["model"] == "upstream-echo"
    assert sent["temperature"] == 0.5 and sent["seed"] == 7 and sent["stop"] == ["\n\n"] and sent["user"] == "u-1"
    assert "logprobs" not in sent  # what the client did not send is not sent upstream
    record = env.usage.wait_for(1)[0]
    assert (record.model, record.status, record.completion_tokens, record.exact) == ("echo", 200, 3, True)
    assert record.cost > 0 and env.admission.settled[0].actual_tokens == reply.usage.total_tokens


def test_chat_passes_every_field_through(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "description": "d",
                                               "parameters": {"type": "object", "properties": {}}}}]
    reply = client.chat.completions.create(
        model="echo-alias",
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "part one "}, {"type": "text", "text": "two"}]}
        ],
        max_completion_tokens=2,
        n=2,
        stop="END",
        logprobs=True,
        top_logprobs=3,
        response_format={"type": "json_object"},
        tools=tools,
        tool_choice="auto",
    )
    assert [c.message.content for c in reply.choices] == ["part one ", "part one "]
    assert reply.choices[0].finish_reason == "length"
    sent = upstream.last.json
    assert sent["tools"][0]["function"]["name"] == "lookup" and sent["tool_choice"] == "auto"
    assert sent["response_format"] == {"type": "json_object"}
    assert sent["n"] == 2 and sent["logprobs"] is True and sent["top_logprobs"] == 3
    assert sent["max_completion_tokens"] == 2 and sent["stop"] == "END"


def test_chat_stream_with_usage(client: openai.OpenAI, upstream: FakeUpstream, env: GatewayEnv) -> None:
    stream = client.chat.completions.create(
        model="echo",
        messages=[{"role": "user", "content": "one two three four"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three four"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4
    assert all(c.model == "echo" for c in chunks)
    assert upstream.last.json["stream_options"] == {"include_usage": True}
    record = env.usage.wait_for(1)[0]
    assert record.stream and record.exact and record.completion_tokens == 4
    assert record.extra == {"outcome": "completed"}


def test_chat_stream_without_usage_strips_the_usage_chunk(
    client: openai.OpenAI, upstream: FakeUpstream, env: GatewayEnv
) -> None:
    chunks = list(
        client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "a b c"}], stream=True)
    )
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)
    # the gateway asked the upstream for usage anyway, so it meters exactly
    assert upstream.last.json["stream_options"] == {"include_usage": True}
    assert env.usage.wait_for(1)[0].exact


def test_stream_usage_is_estimated_when_the_upstream_reports_none(
    client: openai.OpenAI, upstream: FakeUpstream, env: GatewayEnv
) -> None:
    upstream.options.report_usage = False
    chunks = list(
        client.chat.completions.create(
            model="echo",
            messages=[{"role": "user", "content": "alpha beta gamma"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 3
    record = env.usage.wait_for(1)[0]
    assert not record.exact and record.completion_tokens >= 3 and record.prompt_tokens > 0


def test_completions_round_trip(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    reply = client.completions.create(
        model="echo", prompt="say this back", max_tokens=10, temperature=0, echo=False, stop=["x"]
    )
    assert reply.choices[0].text == "say this back"
    assert reply.object == "text_completion"
    assert upstream.last.path == "/v1/completions" and upstream.last.json["prompt"] == "say this back"
    listed = client.completions.create(model="echo", prompt=["first prompt", "second"], max_tokens=1)
    assert listed.choices[0].text == "first " and listed.choices[0].finish_reason == "length"
    tokens = client.completions.create(model="echo", prompt=[1, 2, 3])
    assert tokens.choices[0].text


def test_completions_stream(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model="echo", prompt="stream me please", stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "stream me please"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


async def test_async_client_chat_and_stream(aclient: openai.AsyncOpenAI) -> None:
    reply = await aclient.chat.completions.create(model="echo", messages=[{"role": "user", "content": "async hi"}])
    assert reply.choices[0].message.content == "async hi"
    stream = await aclient.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "x y"}], stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "x y"
    assert chunks[-1].usage is not None
    completion = await aclient.completions.create(model="echo", prompt="p q")
    assert completion.choices[0].text == "p q"
    models = await aclient.models.list()
    assert "echo" in [m.id for m in models.data]


def test_models_list_and_retrieve(client: openai.OpenAI, env: GatewayEnv) -> None:
    ids = [m.id for m in client.models.list().data]
    assert ids == ["echo", "echo-alias", "other", "impatient", "trimmed", "dead"]
    assert client.models.retrieve("echo").id == "echo"
    assert client.models.retrieve("echo-alias").id == "echo-alias"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_aliases_are_listed_as_models_but_not_wildcards(start_gateway: Any, upstream: FakeUpstream) -> None:
    """An alias is a model a client can name: listed and retrieved with the model's card (its own id,
    ``alias_of`` the model); a wildcard alias matches names that cannot be listed, but resolves."""
    deployment = {"provider": "openai", "model": "upstream-echo", "api_base": upstream.url}
    settings = gateway_settings(upstream.url, models=[
        {"name": "echo", "aliases": ["gpt-4o-mini", "echo-*"], "owned_by": "acme", "deployments": [deployment]}])
    services = Services(authenticator=StaticKeys({ADMIN_KEY: Principal(key_id="admin", tenant_id=None, is_admin=True)}),
                        admission=ScriptedAdmission(), usage=RecordingSink(),
                        router=Router.from_settings(settings, build_backend))
    client = openai.OpenAI(base_url=start_gateway(settings, services).url + "/v1", api_key=ADMIN_KEY, max_retries=0)
    cards = [m.model_dump() for m in client.models.list().data]
    assert [c["id"] for c in cards] == ["echo", "gpt-4o-mini"]
    model, alias = cards
    assert alias["owned_by"] == model["owned_by"] == "acme" and alias["object"] == model["object"] == "model"
    assert alias["metadata"] == model["metadata"] | {"alias_of": "echo"}
    assert client.models.retrieve("gpt-4o-mini").model_dump() == alias
    assert client.models.retrieve("echo-large").id == "echo-large"  # a name the wildcard matches
    reply = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    assert reply.model == "gpt-4o-mini"


def test_models_list_shows_only_allowed_models(env: GatewayEnv) -> None:
    from tests.gateway.conftest import LIMITED_KEY

    limited = openai.OpenAI(base_url=env.base_url, api_key=LIMITED_KEY, max_retries=0)
    assert [m.id for m in limited.models.list().data] == ["other"]
    with pytest.raises(openai.NotFoundError) as err:
        limited.models.retrieve("echo")
    assert err.value.code == "model_not_found"


def test_reservations_bound_what_a_request_can_generate(
    client: openai.OpenAI, upstream: FakeUpstream, env: GatewayEnv
) -> None:
    """A chat without max_tokens goes upstream capped at ``quotas.default_max_tokens`` (what admission
    reserved), and every generated sequence (n choices, several prompts) is reserved."""
    client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "a b c"}])
    assert upstream.last.json["max_completion_tokens"] == 1024 and "max_tokens" not in upstream.last.json
    client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "a b c"}], max_tokens=10, n=3)
    assert "max_completion_tokens" not in upstream.last.json  # the client's own limit is left alone
    client.completions.create(model="echo", prompt=["one", "two"], max_tokens=5, n=2, best_of=3)
    reserved = [s.ticket.reserved_tokens for s in env.admission.settled]
    prompts = [r - out for r, out in zip(reserved, (1024, 30, 30), strict=True)]
    assert all(0 < p < 100 for p in prompts), reserved  # prompt bound (bytes + template) + limit x sequences


@pytest.mark.parametrize("stream", [False, True])
def test_completions_without_a_limit_get_the_apis_default(client: openai.OpenAI, upstream: FakeUpstream,
                                                          env: GatewayEnv, stream: bool) -> None:
    """A text completion without max_tokens goes upstream with ``max_tokens: 16``, the API's own
    default (OpenAI's and vLLM's), which admission reserved: not the chat cap of 1024, which would
    lengthen every such answer; a limit the client set is left alone."""
    def complete(**limit: int) -> None:
        answer = client.completions.create(model="echo", prompt="a b c", stream=stream, **limit)  # type: ignore[call-overload]
        if stream:
            list(answer)

    complete()
    assert upstream.last.json["max_tokens"] == 16 and "max_completion_tokens" not in upstream.last.json
    reserved = env.admission.settled[-1].ticket.reserved_tokens
    assert 16 < reserved < 16 + 100  # the prompt's bound and the default
    complete(max_tokens=2)
    assert upstream.last.json["max_tokens"] == 2


def test_embeddings_pass_through_an_http_upstream(client: openai.OpenAI, upstream: FakeUpstream,
                                                  env: GatewayEnv) -> None:
    floats = client.embeddings.create(model="echo", input=["one two three", "four"], dimensions=4,
                                      encoding_format="float", user="u-1")
    sent = upstream.last
    assert sent.path.endswith("/embeddings") and sent.json["model"] == "upstream-echo"
    assert sent.json["dimensions"] == 4 and sent.json["encoding_format"] == "float"
    assert sent.json["input"] == ["one two three", "four"] and sent.json["user"] == "u-1"
    assert floats.model == "echo" and [len(d.embedding) for d in floats.data] == [4, 4]
    assert floats.usage.prompt_tokens == 4  # the upstream's count (words, for the echo upstream)
    decoded = client.embeddings.create(model="echo", input=["one two three", "four"], dimensions=4)  # base64
    assert upstream.last.json["encoding_format"] == "base64"
    for a, b in zip(decoded.data, floats.data):
        assert a.embedding == pytest.approx(b.embedding, abs=1e-6)
    records = env.usage.wait_for(2)
    assert all(r.endpoint == "embeddings" and r.exact and r.prompt_tokens == 4 for r in records)


def test_embeddings_answers_are_relayed_as_the_upstream_sent_them(client: openai.OpenAI, upstream: FakeUpstream,
                                                                  env: GatewayEnv) -> None:
    """Base64 vectors byte for byte, and fields the gateway does not model (vLLM's id and created,
    usage details), with only the model the gateway's; a usage of null is metered by estimate."""
    vector = "zczMPQAAgL4AAEBA"  # base64 of float32 0.1, -0.25, 3.0
    answer = (b'{"id":"embd-1","object":"list","created":5,"model":"upstream-echo","data":[{"object":"embedding",'
              b'"index":0,"embedding":"' + vector.encode() + b'"}],"usage":{"prompt_tokens":3,"total_tokens":3,'
              b'"completion_tokens":0}}')
    upstream.fail_next(Fault(status=200, body=answer, headers={"content-type": "application/json"}))
    raw = client.embeddings.with_raw_response.create(model="echo", input="hello", encoding_format="base64")
    assert raw.content == answer.replace(b'"model":"upstream-echo"', b'"model":"echo"')
    assert raw.parse().data[0].embedding == vector
    upstream.fail_next(Fault(status=200, body={"object": "list", "model": "m", "usage": None,
                                               "data": [{"object": "embedding", "index": 0, "embedding": [1.0]}]}))
    assert client.embeddings.create(model="echo", input="one two", encoding_format="float").data[0].embedding == [1.0]
    first, second = env.usage.wait_for(2)
    assert (first.prompt_tokens, first.exact, second.exact, second.status) == (3, True, False, 200)
    assert second.prompt_tokens > 0
