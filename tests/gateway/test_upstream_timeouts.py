"""A deployment's upstream timeouts cut a stalled upstream at their limit, through the whole gateway.

Each deployment sets the timeout under test short and every other one long; the client waits less
than those long ones, so an answer reaching the client at all shows which limit cut the request.
The upstream is a real loopback server that stalls (before its headers, after its headers, between
events, or trickling forever), and it sees the gateway hang up.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from gateway.contracts import Principal
from gateway.settings import parse_settings
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.scripted_gateway import scripted_gateway
from tests.support.servers import ServerThread

KEY = "sk-timeouts"
LONG = 60.0  # every limit not under test
CLIENT_WAIT = 10.0  # what the client waits: far below LONG, far above the limit under test
MESSAGES = [{"role": "user", "content": "one two three four five six seven eight"}]


def _group(name: str, url: str, **timeouts: float) -> dict:
    limits = {"connect": 2.0, "first_byte": LONG, "total": LONG, "idle": LONG} | timeouts
    return {"name": name, "max_retries": 0, "circuit": {"failures": 1_000_000},
            "deployments": [{"provider": "openai", "model": "m", "api_base": url, "api_key": "sk-up",
                             "timeouts": limits}]}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    server = FakeUpstream().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream) -> Iterator[ServerThread]:
    models = [_group("first-byte", upstream.url, first_byte=0.5), _group("total", upstream.url, total=1.0),
              _group("idle", upstream.url, idle=0.5)]
    settings = parse_settings({"models": models}, env={})
    with scripted_gateway(settings, {KEY: Principal(key_id="k", tenant_id="t")}) as server:
        yield server


@pytest.fixture
def client(gateway: ServerThread, upstream: FakeUpstream) -> openai.OpenAI:
    upstream.reset()
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0, timeout=CLIENT_WAIT)


def _stream(client: openai.OpenAI, model: str) -> list[str]:
    out = []
    for chunk in client.chat.completions.create(model=model, messages=MESSAGES, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            out.append(chunk.choices[0].delta.content)
    return out


def test_first_byte_cuts_an_upstream_that_sends_no_headers(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(delay=LONG))
    with pytest.raises(openai.APIStatusError) as err:
        _stream(client, "first-byte")
    assert err.value.status_code == 504 and "did not answer in time" in err.value.message


def test_first_byte_cuts_a_stream_whose_first_event_never_comes(client: openai.OpenAI,
                                                                upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(hang_after_chunks=0))  # headers, then silence
    with pytest.raises(openai.APIStatusError) as err:
        _stream(client, "first-byte")
    assert err.value.status_code == 504
    assert upstream.streams[-1].wait() and upstream.streams[-1].completed is False  # the gateway hung up


def test_total_cuts_a_non_streaming_answer_that_never_comes(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(delay=LONG))
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="total", messages=MESSAGES)
    assert err.value.status_code == 504


def test_total_cuts_a_stream_that_keeps_trickling(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    upstream.options.chunk_delay = 0.25  # never silent for long, but 200 words take 50 s
    upstream.options.output_words = 200
    with pytest.raises(openai.APIError, match="stream timed out"):  # not the client giving up
        _stream(client, "total")
    assert upstream.streams[-1].wait() and upstream.streams[-1].completed is False


def test_idle_cuts_a_stream_that_stalls_midway(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(hang_after_chunks=2))
    received: list[str] = []
    with pytest.raises(openai.APIError, match="idle timeout"):
        for chunk in client.chat.completions.create(model="idle", messages=MESSAGES, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                received.append(chunk.choices[0].delta.content)
    assert len(received) == 2  # what came before the stall was relayed
    assert upstream.streams[-1].wait() and upstream.streams[-1].completed is False


def test_a_slow_but_steady_stream_is_not_idle(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    upstream.options.chunk_delay = 0.1  # each gap well inside the 0.5 s idle limit
    upstream.options.output_words = 12
    assert len(_stream(client, "idle")) == 12
