"""``bench.lean_upstream`` answers the benchmarks' requests as the dev echo upstream does, so that
``bench.gateway`` compares the gateway with the same answers whichever of them it starts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench.harness import ECHO, LEAN, start_upstream, stop

STREAMING = ("--output-words", "20", "--chunk-delay", "0.001")
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "Say hello to the benchmark, please."}]}


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, str]]:
    started = {name: start_upstream(*STREAMING, module=module) for name, module in (("echo", ECHO), ("lean", LEAN))}
    try:
        yield {name: url for name, (_, url) in started.items()}
    finally:
        for proc, _ in started.values():
            stop(proc)


def _without_ids(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k not in ("id", "created")}


def _events(url: str, body: dict[str, Any]) -> list[Any]:
    with httpx.Client(timeout=10) as client, client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        data = [line.removeprefix("data: ") for line in resp.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [_without_ids(json.loads(d)) for d in data[:-1]]


@pytest.mark.parametrize("body", [
    CHAT | {"stream": True, "max_tokens": 16, "stream_options": {"include_usage": True}},
    CHAT | {"stream": True},
], ids=["16 of 20 words, usage", "all words, no usage"])
def test_a_stream_is_the_echo_upstreams_event_for_event(upstreams: dict[str, str], body: dict[str, Any]) -> None:
    lean, echo = _events(upstreams["lean"], body), _events(upstreams["echo"], body)
    assert lean == echo
    assert len(lean) == min(body.get("max_tokens", 20), 20) + 2 + ("stream_options" in body)


def test_an_answer_is_the_echo_upstreams_and_keep_alive_serves_the_next(upstreams: dict[str, str]) -> None:
    answers = {}
    for name, url in upstreams.items():
        with httpx.Client(base_url=url, timeout=10) as client:
            first = client.post("/v1/chat/completions", json=CHAT | {"max_tokens": 3}).json()
            again = client.post("/v1/chat/completions", json=CHAT).json()
            assert client.get("/v1/models").json()["data"][0]["id"] == "echo"
        answers[name] = [_without_ids(first), _without_ids(again)]
    assert answers["lean"] == answers["echo"]
    assert answers["lean"][0]["usage"]["completion_tokens"] == 3


def test_bad_requests_get_an_error_and_the_connection_still_answers(upstreams: dict[str, str]) -> None:
    with httpx.Client(base_url=upstreams["lean"], timeout=10) as client:
        bad = client.post("/v1/chat/completions", content=b"{not json")
        assert bad.status_code == 400 and "error" in bad.json()
        assert client.post("/v1/embeddings", json={"input": "x"}).status_code == 404
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
