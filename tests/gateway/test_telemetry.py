"""GET /metrics (parsed with prometheus_client) moves by the right amounts for a known request mix,
an in-memory span exporter sees the expected span tree, and access logs are JSON without secrets."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client.parser import text_string_to_metric_families

from backends.factory import build_backend
from engine.tiny_model import build_tiny_model
from gateway.contracts import Principal, UsageRecord
from gateway.routing.router import Router
from gateway.services import Services
from gateway.settings import parse_settings
from gateway.telemetry import Telemetry
from gateway.telemetry.logs import JsonFormatter
from gateway.telemetry.metrics import GatewayMetrics
from tests.support.doubles import RecordingSink, ScriptedAdmission, StaticKeys
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.scripted_gateway import scripted_gateway
from tests.support.servers import ServerThread

KEY, THROTTLED = "sk-telemetry-tenant", "sk-telemetry-throttled"
TENANT = "ten_secret_tenant_id"
MESSAGES = [{"role": "user", "content": "a private prompt about trains"}]


@dataclass
class Env:
    url: str
    usage: RecordingSink
    spans: InMemorySpanExporter

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0)

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = httpx.get(self.url + "/metrics").text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.fixture(scope="module")
def env(fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    from gateway.app import create_app

    folder = build_tiny_model(tmp_path_factory.mktemp("tel") / "tiny", seed=3, max_position_embeddings=1024)
    echo = {"provider": "openai", "model": "upstream-echo", "api_base": fake_upstream_server.url, "api_key": "sk-up",
            "name": "echo-dep"}
    tiny = {"provider": "local", "model": str(folder), "name": "tiny-dep",
            "options": {"num_kv_blocks": 64, "block_size": 16, "enable_prefix_caching": True}}
    settings = parse_settings({
        "models": [{"name": "echo", "deployments": [echo], "max_retries": 0, "circuit": {"failures": 1000}},
                   {"name": "tiny", "deployments": [tiny], "max_retries": 0},
                   {"name": "held", "deployments": [echo | {"name": "held-dep"}], "max_retries": 0}],
        "telemetry": {"tracing": True},
    }, env={})  # fmt: skip
    spans = InMemorySpanExporter()
    usage = RecordingSink()
    keys = StaticKeys({KEY: Principal(key_id="key_tel", tenant_id=TENANT),
                       THROTTLED: Principal(key_id="throttled", tenant_id=TENANT)})
    services = Services(authenticator=keys, admission=ScriptedAdmission(throttled={"throttled": 3.0}), usage=usage,
                        router=Router.from_settings(settings, build_backend))
    app = create_app(settings, services, telemetry=Telemetry.from_settings(settings, [spans]))
    with ServerThread(app) as server:
        yield Env(server.url, usage, spans)


def delta(after: dict, before: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_counters_move_by_the_request_mix(env: Env, upstream: FakeUpstream) -> None:
    before = env.scrape()
    env.usage.records.clear()
    client = env.client()
    for _ in range(3):
        client.chat.completions.create(model="echo", messages=MESSAGES, max_tokens=5)
    list(client.chat.completions.create(model="echo", messages=MESSAGES, max_tokens=5, stream=True))
    with pytest.raises(openai.RateLimitError):
        env.client(THROTTLED).chat.completions.create(model="echo", messages=MESSAGES)
    upstream.fail_next(Fault(status=500))
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(model="echo", messages=MESSAGES)
    for _ in range(2):
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0)
    records = env.usage.wait_for(8)
    after = env.scrape()

    ok = dict(model="echo", endpoint="chat.completions", status="200")
    assert delta(after, before, "switchyard_requests_total", **ok) == 4
    assert delta(after, before, "switchyard_requests_total", **(ok | {"status": "429"})) == 1
    assert delta(after, before, "switchyard_requests_total", **(ok | {"status": str(failed.value.status_code)})) == 1
    assert delta(after, before, "switchyard_requests_total", **(ok | {"model": "tiny"})) == 2
    assert delta(after, before, "switchyard_quota_rejections_total", model="echo") == 1
    assert delta(after, before, "switchyard_upstream_errors_total", deployment="echo-dep", kind="unavailable") == 1
    assert delta(after, before, "switchyard_request_latency_seconds_count", model="echo",
                 endpoint="chat.completions") == 5  # the 4 answered and the failed attempt
    for kind, field in (("prompt", "prompt_tokens"), ("completion", "completion_tokens")):
        for model in ("echo", "tiny"):
            want = sum(getattr(r, field) for r in records if r.model == model)
            assert want > 0 and delta(after, before, "switchyard_tokens_total", model=model, kind=kind) == want
    tiny_prompt = sum(r.prompt_tokens for r in records if r.model == "tiny")
    assert delta(after, before, "vllm:prompt_tokens_total", model_name="tiny-dep") == tiny_prompt
    assert delta(after, before, "vllm:e2e_request_latency_seconds_count", model_name="tiny-dep") == 2
    assert after[("vllm:num_requests_running", (("model_name", "tiny-dep"),))] == 0
    assert ("vllm:kv_cache_usage_perc", (("model_name", "tiny-dep"),)) in after
    assert ("vllm:prefix_cache_queries_total", (("model_name", "tiny-dep"),)) in after
    assert after[("switchyard_circuit_state", (("deployment", "echo-dep"), ("state", "closed")))] == 1
    assert all(TENANT not in str(labels) and "key_tel" not in str(labels) for _, labels in after)


def test_the_scrape_names_prometheus_text_format_and_its_charset_once(env: Env) -> None:
    """Prometheus 3 fails a scrape whose Content-Type does not parse (a charset given twice)."""
    assert httpx.get(env.url + "/metrics").headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"


def test_upstream_429_is_not_a_quota_rejection(env: Env, upstream: FakeUpstream) -> None:
    before = env.scrape()
    upstream.fail_next(Fault(status=429, headers={"retry-after": "0"}))
    with pytest.raises(openai.RateLimitError):
        env.client().chat.completions.create(model="echo", messages=MESSAGES)
    with pytest.raises(openai.RateLimitError):
        env.client(THROTTLED).chat.completions.create(model="echo", messages=MESSAGES)
    after = env.scrape()

    assert delta(after, before, "switchyard_requests_total", model="echo", endpoint="chat.completions",
                 status="429") == 2
    assert delta(after, before, "switchyard_quota_rejections_total", model="echo") == 1  # the gateway's own refusal
    assert delta(after, before, "switchyard_upstream_errors_total", deployment="echo-dep", kind="rate_limited") == 1


def test_a_held_off_upstream_is_not_a_quota_rejection(env: Env, upstream: FakeUpstream) -> None:
    """The second request finds the deployment held off by the first's long Retry-After: refused
    before any upstream is tried, but for the upstream's limit, not for the gateway's quotas."""
    before = env.scrape()
    upstream.fail_next(Fault(status=429, headers={"retry-after": "30"}))
    for _ in range(2):
        with pytest.raises(openai.RateLimitError):
            env.client().chat.completions.create(model="held", messages=MESSAGES)
    after = env.scrape()

    assert delta(after, before, "switchyard_requests_total", model="held", endpoint="chat.completions",
                 status="429") == 2
    assert delta(after, before, "switchyard_quota_rejections_total", model="held") == 0
    assert delta(after, before, "switchyard_upstream_errors_total", deployment="held-dep", kind="rate_limited") == 1


def test_span_tree_of_an_engine_request(env: Env) -> None:
    env.spans.clear()
    raw = env.client().chat.completions.with_raw_response.create(model="tiny", messages=MESSAGES, max_tokens=3)
    request_id = raw.headers["x-request-id"]
    spans = {s.name: s for s in env.spans.get_finished_spans()}
    root = spans["chat tiny"]
    assert root.parent is None and root.attributes["gen_ai.request.model"] == "tiny"
    assert root.attributes["gen_ai.operation.name"] == "chat"
    assert root.attributes["switchyard.request_id"] == request_id
    assert root.attributes["gen_ai.usage.output_tokens"] == raw.parse().usage.completion_tokens
    attempt = spans["upstream tiny-dep"]
    for name in ("auth", "admission", "upstream tiny-dep"):
        assert spans[name].parent.span_id == root.context.span_id, name
        assert spans[name].context.trace_id == root.context.trace_id
    assert attempt.attributes["gen_ai.provider.name"] == "local"
    assert root.attributes["gen_ai.response.model"] == attempt.attributes["gen_ai.response.model"]
    phases = [spans[n] for n in ("engine.queue", "engine.prefill", "engine.decode")]
    assert all(p.parent.span_id == attempt.context.span_id for p in phases)
    assert phases[0].end_time <= phases[1].end_time <= phases[2].end_time


def test_failed_attempt_span_and_streamed_request(env: Env, upstream: FakeUpstream) -> None:
    env.spans.clear()
    upstream.fail_next(Fault(status=503))
    with pytest.raises(openai.APIStatusError):
        env.client().chat.completions.create(model="echo", messages=MESSAGES)
    list(env.client().chat.completions.create(model="echo", messages=MESSAGES, stream=True,
                                              stream_options={"include_usage": True}))
    # The streamed request's spans end at its settlement, just after the last byte reached the client.
    deadline = time.monotonic() + 10
    while len([s for s in env.spans.get_finished_spans() if s.name == "chat echo"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    finished = env.spans.get_finished_spans()
    attempts = [s for s in finished if s.name == "upstream echo-dep"]
    assert len(attempts) == 2 and attempts[0].attributes["error.type"]
    roots = [s for s in finished if s.name == "chat echo"]
    assert len(roots) == 2 and roots[1].attributes["gen_ai.request.stream"] is True
    assert roots[1].attributes["gen_ai.usage.output_tokens"] > 0
    # the model the upstream said answered, not the public name the client was shown
    assert roots[1].attributes["gen_ai.response.model"] == attempts[1].attributes["gen_ai.response.model"] \
        == "upstream-echo"
    assert "gen_ai.response.model" not in attempts[0].attributes  # the failed attempt had no answer


def _finished(env: Env, name: str, count: int = 1) -> list[ReadableSpan]:
    """The finished spans named ``name``, once there are ``count`` of them (a stream's end at its settlement)."""
    deadline = time.monotonic() + 10
    while len(found := [s for s in env.spans.get_finished_spans() if s.name == name]) < count \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    return found


def test_a_stream_the_upstream_breaks_is_an_upstream_error_in_metrics_and_on_its_attempt_span(
        env: Env, upstream: FakeUpstream) -> None:
    before = env.scrape()
    env.spans.clear()
    for fault in (Fault(error_after_chunks=2), Fault(end_after_chunks=2)):
        upstream.fail_next(fault)
        with pytest.raises(openai.APIError):
            list(env.client().chat.completions.create(model="echo", messages=MESSAGES, stream=True))
    assert len(_finished(env, "chat echo", 2)) == 2
    after = env.scrape()
    for kind in ("upstream_error", "unavailable"):  # the failure, and the body that ended before it finished
        assert delta(after, before, "switchyard_upstream_errors_total", deployment="echo-dep", kind=kind) == 1
    attempts = [s for s in env.spans.get_finished_spans() if s.name == "upstream echo-dep"]
    assert [s.attributes.get("error.type") for s in attempts] == ["upstream_error", "unavailable"]
    assert all(s.status.status_code is StatusCode.ERROR for s in attempts)


def test_streams_are_counted_by_how_they_ended(env: Env, upstream: FakeUpstream) -> None:
    """Each is a 200 in ``switchyard_requests_total``: how it ended is ``switchyard_streams_total``'s outcome."""
    before = env.scrape()
    env.usage.records.clear()
    client = env.client()
    list(client.chat.completions.create(model="echo", messages=MESSAGES, max_tokens=5, stream=True))
    upstream.fail_next(Fault(error_after_chunks=2))
    with pytest.raises(openai.APIError):
        list(client.chat.completions.create(model="echo", messages=MESSAGES, stream=True))
    upstream.fail_next(Fault(hang_after_chunks=1))
    with client.chat.completions.create(model="echo", messages=MESSAGES, stream=True) as left:
        next(iter(left))  # the first chunk, then the client goes
    env.usage.wait_for(3)
    after = env.scrape()
    labels = dict(model="echo", endpoint="chat.completions")
    for outcome in ("completed", "failed", "client_disconnected"):
        assert delta(after, before, "switchyard_streams_total", **labels, outcome=outcome) == 1, outcome
    assert delta(after, before, "switchyard_requests_total", **labels, status="200") == 3


def test_a_stream_whose_client_left_before_it_began_is_a_499_not_a_stream(env: Env, upstream: FakeUpstream) -> None:
    """``switchyard_streams_total`` counts streams begun (each a 200): one whose client left before the
    answer began is a 499 in ``switchyard_requests_total`` only (it was counted as a stream too)."""
    before = env.scrape()
    env.usage.records.clear()
    upstream.fail_next(Fault(delay=2))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(env.url + "/v1/chat/completions", json={"model": "echo", "messages": MESSAGES, "stream": True},
                   headers={"authorization": f"Bearer {KEY}"}, timeout=0.5)
    env.usage.wait_for(1)
    after = env.scrape()
    labels = dict(model="echo", endpoint="chat.completions")
    assert delta(after, before, "switchyard_requests_total", **labels, status="499") == 1
    assert delta(after, before, "switchyard_streams_total", **labels, outcome="client_disconnected") == 0


def test_a_client_that_leaves_before_the_answer_is_499_not_a_server_error(env: Env, upstream: FakeUpstream,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    env.spans.clear()
    upstream.fail_next(Fault(delay=3))
    with caplog.at_level(logging.INFO, logger="switchyard.access"), pytest.raises(httpx.ReadTimeout):
        httpx.post(env.url + "/v1/chat/completions", json={"model": "echo", "messages": MESSAGES},
                   headers={"authorization": f"Bearer {KEY}"}, timeout=0.5)
    (root,) = _finished(env, "chat echo")
    assert root.attributes["error.type"] == "client_disconnected"
    assert root.attributes["http.response.status_code"] == 499  # as its usage row says; it was a 500
    # (an earlier test's stream may log its own line, a 200, just after its client read the end; the
    # line is written just after the span ends, in the server's thread: wait for it)
    def access() -> list[str]:
        lines = [r.getMessage() for r in caplog.records if r.name == "switchyard.access"]
        return [line for line in lines if not line.endswith(" 200")]

    deadline = time.monotonic() + 5
    while not access() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert access() == ["POST /v1/chat/completions 499"]


def test_a_clients_traceparent_continues_its_trace_and_goes_upstream_from_the_attempt(
        env: Env, upstream: FakeUpstream) -> None:
    """W3C trace context: the request span is the child of the client's span, in the client's trace,
    and the HTTP upstream is sent a ``traceparent`` naming the attempt's span as its parent, whole
    and streamed; without one from the client, the upstream still gets the gateway's trace."""
    trace_id, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    client = openai.OpenAI(base_url=env.url + "/v1", api_key=KEY, max_retries=0,
                           default_headers={"traceparent": f"00-{trace_id}-{client_span}-01"})
    for stream in (False, True):
        env.spans.clear()
        if stream:
            list(client.chat.completions.create(model="echo", messages=MESSAGES, stream=True))
        else:
            client.chat.completions.create(model="echo", messages=MESSAGES)
        (root,), (attempt,) = _finished(env, "chat echo"), _finished(env, "upstream echo-dep")
        assert format(root.context.trace_id, "032x") == trace_id and root.parent is not None
        assert format(root.parent.span_id, "016x") == client_span and root.parent.is_remote
        assert attempt.context.trace_id == root.context.trace_id and attempt.parent.span_id == root.context.span_id
        sent = upstream.last.headers["traceparent"]
        assert sent == f"00-{trace_id}-{attempt.context.span_id:016x}-01", stream
    env.spans.clear()
    env.client().chat.completions.create(model="echo", messages=MESSAGES)
    (attempt,) = _finished(env, "upstream echo-dep")
    assert upstream.last.headers["traceparent"].split("-")[1:3] == [f"{attempt.context.trace_id:032x}",
                                                                   f"{attempt.context.span_id:016x}"]


def test_tokenize_answers_have_a_request_id_and_one_trace(env: Env) -> None:
    """``/tokenize`` and ``/detokenize`` (vLLM's paths, outside ``/v1``) are API answers like any other:
    an ``x-request-id`` and a request span with its ``auth`` child (it was a root span of its own)."""
    env.spans.clear()
    auth = {"authorization": f"Bearer {KEY}"}
    tokenized = httpx.post(env.url + "/tokenize", json={"model": "tiny", "prompt": "hello"}, headers=auth)
    detokenized = httpx.post(env.url + "/detokenize", json={"model": "tiny", "tokens": tokenized.json()["tokens"]},
                             headers=auth)
    assert tokenized.status_code == detokenized.status_code == 200
    assert tokenized.headers["x-request-id"] and detokenized.headers["x-request-id"]
    roots = {s.name: s for s in _finished(env, "POST /tokenize") + _finished(env, "POST /detokenize")}
    auths = _finished(env, "auth", 2)
    assert len(roots) == 2 and len(auths) == 2
    assert {a.parent.span_id for a in auths if a.parent} == {r.context.span_id for r in roots.values()}


def test_a_request_span_is_named_by_its_route_not_by_a_path_a_client_made_up(env: Env) -> None:
    env.spans.clear()
    for model in ("bogus-1", "bogus-2"):
        assert httpx.get(f"{env.url}/v1/models/{model}", headers={"authorization": f"Bearer {KEY}"}).status_code == 404
    spans = _finished(env, "GET /v1/models/{model_id}")
    assert len(spans) == 2 and all(s.attributes["http.route"] == "/v1/models/{model_id}" for s in spans)
    assert {s.attributes["url.path"] for s in spans} == {"/v1/models/bogus-1", "/v1/models/bogus-2"}
    assert not any("bogus" in s.name for s in env.spans.get_finished_spans())


def test_access_log_is_json_with_request_fields_and_no_secrets(env: Env) -> None:
    lines: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(JsonFormatter().format(record))

    handler = Capture()
    access = logging.getLogger("switchyard.access")
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    try:
        raw = env.client().chat.completions.with_raw_response.create(model="echo", messages=MESSAGES)
        httpx.post(env.url + "/v1/chat/completions", json={}, headers={"authorization": "Bearer sk-wrong"})
    finally:
        access.removeHandler(handler)
    entries = [json.loads(line) for line in lines]
    ok = next(e for e in entries if e["request_id"] == raw.headers["x-request-id"])
    assert ok["status"] == 200 and ok["tenant_id"] == TENANT and ok["model"] == "echo" and ok["latency_ms"] > 0
    assert ok["prompt_tokens"] > 0 and ok["deployment"] == "echo-dep"
    assert any(e["status"] == 401 and e["tenant_id"] is None for e in entries)
    text = "\n".join(lines)
    assert KEY not in text and "sk-wrong" not in text and "private prompt" not in text


def test_the_providers_request_id_is_on_the_access_line_and_the_attempt_span(env: Env, upstream: FakeUpstream,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Each attempt's span carries the id of its answer, a failed one's too; the access line the
    id of the answer (or of the error answer of the attempt that failed last)."""
    env.spans.clear()
    upstream.fail_next(Fault(status=400, headers={"x-request-id": "req_up_refused"}))
    with caplog.at_level(logging.INFO, logger="switchyard.access"):
        with pytest.raises(openai.BadRequestError):
            env.client().chat.completions.create(model="echo", messages=MESSAGES)
        upstream.answer_headers = {"x-request-id": "req_up_answer"}
        list(env.client().chat.completions.create(model="echo", messages=MESSAGES, stream=True))
        assert len(_finished(env, "chat echo", 2)) == 2
    attempts = [s for s in env.spans.get_finished_spans() if s.name == "upstream echo-dep"]
    assert [s.attributes.get("switchyard.upstream_request_id") for s in attempts] == ["req_up_refused", "req_up_answer"]
    lines = [r.fields for r in caplog.records if r.name == "switchyard.access"]  # type: ignore[attr-defined]
    assert [f.get("upstream_request_id") for f in lines] == ["req_up_refused", "req_up_answer"]


def test_tracing_is_off_by_default_and_otlp_export_is_configurable(fake_upstream_server: FakeUpstream) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    assert not Telemetry.from_settings(parse_settings({}, env={})).tracing.enabled
    received: list[tuple[str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append((self.path, self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    collector = HTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    echo = {"provider": "openai", "model": "upstream-echo", "api_base": fake_upstream_server.url, "api_key": "sk-up"}
    settings = parse_settings({"models": [{"name": "echo", "deployments": [echo]}], "telemetry": {
        "tracing": True, "otlp_endpoint": f"http://127.0.0.1:{collector.server_port}/v1/traces",
        "service_name": "sy-test"}}, env={})  # fmt: skip
    try:
        with scripted_gateway(settings, {KEY: Principal(key_id="k", tenant_id="t")}) as server:
            openai.OpenAI(base_url=server.url + "/v1", api_key=KEY).chat.completions.create(model="echo",
                                                                                            messages=MESSAGES)
        # shutting the app down flushed the batch exporter
    finally:
        collector.shutdown()
    assert received and all(path == "/v1/traces" for path, _ in received)
    names = set()
    for _, body in received:
        export = ExportTraceServiceRequest.FromString(body)
        for resource in export.resource_spans:
            attributes = resource.resource.attributes
            assert any(a.key == "service.name" and a.value.string_value == "sy-test" for a in attributes)
            names |= {s.name for scope in resource.scope_spans for s in scope.spans}
    assert {"chat echo", "auth", "admission", "upstream openai:upstream-echo"} <= names


def test_tracing_with_nowhere_to_send_spans_makes_none() -> None:
    """``tracing: true`` without an OTLP endpoint (nor an exporter given in code) has no one to read
    its spans: none are made (each request built its spans, about 0.1 ms, and dropped them)."""
    settings = parse_settings({"telemetry": {"tracing": True}}, env={})
    assert not Telemetry.from_settings(settings).tracing.enabled
    assert Telemetry.from_settings(settings, [InMemorySpanExporter()]).tracing.enabled


def test_latency_buckets_sums_and_series_as_prometheus_counts_them() -> None:
    """A value on a bucket's bound is in that bucket ("le"); buckets are cumulative; a series
    appears once used, with its ``_created`` sample."""
    metrics = GatewayMetrics()
    for latency_ms in (10.0, 10.5, 250.0, 400_000.0):  # 0.01 s (a bound), just above it, 0.25 s, past every bound
        metrics.observe(UsageRecord(request_id="r", key_id="k", tenant_id=None, model="m", deployment="d",
                                    provider="openai", endpoint="chat.completions", started_at=0.0, status=200,
                                    prompt_tokens=3, latency_ms=latency_ms))
    samples = {(s.name, s.labels.get("le")): s.value
               for fam in text_string_to_metric_families(metrics.render().decode()) for s in fam.samples
               if fam.name == "switchyard_request_latency_seconds"}
    assert samples[("switchyard_request_latency_seconds_bucket", "0.01")] == 1
    assert samples[("switchyard_request_latency_seconds_bucket", "0.025")] == 2
    assert samples[("switchyard_request_latency_seconds_bucket", "0.25")] == 3
    assert samples[("switchyard_request_latency_seconds_bucket", "300.0")] == 3
    assert samples[("switchyard_request_latency_seconds_bucket", "+Inf")] == 4
    assert samples[("switchyard_request_latency_seconds_count", None)] == 4
    assert samples[("switchyard_request_latency_seconds_sum", None)] == pytest.approx(400.2705)
    text = metrics.render()
    assert b'switchyard_request_latency_seconds_created{endpoint="chat.completions",model="m"}' in text
    assert b"switchyard_time_to_first_token_seconds_count" not in text  # nothing counted yet


def test_a_refusal_that_names_no_model_counts_under_unknown() -> None:
    """A refused poll of a stored response names no model (its usage row's model is ""): its series
    is ``model="unknown"``, as every request refused before it reached a model group, not an empty label."""
    metrics = GatewayMetrics()
    metrics.observe(UsageRecord(request_id="r", key_id="k", tenant_id=None, model="", deployment=None,
                                provider=None, endpoint="responses", started_at=0.0, status=429,
                                error_type="rate_limit_exceeded"))
    text = metrics.render()
    assert b'switchyard_quota_rejections_total{model="unknown"} 1.0' in text
    assert b'switchyard_requests_total{endpoint="responses",model="unknown",status="429"} 1.0' in text
    assert b'model=""' not in text
