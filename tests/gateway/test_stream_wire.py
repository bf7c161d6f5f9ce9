"""Streams as an OpenAI SDK user and a raw SSE reader meet them, from an upstream whose body is
scripted byte for byte: events cut across reads anywhere, SSE's other fields, usage as each kind
of upstream reports it, failures part way, streams cut by the drain (chat, and a relayed Responses
stream), and the response's head."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from backends.base import ChunkStream, Meter
from backends.dev.echo_server import read_body
from backends.responses_wire import ResponsesEvent
from gateway import streaming
from gateway.dialects.responses import RelayedEvents
from gateway.errors import ApiError
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.support.doubles import CutAfter, RecordingSink
from tests.support.scripted_gateway import scripted_gateway
from tests.support.servers import OnLoopback

Script = list[bytes | float]  # body pieces, each sent on its own; a float: a pause of that many seconds
CHAT = [{"role": "user", "content": "hi"}]


class ScriptedUpstream(OnLoopback):
    """Answers each request with the next queued script (as ``text/event-stream``)."""

    def __init__(self) -> None:
        self.scripts: deque[Script] = deque()
        self.received: list[Any] = []
        self.finished = threading.Event()
        self.running = 0  # scripts still being sent (the client may have its [DONE] before their end)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.running += 1
        try:
            await self._answer(receive, send)
        finally:
            self.running -= 1

    async def _answer(self, receive: Any, send: Any) -> None:
        self.received.append(json.loads(await read_body(receive)))
        script = self.scripts.popleft()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        try:
            for piece in script:
                if isinstance(piece, float):
                    await asyncio.sleep(piece)
                    continue
                await send({"type": "http.response.body", "body": piece, "more_body": True})
                await asyncio.sleep(0.001)  # its own read at the gateway
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.finished.set()


@dataclass
class Wire:
    upstream: ScriptedUpstream
    usage: RecordingSink
    url: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=ADMIN_KEY, max_retries=0)


@pytest.fixture(scope="module")
def wire_env() -> Iterator[Wire]:
    upstream = ScriptedUpstream().start()
    deployment = {"provider": "openai", "model": "up", "api_base": upstream.url, "api_key": "sk-up",
                  "timeouts": {"connect": 2, "first_byte": 5, "total": 10}}
    plain = {"max_retries": 0, "circuit": {"failures": 1_000_000}}  # one upstream attempt each
    settings = gateway_settings(upstream.url, models=[
        {"name": "echo", "deployments": [deployment], **plain},
        {"name": "relay", "deployments": [deployment | {"name": "relay-dep", "responses_api": True}], **plain}])
    usage = RecordingSink()
    with scripted_gateway(settings, usage=usage) as server:
        yield Wire(upstream, usage, server.url)
    upstream.stop()


@pytest.fixture
def wire(wire_env: Wire) -> Iterator[Wire]:
    wire_env.upstream.scripts.clear()
    wire_env.upstream.received.clear()
    wire_env.upstream.finished.clear()
    wire_env.usage.records.clear()
    yield wire_env
    until = time.monotonic() + 5
    while wire_env.upstream.running and time.monotonic() < until:  # its scripts' ends are not the next test's
        time.sleep(0.01)


def chunk(content: str | None = None, finish: str | None = None, index: int = 0,
          usage: dict[str, int] | None = None, choices: bool = True) -> dict[str, Any]:
    delta = {} if content is None else {"content": content}
    event: dict[str, Any] = {"id": "chatcmpl-w", "object": "chat.completion.chunk", "created": 1, "model": "up",
                             "choices": [{"index": index, "delta": delta, "finish_reason": finish}] if choices else []}
    if usage is not None:
        event["usage"] = usage
    return event


def events(*chunks: dict[str, Any], done: bool = True) -> bytes:
    body = b"".join(b"data: " + json.dumps(c, ensure_ascii=False).encode() + b"\n\n" for c in chunks)
    return body + (b"data: [DONE]\n\n" if done else b"")


def usage_of(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def raw_events(wire: Wire, headers_extra: dict[str, str] | None = None,
               **body: Any) -> tuple[httpx.Response, list[str]]:
    """The response and its ``data:`` payloads as a raw SSE reader sees them."""
    payload = {"model": "echo", "messages": CHAT, "stream": True} | body
    headers = {"authorization": f"Bearer {ADMIN_KEY}"} | (headers_extra or {})
    with httpx.stream("POST", wire.url + "/v1/chat/completions", json=payload, headers=headers,
                      timeout=10) as response:
        text = response.read().decode()
    assert text.endswith("\n\n"), text[-200:]
    data = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    assert all(not line or line.startswith("data: ") for line in text.split("\n")), text[:500]
    return response, data


# ---------------------------------------------------------------- framing


def test_events_cut_at_every_byte_with_every_sse_field_arrive_whole(wire: Wire) -> None:
    text = ["hé", "llo ✓ ", "😀", " end"]
    body = (b": ping\r\n\r\nevent: message\r\nid: 1\r\nretry: 1000\r\n"
            + events(*(chunk(t) for t in text), chunk(finish="stop"), chunk(usage=usage_of(3, 4), choices=False))
            .replace(b"data: ", b"data:", 2).replace(b"\n", b"\r\n"))
    wire.upstream.scripts.append([body[i:i + 1] for i in range(len(body))])
    stream = wire.client().chat.completions.create(model="echo", messages=CHAT, stream=True,
                                                   stream_options={"include_usage": True})
    got = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in got if c.choices) == "".join(text)
    assert [c.choices[0].finish_reason for c in got if c.choices][-1] == "stop"
    assert got[-1].choices == [] and got[-1].usage is not None and got[-1].usage.completion_tokens == 4
    assert all(c.model == "echo" for c in got)
    record = wire.usage.wait_for(1)[0]
    assert (record.prompt_tokens, record.completion_tokens, record.exact) == (3, 4, True)


def test_events_whose_lines_end_with_a_carriage_return_alone_are_relayed_as_they_come(wire: Wire) -> None:
    """SSE lets a line end with CR alone: each event is relayed when it arrives (it was held until
    the end of the body), even cut at every byte."""
    first = events(chunk("hé"), done=False).replace(b"\n", b"\r")
    rest = events(chunk(" there"), chunk(finish="stop"), chunk(usage=usage_of(3, 2), choices=False))
    wire.upstream.scripts.append([first[i:i + 1] for i in range(len(first))] + [2.0, rest.replace(b"\n", b"\r")])
    stream = wire.client().chat.completions.create(model="echo", messages=CHAT, stream=True,
                                                   stream_options={"include_usage": True})
    got = [next(stream)]
    assert not wire.upstream.finished.is_set()  # the first event came while the upstream still paused
    got += list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in got if c.choices) == "hé there"
    assert got[-1].usage is not None and got[-1].usage.completion_tokens == 2
    record = wire.usage.wait_for(1)[0]
    assert (record.prompt_tokens, record.completion_tokens, record.exact) == (3, 2, True)


def test_a_megabyte_chunk_is_relayed_intact(wire: Wire) -> None:
    big = "x" * (1 << 20)
    body = events(chunk(big), chunk(finish="stop"), chunk(usage=usage_of(1, 2), choices=False))
    wire.upstream.scripts.append([body[i:i + 65536] for i in range(0, len(body), 65536)])
    _, data = raw_events(wire)
    assert json.loads(data[0])["choices"][0]["delta"]["content"] == big
    assert data[-1] == "[DONE]"


# ---------------------------------------------------------------- usage


def test_an_upstream_without_usage_gets_an_estimated_usage_chunk_last(wire: Wire) -> None:
    wire.upstream.scripts.append([events(chunk("one two three"), chunk(finish="stop"))])
    got = list(wire.client().chat.completions.create(model="echo", messages=CHAT, stream=True,
                                                     stream_options={"include_usage": True}))
    assert [c.usage is not None for c in got] == [False, False, True]
    assert got[-1].choices == [] and got[-1].usage.completion_tokens > 0  # type: ignore[union-attr]
    assert got[-1].usage.total_tokens == got[-1].usage.prompt_tokens + got[-1].usage.completion_tokens  # type: ignore[union-attr]
    record = wire.usage.wait_for(1)[0]
    assert record.completion_tokens == got[-1].usage.completion_tokens and not record.exact  # type: ignore[union-attr]


def test_usage_not_asked_for_is_not_relayed(wire: Wire) -> None:
    wire.upstream.scripts.append([events(chunk("a"), chunk(finish="stop", usage=usage_of(2, 1)),
                                         chunk(usage=usage_of(2, 1), choices=False))])
    _, data = raw_events(wire)
    assert all("usage" not in json.loads(d) for d in data[:-1]) and len(data) == 3
    assert wire.usage.wait_for(1)[0].completion_tokens == 1


def test_a_chunk_without_choices_and_a_null_usage_is_relayed_when_usage_was_not_asked(wire: Wire) -> None:
    """Azure's first chunk (its prompt filter results, no choices) carries ``usage: null`` once usage is
    asked for upstream: it is no usage chunk, and reaches every client, as sent but for ``usage``."""
    first = {"id": "", "object": "", "created": 0, "model": "", "choices": [], "usage": None,
             "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}]}
    for asked in (True, False):
        wire.upstream.scripts.append([events(first, chunk("a"), chunk(finish="stop"),
                                             chunk(usage=usage_of(2, 1), choices=False))])
        _, data = raw_events(wire, stream_options={"include_usage": asked})
        relayed = json.loads(data[0])
        assert relayed["prompt_filter_results"] == first["prompt_filter_results"] and relayed["choices"] == []
        assert ("usage" in relayed) is asked
        assert len(data) == (5 if asked else 4)


def test_cumulative_usage_in_every_chunk_is_metered_once(wire: Wire) -> None:
    wire.upstream.scripts.append([events(chunk("a", usage=usage_of(5, 1)), chunk("b", usage=usage_of(5, 2)),
                                         chunk(finish="stop", usage=usage_of(5, 3)),
                                         chunk(usage=usage_of(5, 3), choices=False))])
    got = list(wire.client().chat.completions.create(model="echo", messages=CHAT, stream=True,
                                                     stream_options={"include_usage": True,
                                                                     "continuous_usage_stats": True}))  # type: ignore[typeddict-unknown-key]
    assert [c.usage.completion_tokens for c in got] == [1, 2, 3, 3]  # type: ignore[union-attr]
    record = wire.usage.wait_for(1)[0]
    assert (record.prompt_tokens, record.completion_tokens) == (5, 3)


@pytest.mark.parametrize("with_usage", ["the finishing chunk", "every chunk"])
def test_usage_asked_for_comes_once_in_a_last_chunk_of_no_choice(wire: Wire, with_usage: str) -> None:
    """Usage on chunks with choices (on the finishing one, as Gemini's and Mistral's OpenAI-compatible
    APIs send it, or cumulative on every one) is the closing usage chunk's, as OpenAI sends it: the
    client gets it once, last, with no choice (a client that sums each chunk's usage counts it once)."""
    every = with_usage == "every chunk"
    wire.upstream.scripts.append([events(chunk("a", usage=usage_of(2, 1) if every else None),
                                         chunk("b", usage=usage_of(2, 2) if every else None),
                                         chunk(finish="stop", usage=usage_of(2, 2)))])
    _, data = raw_events(wire, stream_options={"include_usage": True})
    got = [json.loads(d) for d in data[:-1]]
    assert data[-1] == "[DONE]" and len(got) == 4
    assert [c.get("usage") is not None for c in got] == [False, False, False, True]
    assert got[-1]["choices"] == [] and got[-1]["usage"] == usage_of(2, 2)
    assert got[-1]["id"] == "chatcmpl-w" and got[-1]["model"] == "echo"
    record = wire.usage.wait_for(1)[0]
    assert (record.prompt_tokens, record.completion_tokens, record.exact) == (2, 2, True)


def test_n_choices_interleaved_each_finish_once_and_usage_comes_last(wire: Wire) -> None:
    wire.upstream.scripts.append([events(chunk("a", index=0), chunk("b", index=1), chunk("c", index=0),
                                         chunk(finish="stop", index=1), chunk(finish="length", index=0),
                                         chunk(usage=usage_of(2, 3), choices=False))])
    got = list(wire.client().chat.completions.create(model="echo", messages=CHAT, stream=True, n=2,
                                                     stream_options={"include_usage": True}))
    finishes = [(c.choices[0].index, c.choices[0].finish_reason) for c in got
                if c.choices and c.choices[0].finish_reason]
    assert sorted(finishes) == [(0, "length"), (1, "stop")]
    assert got[-1].choices == [] and got[-1].usage.completion_tokens == 3  # type: ignore[union-attr]


# ---------------------------------------------------------------- failures


def test_a_body_that_ends_after_a_chunk_without_choices_fails(wire: Wire) -> None:
    """Azure's first chunk (its prompt filter results, no choices), then the end of the body with no
    ``[DONE]``: the answer never began, so the stream failed; it is not an empty completed answer."""
    first = {"id": "", "object": "", "created": 0, "model": "", "choices": [],
             "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}]}
    wire.upstream.scripts.append([events(first, done=False)])
    _, data = raw_events(wire)
    assert len(data) == 2 and "error" in json.loads(data[1]) and "[DONE]" not in data
    assert wire.usage.wait_for(1)[0].error_type is not None
    wire.upstream.scripts.append([events(first)])  # with [DONE] the upstream said it is over: relayed as it came
    _, data = raw_events(wire)
    assert data[-1] == "[DONE]" and len(data) == 2


def test_done_ends_the_client_stream_at_once_though_the_upstream_body_stays_open(wire: Wire) -> None:
    """After ``[DONE]`` an upstream that keeps its body open is drained in the background: the
    client's ``[DONE]``, the end of its stream and its usage row do not wait for the body's end."""
    wire.upstream.scripts.append([events(chunk("hi"), chunk(finish="stop"), chunk(usage=usage_of(2, 1), choices=False)),
                                  1.5])
    started = time.monotonic()
    stream = wire.client().chat.completions.create(model="echo", messages=CHAT, stream=True,
                                                   stream_options={"include_usage": True})
    got = list(stream)
    assert time.monotonic() - started < 0.4
    assert got[-1].usage is not None and got[-1].usage.completion_tokens == 1
    assert wire.usage.wait_for(1, timeout=0.4)[0].completion_tokens == 1
    assert not wire.upstream.finished.is_set()


def test_an_error_mid_stream_ends_the_stream_with_an_error_event_and_no_done(wire: Wire) -> None:
    error = {"error": {"message": "boom", "type": "server_error", "param": None, "code": None}}
    wire.upstream.scripts.append([events(chunk("a b"), done=False), b"data: " + json.dumps(error).encode() + b"\n\n"])
    _, data = raw_events(wire)
    assert len(data) == 2 and "[DONE]" not in data
    relayed = json.loads(data[1])["error"]
    assert set(relayed) >= {"message", "type", "code"}
    with pytest.raises(openai.APIError):
        wire.upstream.scripts.append([events(chunk("a b"), done=False),
                                      b"data: " + json.dumps(error).encode() + b"\n\n"])
        list(wire.client().chat.completions.create(model="echo", messages=CHAT, stream=True))
    records = wire.usage.wait_for(2)
    assert all(r.completion_tokens >= 1 for r in records)


def test_openrouters_error_chunk_is_relayed_as_it_came_and_settled_as_a_failure(wire: Wire) -> None:
    """OpenRouter's failure mid-stream, a chunk with ``finish_reason: "error"`` and an ``error``,
    then ``[DONE]``: relayed as it came, but its usage row says the upstream failed it."""
    failed = chunk(finish="error") | {"error": {"code": 502, "message": "Provider disconnected"}}
    wire.upstream.scripts.append([events(chunk("a b"), failed)])
    _, data = raw_events(wire)
    assert json.loads(data[1]) == failed | {"model": "echo"} and data[-1] == "[DONE]"
    record = wire.usage.wait_for(1)[0]
    assert record.status == 200 and record.extra["outcome"] == "failed"
    assert record.error_type == "upstream_error" and record.completion_tokens >= 1
    wire.upstream.scripts.append([events(chunk("a b"), chunk(finish="stop"))])  # an ordinary end: a success
    raw_events(wire)
    record = wire.usage.wait_for(2)[1]
    assert (record.extra["outcome"], record.error_type) == ("completed", None)


@pytest.mark.parametrize("n", [1, 2])
def test_a_drained_stream_finishes_each_unfinished_choice_once(wire: Wire, monkeypatch: pytest.MonkeyPatch,
                                                               n: int) -> None:
    """Cut by the drain after choice 0 finished: only the choices still open end with ``length``
    (none when all have finished: the last chunk then holds only the usage)."""
    second = [chunk("b", index=1)] if n == 2 else []
    sent = [chunk("a", index=0), *second, chunk(finish="stop", index=0)]
    wire.upstream.scripts.append([events(*sent, done=False), 2.0, events(chunk(finish="stop", index=1))])
    monkeypatch.setattr(streaming, "DRAIN", CutAfter(reads=len(sent) - 1))
    _, data = raw_events(wire, n=n)
    assert data[-1] == "[DONE]"
    finishes = [(c["index"], c["finish_reason"]) for d in data[:-1] for c in json.loads(d)["choices"]
                if c["finish_reason"]]
    assert sorted(finishes) == [(0, "stop"), (1, "length")][:n]
    assert json.loads(data[-2])["usage"]["completion_tokens"] > 0
    assert wire.usage.wait_for(1)[0].extra == {"outcome": "drained"}


async def test_a_drained_relayed_responses_stream_ends_incomplete(monkeypatch: pytest.MonkeyPatch) -> None:
    """An upstream's Responses stream cut by the drain ends with ``response.incomplete`` and the usage
    metered (it was an ``error`` event: the cut chunk looked for chat choices in a Responses event)."""
    async def upstream_events() -> AsyncIterator[ResponsesEvent]:
        yield ResponsesEvent({"type": "response.created", "sequence_number": 0,
                              "response": {"id": "resp_1", "status": "in_progress", "output": []}})
        yield ResponsesEvent({"type": "response.output_text.delta", "sequence_number": 1, "delta": "hi"})
        await asyncio.Event().wait()  # an answer still being written

    outcomes: list[streaming.Outcome] = []

    async def on_end(meter: Meter, outcome: streaming.Outcome, error: ApiError | None) -> None:
        outcomes.append(outcome)

    monkeypatch.setattr(streaming, "DRAIN", CutAfter(reads=1))
    meter = Meter(prompt_tokens=3, completion_tokens=1)
    relay = streaming.SSERelay(ChunkStream(upstream_events(), meter), "public", on_end,
                               RelayedEvents(meter, {}, {}, lambda response, output: None))
    sent = [json.loads(line[6:]) for event in [e async for e in relay.events()]
            for line in event.decode().split("\n") if line.startswith("data: ")]
    assert [e["type"] for e in sent] == ["response.created", "response.output_text.delta", "response.incomplete"]
    last = sent[-1]
    assert last["sequence_number"] == 2 and last["response"]["id"] == "resp_1"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["usage"]["output_tokens"] == 1 and outcomes == [streaming.Outcome.DRAINED]


def test_a_relayed_responses_stream_cut_before_its_last_event_fails(wire: Wire) -> None:
    """An upstream's Responses stream whose body ends before ``response.completed`` (or another last
    event) is a failure, as a chat stream's is: an ``error`` event, then ``response.failed``."""
    created = {"type": "response.created", "sequence_number": 0,
               "response": {"id": "resp_up", "object": "response", "status": "in_progress", "output": []}}
    delta = {"type": "response.output_text.delta", "sequence_number": 1, "delta": "partial"}
    wire.upstream.scripts.append([b"".join(b"event: %s\ndata: %s\n\n" % (e["type"].encode(), json.dumps(e).encode())
                                           for e in (created, delta))])
    with httpx.stream("POST", wire.url + "/v1/responses", timeout=10,
                      json={"model": "relay", "input": "hi", "stream": True, "store": False},
                      headers={"authorization": f"Bearer {ADMIN_KEY}"}) as response:
        sent = [json.loads(line[6:]) for line in response.read().decode().split("\n") if line.startswith("data: ")]
    assert [e["type"] for e in sent] == ["response.created", "response.output_text.delta", "error", "response.failed"]
    record = wire.usage.wait_for(1)[0]
    assert record.extra == {"outcome": "failed"} and record.completion_tokens >= 1


# ---------------------------------------------------------------- the response


def test_a_stream_head_is_an_event_stream_with_a_request_id_and_no_length(wire: Wire) -> None:
    wire.upstream.scripts.append([events(chunk("a"), chunk(finish="stop"))])
    response, _ = raw_events(wire)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert "content-length" not in response.headers
    assert response.headers["x-request-id"] and response.headers["cache-control"] == "no-cache"


def test_a_stream_asked_with_connection_close_ends_whole_and_closes(wire: Wire) -> None:
    wire.upstream.scripts.append([events(chunk("a"), chunk(finish="stop"))])
    response, data = raw_events(wire, headers_extra={"connection": "close"})
    assert response.headers["connection"] == "close" and data[-1] == "[DONE]"
    assert response.headers["x-request-id"] == wire.usage.wait_for(1)[0].request_id


def raw_http(wire: Wire, version: str, body: dict[str, Any]) -> tuple[bytes, bytes]:
    """Head and body of one request sent over a raw socket, read until the gateway closes."""
    payload = json.dumps(body).encode()
    close = "connection: close\r\n" if version == "1.1" else ""  # 1.0 closes by default
    request = (f"POST /v1/chat/completions HTTP/{version}\r\nhost: 127.0.0.1\r\nauthorization: Bearer {ADMIN_KEY}\r\n"
               f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n{close}\r\n").encode() + payload
    host, port = wire.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        received = b""
        while piece := sock.recv(65536):
            received += piece
    head, _, rest = received.partition(b"\r\n\r\n")
    return head.lower(), rest


def test_an_http10_stream_is_plain_sse_ended_by_closing(wire: Wire) -> None:
    """HTTP/1.0 has no chunked encoding: the body is the events themselves, delimited by the close."""
    for _ in range(2):
        wire.upstream.scripts.append([events(chunk("a"), chunk("b"), chunk(finish="stop"))])
    head, body = raw_http(wire, "1.0", {"model": "echo", "messages": CHAT, "stream": True})
    assert b"transfer-encoding" not in head and b"content-length" not in head, head
    assert b"\r\nconnection: close" in head, head
    assert body.endswith(b"data: [DONE]\n\n") and body.startswith(b"data: "), body[:200]
    assert all(not line or line.startswith(b"data: ") for line in body.split(b"\n")), body
    assert [json.loads(line[6:])["choices"][0]["delta"].get("content") for line in body.split(b"\n")
            if line.startswith(b"data: {")] == ["a", "b", None]
    head, body = raw_http(wire, "1.1", {"model": "echo", "messages": CHAT, "stream": True})
    assert b"transfer-encoding: chunked" in head and body.endswith(b"0\r\n\r\n"), (head, body[-50:])


def test_an_http10_answer_has_a_length_and_no_chunks(wire: Wire) -> None:
    answer = {"id": "chatcmpl-w", "object": "chat.completion", "created": 1, "model": "up", "usage": usage_of(1, 1),
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": "stop"}]}
    wire.upstream.scripts.append([json.dumps(answer).encode()])
    head, body = raw_http(wire, "1.0", {"model": "echo", "messages": CHAT})
    assert head.startswith(b"http/1.1 200 ") and b"transfer-encoding" not in head, head
    assert f"content-length: {len(body)}".encode() in head and b"\r\nconnection: close" in head, head
    assert json.loads(body)["choices"][0]["message"]["content"] == "a"
