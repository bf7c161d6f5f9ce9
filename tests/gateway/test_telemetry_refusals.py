"""Requests refused before they reach a model group (a bad key, a bad body, a model that does not
exist) are counted in ``switchyard_requests_total`` under a bounded model label, once, and never
name a span or a series by what the client sent."""

from __future__ import annotations

import logging
import time

import httpx
import openai
import pytest

from tests.gateway.test_telemetry import KEY, MESSAGES, THROTTLED, Env, _finished, delta, env  # noqa: F401  # env: the fixture
from tests.support.fake_upstream import FakeUpstream

CHAT = dict(model="unknown", endpoint="chat.completions")


def test_refused_requests_are_counted_once_under_a_bounded_model(env: Env, upstream: FakeUpstream) -> None:
    before = env.scrape()
    with pytest.raises(openai.AuthenticationError):
        env.client("sk-wrong").chat.completions.create(model="echo", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError):
        env.client().chat.completions.create(model="echo", messages=MESSAGES, temperature=-1)
    for model in ("bogus-1", 'bo"gus\\-2\n'):
        with pytest.raises(openai.NotFoundError):
            env.client().chat.completions.create(model=model, messages=MESSAGES)
    with pytest.raises(openai.NotFoundError):
        env.client().embeddings.create(model="bogus-3", input="hi")
    env.client().chat.completions.create(model="echo", messages=MESSAGES, max_tokens=2)  # metered: not "unknown"
    list(env.client().chat.completions.create(model="echo", messages=MESSAGES, max_tokens=2, stream=True))
    with pytest.raises(openai.RateLimitError):  # refused by quotas: counted under its model, as before
        env.client(THROTTLED).chat.completions.create(model="echo", messages=MESSAGES)
    assert httpx.get(f"{env.url}/v1/models", headers={"authorization": f"Bearer {KEY}"}).status_code == 200
    assert len(_finished(env, "chat echo", 2)) >= 2  # the stream is counted by the time its span ends
    after = env.scrape()

    assert delta(after, before, "switchyard_requests_total", **CHAT, status="401") == 1
    assert delta(after, before, "switchyard_requests_total", **CHAT, status="400") == 1
    assert delta(after, before, "switchyard_requests_total", **CHAT, status="404") == 2
    assert delta(after, before, "switchyard_requests_total", model="unknown", endpoint="embeddings", status="404") == 1
    assert delta(after, before, "switchyard_requests_total", **CHAT, status="200") == 0
    assert delta(after, before, "switchyard_requests_total", **CHAT, status="429") == 0
    ok = dict(model="echo", endpoint="chat.completions")
    assert delta(after, before, "switchyard_requests_total", **ok, status="200") == 2
    assert delta(after, before, "switchyard_requests_total", **ok, status="429") == 1
    assert not any("gus" in value for _, labels in after for _, value in labels)


def test_a_model_that_does_not_exist_never_names_a_span(env: Env) -> None:
    env.spans.clear()
    for model in ("bogus-1", "bogus-2"):
        with pytest.raises(openai.NotFoundError):
            env.client().chat.completions.create(model=model, messages=MESSAGES)
    spans = _finished(env, "POST /v1/chat/completions", 2)
    assert [s.attributes["gen_ai.request.model"] for s in spans] == ["bogus-1", "bogus-2"]  # an attribute, not a name
    assert not any("bogus" in s.name for s in env.spans.get_finished_spans())


def test_the_routes_without_v1_have_a_request_id_a_span_an_access_line_and_count(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    """``/chat/completions`` (vLLM's path, for clients whose base URL has no ``/v1``) is observed as
    ``/v1/chat/completions`` is: it had no span and no access line, and its errors no request id."""
    env.spans.clear()
    before = env.scrape()
    sdk = openai.OpenAI(base_url=env.url, api_key=KEY, max_retries=0)
    with caplog.at_level(logging.INFO, logger="switchyard.access"):
        raw = sdk.chat.completions.with_raw_response.create(model="echo", messages=MESSAGES, max_tokens=2)
        refused = httpx.post(env.url + "/chat/completions", json={"model": "echo", "messages": MESSAGES},
                             headers={"authorization": "Bearer sk-wrong"})
        (root,) = _finished(env, "chat echo")
        deadline = time.monotonic() + 5
        while len(lines := [r for r in caplog.records if r.name == "switchyard.access"]) < 2 \
                and time.monotonic() < deadline:
            time.sleep(0.01)
    after = env.scrape()

    assert root.attributes["switchyard.request_id"] == raw.headers["x-request-id"]
    assert refused.status_code == 401 and refused.headers["x-request-id"]
    assert [r.getMessage() for r in lines] == ["POST /chat/completions 200", "POST /chat/completions 401"]
    assert delta(after, before, "switchyard_requests_total", **CHAT, status="401") == 1
