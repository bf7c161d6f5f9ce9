"""Span status per OpenTelemetry's HTTP conventions, read from the exported spans: the request
(SERVER) span is ERROR for a 5xx only, never for the client's 4xx nor for a client that went away
(that is recorded as an event); an attempt (CLIENT) span is ERROR for the upstream's 4xx and 5xx,
not for the gateway cancelling it because its client left."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from backends.factory import build_backend
from gateway.contracts import Principal
from gateway.routing.router import Router
from gateway.services import Services
from gateway.settings import parse_settings
from gateway.telemetry import Telemetry
from tests.support.doubles import RecordingSink, ScriptedAdmission, StaticKeys
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.servers import ServerThread

KEY = "sk-span-status"
MESSAGES = [{"role": "user", "content": "hello"}]


@dataclass
class Env:
    url: str
    usage: RecordingSink
    spans: InMemorySpanExporter

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=KEY, max_retries=0)

    def finished(self, name: str, count: int = 1) -> list[ReadableSpan]:
        """The finished spans named ``name``, once there are ``count`` (a stream's end at its settlement)."""
        deadline = time.monotonic() + 10
        while len(found := [s for s in self.spans.get_finished_spans() if s.name == name]) < count \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        return found


@pytest.fixture(scope="module")
def env(fake_upstream_server: FakeUpstream) -> Iterator[Env]:
    from gateway.app import create_app

    echo = {"provider": "openai", "model": "upstream-echo", "api_base": fake_upstream_server.url, "api_key": "sk-up",
            "name": "echo-dep"}
    settings = parse_settings({
        "models": [{"name": "echo", "deployments": [echo], "max_retries": 0, "circuit": {"failures": 1000}}],
        "telemetry": {"tracing": True},
    }, env={})  # fmt: skip
    spans, usage = InMemorySpanExporter(), RecordingSink()
    keys = StaticKeys({KEY: Principal(key_id="key_span", tenant_id="ten_span")})
    services = Services(authenticator=keys, admission=ScriptedAdmission(), usage=usage,
                        router=Router.from_settings(settings, build_backend))
    app = create_app(settings, services, telemetry=Telemetry.from_settings(settings, [spans]))
    with ServerThread(app) as server:
        yield Env(server.url, usage, spans)


def _pair(env: Env) -> tuple[ReadableSpan, ReadableSpan]:
    (root,), (attempt,) = env.finished("chat echo"), env.finished("upstream echo-dep")
    assert root.kind is SpanKind.SERVER and attempt.kind is SpanKind.CLIENT
    return root, attempt


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_4xx_is_the_clients_error_on_the_request_span_and_an_error_on_the_attempt(
        env: Env, upstream: FakeUpstream, stream: bool) -> None:
    env.spans.clear()
    upstream.fail_next(Fault(status=400))
    with pytest.raises(openai.BadRequestError):
        env.client().chat.completions.create(model="echo", messages=MESSAGES, stream=stream)
    root, attempt = _pair(env)
    assert root.attributes["http.response.status_code"] == 400
    assert root.status.status_code is StatusCode.UNSET
    assert attempt.status.status_code is StatusCode.ERROR and attempt.attributes["error.type"]


def test_an_upstream_5xx_is_an_error_on_both_spans(env: Env, upstream: FakeUpstream) -> None:
    env.spans.clear()
    upstream.fail_next(Fault(status=500))
    with pytest.raises(openai.APIStatusError) as failed:
        env.client().chat.completions.create(model="echo", messages=MESSAGES)
    assert failed.value.status_code >= 500
    root, attempt = _pair(env)
    assert root.status.status_code is StatusCode.ERROR and attempt.status.status_code is StatusCode.ERROR


def test_a_client_that_leaves_before_the_answer_leaves_both_spans_unset_with_an_event(
        env: Env, upstream: FakeUpstream) -> None:
    env.spans.clear()
    upstream.fail_next(Fault(delay=3))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(env.url + "/v1/chat/completions", json={"model": "echo", "messages": MESSAGES},
                   headers={"authorization": f"Bearer {KEY}"}, timeout=0.5)
    root, attempt = _pair(env)
    assert root.attributes["http.response.status_code"] == 499
    for span in (root, attempt):
        assert span.status.status_code is StatusCode.UNSET, span.name
        assert "client_disconnected" in [e.name for e in span.events], span.name


def test_a_client_that_leaves_a_stream_leaves_the_request_span_unset_with_an_event(
        env: Env, upstream: FakeUpstream) -> None:
    env.spans.clear()
    upstream.fail_next(Fault(hang_after_chunks=1))
    with env.client().chat.completions.create(model="echo", messages=MESSAGES, stream=True) as left:
        next(iter(left))  # the first chunk, then the client goes
    root, attempt = _pair(env)
    assert root.attributes["http.response.status_code"] == 200
    assert root.status.status_code is StatusCode.UNSET and attempt.status.status_code is StatusCode.UNSET
    assert "client_disconnected" in [e.name for e in root.events]


def test_a_stream_the_upstream_breaks_is_an_error_on_both_spans(env: Env, upstream: FakeUpstream) -> None:
    env.spans.clear()
    upstream.fail_next(Fault(error_after_chunks=2))
    with pytest.raises(openai.APIError):
        list(env.client().chat.completions.create(model="echo", messages=MESSAGES, stream=True))
    root, attempt = _pair(env)
    assert root.status.status_code is StatusCode.ERROR and attempt.status.status_code is StatusCode.ERROR
