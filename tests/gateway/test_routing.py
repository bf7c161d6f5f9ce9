"""Routing across real loopback upstreams with programmable faults: strategies, retries,
fallbacks, circuit breaking, the deployments admin view and config reload."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from backends.factory import build_backend
from gateway.app import create_app
from gateway.contracts import Principal
from gateway.routing.router import Router
from gateway.services import Services
from gateway.settings import load_settings
from tests.conftest import ADMIN_KEY
from tests.support.doubles import RecordingSink, ScriptedAdmission, StaticKeys
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.servers import ServerThread

MESSAGES = [{"role": "user", "content": "route me"}]
NO_BREAKER = {"failures": 1_000_000}


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, FakeUpstream]]:
    servers = {name: FakeUpstream().start() for name in "ABC"}
    yield servers
    for server in servers.values():
        server.stop()


def _dep(name: str, url: str, **extra: object) -> dict:
    return {"name": name, "provider": "openai", "model": "m", "api_base": url,
            "timeouts": {"connect": 1, "first_byte": 0.5, "total": 3}} | extra


def _config(u: dict[str, FakeUpstream]) -> dict:
    a, b, c = (u[n].url for n in "ABC")
    fast = {"max_retries": 2, "retry_backoff": 0.01, "circuit": NO_BREAKER}
    quick = {"connect": 1, "first_byte": 0.5, "total": 1}  # a non-streaming answer is bounded by total
    return {
        "auth": {"admin_key": ADMIN_KEY},
        "models": [
            {"name": "split", "deployments": [_dep("s-a", a, weight=3), _dep("s-b", b, weight=1)], "max_retries": 0,
             "circuit": NO_BREAKER},
            {"name": "busy", "strategy": "least_busy", "deployments": [_dep("b-a", a), _dep("b-b", b)],
             "max_retries": 0, "circuit": NO_BREAKER},
            {"name": "failover", "strategy": "priority", "deployments": [_dep("f-a", a, timeouts=quick),
                                                                         _dep("f-b", b, timeouts=quick)], **fast},
            {"name": "single", "deployments": [_dep("one-a", a)], **fast},
            {"name": "refused", "strategy": "priority",
             "deployments": [_dep("r-dead", "http://127.0.0.1:9/v1"), _dep("r-b", b)], **fast},
            {"name": "primary", "deployments": [_dep("p-a", a)], "max_retries": 0, "circuit": NO_BREAKER,
             "fallbacks": ["backup"], "context_window_fallbacks": ["long"]},
            {"name": "backup", "deployments": [_dep("bk-b", b)], "max_retries": 0, "circuit": NO_BREAKER},
            {"name": "long", "deployments": [_dep("l-c", c)], "max_retries": 0, "circuit": NO_BREAKER},
            {"name": "breaker", "strategy": "priority", "deployments": [_dep("br-a", a), _dep("br-b", b)],
             "max_retries": 1, "retry_backoff": 0.01, "circuit": {"failures": 2, "window": 60, "cooldown": 0.5}},
            {"name": "capped", "strategy": "priority", "max_retries": 0, "circuit": NO_BREAKER,
             "deployments": [_dep("c-a", a, max_concurrency=1), _dep("c-b", b)]},
            {"name": "tpm", "strategy": "priority", "max_retries": 0, "circuit": NO_BREAKER,
             "deployments": [_dep("t-a", a, tokens_per_minute=5), _dep("t-b", b)]},
            {"name": "windowed", "max_retries": 0, "circuit": NO_BREAKER, "context_window_fallbacks": ["long"],
             "deployments": [_dep("w-a", a, context_window=40)]},
            {"name": "narrow", "max_retries": 0, "circuit": NO_BREAKER,
             "deployments": [_dep("n-a", a, context_window=40)]},
            {"name": "lat", "strategy": "lowest_latency", "deployments": [_dep("lt-a", a), _dep("lt-b", b)],
             "max_retries": 0, "circuit": NO_BREAKER},
            {"name": "held", "strategy": "priority", "deployments": [_dep("h-a", a), _dep("h-b", b)],
             "max_retries": 1, "retry_backoff": 0.01, "circuit": NO_BREAKER},
            {"name": "relearn", "strategy": "priority", "deployments": [_dep("rl-a", a), _dep("rl-b", b)],
             "max_retries": 1, "retry_backoff": 0.01, "circuit": {"failures": 1, "window": 60, "cooldown": 60}},
        ],
    }


@pytest.fixture(scope="module")
def gateway(
    upstreams: dict[str, FakeUpstream], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerThread, Path]]:
    path = tmp_path_factory.mktemp("routing") / "config.yaml"
    path.write_text(yaml.safe_dump(_config(upstreams)))
    settings = load_settings(path, env={})
    keys = StaticKeys(
        {
            ADMIN_KEY: Principal(key_id="admin", tenant_id=None, is_admin=True),
            "sk-user": Principal(key_id="user", tenant_id="t"),
        }
    )
    services = Services(
        authenticator=keys,
        admission=ScriptedAdmission(),
        usage=RecordingSink(),
        router=Router.from_settings(settings, build_backend),
    )
    with ServerThread(create_app(settings, services, config_path=path)) as server:
        yield server, path


@pytest.fixture
def client(gateway: tuple[ServerThread, Path], upstreams: dict[str, FakeUpstream]) -> openai.OpenAI:
    for upstream in upstreams.values():
        upstream.reset()
    return openai.OpenAI(base_url=gateway[0].url + "/v1", api_key=ADMIN_KEY, max_retries=0)


def _count(upstream: FakeUpstream) -> int:
    return len(upstream.received)


def test_weighted_split_within_tolerance(client: openai.OpenAI, upstreams: dict[str, FakeUpstream]) -> None:
    for _ in range(200):
        client.chat.completions.create(model="split", messages=MESSAGES, max_tokens=1)
    share = _count(upstreams["A"]) / 200
    assert _count(upstreams["A"]) + _count(upstreams["B"]) == 200
    assert 0.62 <= share <= 0.88  # 0.75 expected; ~5 standard deviations of slack


def test_least_busy_prefers_the_idle_deployment(client: openai.OpenAI, upstreams: dict[str, FakeUpstream]) -> None:
    for u in upstreams.values():
        u.fail_next(Fault(hang_after_chunks=1))  # whichever gets the stream keeps it open
    stream = client.chat.completions.create(model="busy", messages=MESSAGES, stream=True)
    next(iter(stream))
    busy = next(u for u in (upstreams["A"], upstreams["B"]) if u.streams)
    idle = upstreams["B"] if busy is upstreams["A"] else upstreams["A"]
    for u in upstreams.values():
        u.faults.clear()
    for _ in range(10):
        client.chat.completions.create(model="busy", messages=MESSAGES)
    assert _count(idle) == 10 and _count(busy) == 1
    stream.close()


@pytest.mark.parametrize(
    "fault",
    [Fault(status=500), Fault(status=429), Fault(status=503), Fault(delay=1.5)],
    ids=["500", "429", "503", "hang"],
)
def test_retry_moves_to_the_healthy_deployment(
    client: openai.OpenAI, upstreams: dict[str, FakeUpstream], fault: Fault
) -> None:
    upstreams["A"].fail_next(fault)
    reply = client.chat.completions.create(model="failover", messages=MESSAGES)
    assert reply.choices[0].message.content == "route me"
    assert (_count(upstreams["A"]), _count(upstreams["B"])) == (1, 1)


def test_retry_on_the_same_deployment_with_backoff(client: openai.OpenAI, upstreams: dict[str, FakeUpstream]) -> None:
    upstreams["A"].fail_next(Fault(status=502), Fault(status=429, headers={"retry-after": "0"}))
    assert client.chat.completions.create(model="single", messages=MESSAGES).choices
    assert _count(upstreams["A"]) == 3


def test_retries_are_bounded(client: openai.OpenAI, upstreams: dict[str, FakeUpstream]) -> None:
    upstreams["A"].fail_next(*[Fault(status=500)] * 3)
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(model="single", messages=MESSAGES)
    assert err.value.status_code == 503 and _count(upstreams["A"]) == 3


def test_connection_refused_fails_over(client: openai.OpenAI, upstreams: dict[str, FakeUpstream]) -> None:
    assert client.chat.completions.create(model="refused", messages=MESSAGES).choices
    assert _count(upstreams["B"]) == 1


@pytest.mark.parametrize(
    ("faults", "error", "status"),
    [
        ([Fault(status=500)] * 3, openai.InternalServerError, 503),
        ([Fault(status=429, headers={"retry-after": "0"})] * 3, openai.RateLimitError, 429),
        ([Fault(delay=1.5)] * 3, openai.APIStatusError, 504),
    ],
)
def test_no_healthy_deployment_gives_the_right_error(
    client: openai.OpenAI, upstreams: dict[str, FakeUpstream], faults: list[Fault], error: type, status: int
) -> None:
    upstreams["A"].fail_next(*faults)
    upstreams["B"].fail_next(*faults)
    with pytest.raises(error) as err:
        client.chat.completions.create(model="failover", messages=MESSAGES)
    assert err.value.status_code == status  # type: ignore[attr-defined]
    assert _count(upstreams["A"]) + _count(upstreams["B"]) == 3  # first try + max_retries


def test_no_retry_after_the_first_streamed_byte(client: openai.OpenAI, upstreams: dict[str, FakeUpstream]) -> None:
    upstreams["A"].fail_next(Fault(error_after_chunks=1))
    stream = client.chat.completions.create(model="failover", messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError):
        for _ in stream:
            pass
    assert (_count(upstreams["A"]), _count(upstreams["B"])) == (1, 0)


def test_stream_retries_before_the_first_byte(client: openai.OpenAI, upstreams: dict[str, FakeUpstream]) -> None:
    upstreams["A"].fail_next(Fault(status=500))
    chunks = list(client.chat.completions.create(model="failover", messages=MESSAGES, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "route me"
    assert (_count(upstreams["A"]), _count(upstreams["B"])) == (1, 1)


def test_fallback_group(client: openai.OpenAI, upstreams: dict[str, FakeUpstream]) -> None:
    upstreams["A"].fail_next(Fault(status=503))
    assert client.chat.completions.create(model="primary", messages=MESSAGES).model == "primary"
    assert (_count(upstreams["A"]), _count(upstreams["B"]), _count(upstreams["C"])) == (1, 1, 0)


def test_context_window_fallback(client: openai.OpenAI, upstreams: dict[str, FakeUpstream]) -> None:
    upstreams["A"].fail_next(
        Fault(
            status=400,
            body={"error": {"message": "maximum context length exceeded", "code": "context_length_exceeded"}},
        )
    )
    assert client.chat.completions.create(model="primary", messages=MESSAGES).choices
    assert (_count(upstreams["A"]), _count(upstreams["B"]), _count(upstreams["C"])) == (1, 0, 1)


def test_prompt_over_the_context_window_goes_to_the_fallback(
    client: openai.OpenAI, upstreams: dict[str, FakeUpstream]
) -> None:
    long_prompt = [{"role": "user", "content": " ".join(["word"] * 100)}]
    assert client.chat.completions.create(model="windowed", messages=long_prompt).choices
    assert (_count(upstreams["A"]), _count(upstreams["C"])) == (0, 1)  # never sent where it cannot fit
    assert client.chat.completions.create(model="windowed", messages=MESSAGES).choices
    assert _count(upstreams["A"]) == 1
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="narrow", messages=long_prompt)
    assert err.value.code == "context_length_exceeded" and _count(upstreams["A"]) == 1


def test_client_errors_are_not_retried(client: openai.OpenAI, upstreams: dict[str, FakeUpstream]) -> None:
    upstreams["A"].fail_next(Fault(status=400))
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="failover", messages=MESSAGES)
    assert (_count(upstreams["A"]), _count(upstreams["B"])) == (1, 0)


def _states(gateway: tuple[ServerThread, Path], model: str) -> dict[str, str]:
    rows = httpx.get(gateway[0].url + "/admin/v1/deployments", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert rows.status_code == 200
    return {r["deployment"]: r["state"] for r in rows.json()["data"] if r["model"] == model}


def test_circuit_opens_half_opens_and_closes(
    client: openai.OpenAI, upstreams: dict[str, FakeUpstream], gateway: tuple[ServerThread, Path]
) -> None:
    a = upstreams["A"]
    a.fail_next(Fault(status=500), Fault(status=500))
    client.chat.completions.create(model="breaker", messages=MESSAGES)  # a fails, retry on b
    client.chat.completions.create(model="breaker", messages=MESSAGES)  # a fails again: circuit opens
    assert _states(gateway, "breaker") == {"br-a": "open", "br-b": "healthy"}
    before = _count(a)
    for _ in range(5):
        client.chat.completions.create(model="breaker", messages=MESSAGES)
    assert _count(a) == before  # an open deployment gets no traffic
    time.sleep(0.6)  # the cooldown passes
    assert _states(gateway, "breaker")["br-a"] == "cooling"
    client.chat.completions.create(model="breaker", messages=MESSAGES)  # the half-open trial succeeds
    assert _count(a) == before + 1
    assert _states(gateway, "breaker")["br-a"] == "healthy"
    client.chat.completions.create(model="breaker", messages=MESSAGES)
    assert _count(a) == before + 2  # closed again: priority sends traffic to a


def test_failed_half_open_trial_reopens(
    client: openai.OpenAI, upstreams: dict[str, FakeUpstream], gateway: tuple[ServerThread, Path]
) -> None:
    a = upstreams["A"]
    a.fail_next(*[Fault(status=500)] * 2)
    for _ in range(2):
        client.chat.completions.create(model="breaker", messages=MESSAGES)
    assert _states(gateway, "breaker")["br-a"] == "open"
    time.sleep(0.6)
    a.fail_next(Fault(status=500))
    client.chat.completions.create(model="breaker", messages=MESSAGES)  # trial fails, b answers
    assert _states(gateway, "breaker")["br-a"] == "open"
    time.sleep(0.6)
    client.chat.completions.create(model="breaker", messages=MESSAGES)  # let it recover for later tests
    assert _states(gateway, "breaker")["br-a"] == "healthy"


def test_a_clients_400_between_failures_does_not_keep_the_circuit_closed(
    client: openai.OpenAI, upstreams: dict[str, FakeUpstream], gateway: tuple[ServerThread, Path]
) -> None:
    a = upstreams["A"]
    a.fail_next(Fault(status=500), Fault(status=400), Fault(status=500))
    client.chat.completions.create(model="breaker", messages=MESSAGES)  # a fails, b answers
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="breaker", messages=MESSAGES)  # the request's own fault
    client.chat.completions.create(model="breaker", messages=MESSAGES)  # a's second failure in the window
    assert _states(gateway, "breaker")["br-a"] == "open"
    time.sleep(0.6)
    client.chat.completions.create(model="breaker", messages=MESSAGES)  # let it recover for later tests
    assert _states(gateway, "breaker")["br-a"] == "healthy"


def test_max_concurrency_is_respected(client: openai.OpenAI, upstreams: dict[str, FakeUpstream]) -> None:
    upstreams["A"].fail_next(Fault(hang_after_chunks=1))
    stream = client.chat.completions.create(model="capped", messages=MESSAGES, stream=True)
    next(iter(stream))  # a's only slot is taken
    for _ in range(3):
        client.chat.completions.create(model="capped", messages=MESSAGES)
    assert (_count(upstreams["A"]), _count(upstreams["B"])) == (1, 3)
    stream.close()
    assert upstreams["A"].streams[-1].wait(10)


def test_tokens_per_minute_is_respected(client: openai.OpenAI, upstreams: dict[str, FakeUpstream]) -> None:
    client.chat.completions.create(model="tpm", messages=[{"role": "user", "content": "one two three four five"}])
    client.chat.completions.create(model="tpm", messages=MESSAGES)  # a has used its 5 tokens this minute
    assert (_count(upstreams["A"]), _count(upstreams["B"])) == (1, 1)


def test_lowest_latency_learns(client: openai.OpenAI, upstreams: dict[str, FakeUpstream]) -> None:
    upstreams["A"].options.latency = 0.2
    for _ in range(30):
        client.chat.completions.create(model="lat", messages=MESSAGES, max_tokens=1)
    assert _count(upstreams["B"]) > 2 * _count(upstreams["A"])


def test_a_deployment_held_off_by_its_upstream_shows_in_the_admin_view_and_metrics(
    client: openai.OpenAI, upstreams: dict[str, FakeUpstream], gateway: tuple[ServerThread, Path]
) -> None:
    """An upstream's 429 with a limit used up and a Retry-After over 5 s holds its deployment off:
    the admin view says "held" and for how long, and /metrics exports the seconds left (the circuit
    stays closed)."""
    upstreams["A"].fail_next(Fault(status=429, headers={"retry-after": "60", "x-ratelimit-remaining-tokens": "0"}))
    assert client.chat.completions.create(model="held", messages=MESSAGES).choices  # served by h-b
    rows = httpx.get(gateway[0].url + "/admin/v1/deployments", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    held = {r["deployment"]: r for r in rows.json()["data"] if r["model"] == "held"}
    assert (held["h-a"]["state"], held["h-b"]["state"]) == ("held", "healthy")
    assert 55 < held["h-a"]["held_for_seconds"] <= 60 and held["h-b"]["held_for_seconds"] == 0
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(httpx.get(gateway[0].url + "/metrics").text)
               for s in fam.samples}
    assert 55 < samples[("switchyard_deployment_held_seconds", (("deployment", "h-a"),))] <= 60
    assert samples[("switchyard_deployment_held_seconds", (("deployment", "h-b"),))] == 0
    assert samples[("switchyard_circuit_state", (("deployment", "h-a"), ("state", "closed")))] == 1


def test_deployments_view_needs_an_admin(gateway: tuple[ServerThread, Path]) -> None:
    url = gateway[0].url + "/admin/v1/deployments"
    assert httpx.get(url).status_code == 401
    forbidden = httpx.get(url, headers={"authorization": "Bearer sk-user"})
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "admin_required"
    row = httpx.get(url, headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()["data"][0]
    assert {"state", "latency_ewma_ms", "in_flight", "error_rate"} <= set(row)


def test_reload_changes_routing_without_dropping_in_flight(
    client: openai.OpenAI, upstreams: dict[str, FakeUpstream], gateway: tuple[ServerThread, Path]
) -> None:
    server, path = gateway
    original = path.read_text()
    a, c = upstreams["A"], upstreams["C"]
    a.options.chunk_delay = 0.05
    words = " ".join(f"w{i}" for i in range(20))
    stream = client.chat.completions.create(model="single", messages=[{"role": "user", "content": words}], stream=True)
    iterator = iter(stream)
    first = next(iterator)
    config = _config(upstreams)
    single = next(m for m in config["models"] if m["name"] == "single")
    single["deployments"] = [_dep("one-c", c.url)]
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    try:
        path.write_text("models: [ {name: x} ]\n")  # invalid: the old table stays, the error names the key
        bad = httpx.post(server.url + "/admin/v1/reload", headers=admin)
        assert bad.status_code == 400 and "models[0]" in bad.json()["error"]["message"]
        path.write_text(yaml.safe_dump(config))
        assert httpx.post(server.url + "/admin/v1/reload", headers=admin).status_code == 200
        assert client.chat.completions.create(model="single", messages=MESSAGES).choices
        assert _count(c) == 1
        rest = [first, *iterator]  # the stream that started before the reload runs to the end
        assert "".join(ch.choices[0].delta.content or "" for ch in rest if ch.choices) == words
    finally:
        path.write_text(original)
        assert httpx.post(server.url + "/admin/v1/reload", headers=admin).status_code == 200


def test_a_reload_keeps_what_was_learnt_of_an_unchanged_upstream(
    client: openai.OpenAI, upstreams: dict[str, FakeUpstream], gateway: tuple[ServerThread, Path]
) -> None:
    """A reload that changes a deployment's weight and its group's circuit settings, not its
    upstream: the open circuit (and a hold-off) stay, and no request is sent there before its time."""
    server, path = gateway
    original = path.read_text()
    upstreams["A"].fail_next(Fault(status=500))
    assert client.chat.completions.create(model="relearn", messages=MESSAGES).choices  # rl-a's circuit opens
    assert _states(gateway, "relearn")["rl-a"] == "open"
    config = _config(upstreams)
    relearn = next(m for m in config["models"] if m["name"] == "relearn")
    relearn["circuit"]["cooldown"] = 30
    relearn["deployments"][0]["weight"] = 2
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    try:
        path.write_text(yaml.safe_dump(config))
        assert httpx.post(server.url + "/admin/v1/reload", headers=admin).status_code == 200
        assert _states(gateway, "relearn")["rl-a"] == "open"
        assert client.chat.completions.create(model="relearn", messages=MESSAGES).choices
        assert (_count(upstreams["A"]), _count(upstreams["B"])) == (1, 2)
    finally:
        path.write_text(original)
        assert httpx.post(server.url + "/admin/v1/reload", headers=admin).status_code == 200
