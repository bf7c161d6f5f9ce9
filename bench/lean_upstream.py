"""An OpenAI-compatible chat upstream for the gateway benchmarks that spends as little CPU as it can.

On a two-core machine the upstream, the load generator, Redis and PostgreSQL share the core the
gateway does not have. ``backends.dev.echo_server`` (an ASGI app under uvicorn, a task and a
``json.dumps`` per chunk) spends about 0.8 ms of that core on a 20-chunk stream (55-60 % of it at
the 660 streams/s of ``bench.gateway`` (c)) and serves 8,000-15,000 unstreamed requests/s there,
so the direct rate (a) compares with is the echo server's more than a model server's. This one
answers from a plain ``asyncio.Protocol`` with ``httptools``, each stream's events encoded once
when it starts and sent from loop timers: about 0.3 ms per stream.

It answers what the benchmarks send, the way the echo upstream does for the same request with
``--output-words``: ``GET /v1/models``; ``POST /v1/chat/completions`` with ``n`` 1, streamed (a role
chunk, one chunk per word, a finish chunk, the usage chunk when ``stream_options.include_usage``,
``[DONE]``; ``--chunk-delay`` between them on a fixed clock, the usage chunk at once) or not. A
request is answered after the one before it on the connection.

    .venv/bin/python -m bench.lean_upstream --port 8001 [--latency 0.02] [--chunk-delay 0.005] [--output-words 20]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections import deque
from typing import Any, cast

import httptools
import msgspec
import uvloop

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
MODELS = _encode({"object": "list", "data": [{"id": "echo", "object": "model", "created": 0, "owned_by": "echo"}]})


class Options(msgspec.Struct, frozen=True):
    latency: float = 0.0  # seconds before the response head
    chunk_delay: float = 0.0  # seconds between stream events (but the usage chunk), on a fixed clock
    output_words: int = 20  # words in every answer (one stream chunk each), before max_tokens


def answer_events(payload: dict[str, Any], options: Options) -> tuple[list[bytes], list[bool]]:
    """The SSE events of a streamed answer, and for each whether the clock waits after it."""
    words, finish, prompt_tokens = _output(payload, options)
    base = _envelope(payload, "chat.completion.chunk")
    include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
    usage: dict[str, Any] = {"usage": None} if include_usage else {}
    deltas = [{"role": "assistant", "content": ""}, *({"content": w} for w in words), {}]
    events = [base | {"choices": [{"index": 0, "delta": d, "finish_reason": finish if i == len(deltas) - 1 else None,
                                   "logprobs": None}]} | usage for i, d in enumerate(deltas)]
    waits = [True] * len(events)
    if include_usage:
        events.append(base | {"choices": [], "usage": _usage(prompt_tokens, len(words))})
        waits.append(False)
    return [b"data: " + _encode(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"], waits + [False]


def answer_body(payload: dict[str, Any], options: Options) -> bytes:
    words, finish, prompt_tokens = _output(payload, options)
    message = {"role": "assistant", "content": "".join(words)}
    return _encode(_envelope(payload, "chat.completion")
                   | {"choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                      "usage": _usage(prompt_tokens, len(words))})


def _output(payload: dict[str, Any], options: Options) -> tuple[list[str], str, int]:
    words = [f"w{i} " for i in range(options.output_words - 1)] + [f"w{options.output_words - 1}"]
    messages = [m for m in payload.get("messages") or [] if isinstance(m, dict)]
    prompt_tokens = sum(len(str(m.get("content") or "").split()) + 1 for m in messages)
    limit = payload.get("max_completion_tokens") or payload.get("max_tokens")
    if isinstance(limit, int) and 0 <= limit < len(words):
        return words[:limit], "length", prompt_tokens
    return words, "stop", prompt_tokens


def _envelope(payload: dict[str, Any], kind: str) -> dict[str, Any]:
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": kind, "created": int(time.time()),
            "model": str(payload.get("model", "echo"))}


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _head(status: int, reason: bytes, content_type: bytes, length: int | None) -> bytes:
    framing = b"transfer-encoding: chunked" if length is None else b"content-length: %d" % length
    return b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\n%s\r\n\r\n" % (status, reason, content_type, framing)


class _Request(msgspec.Struct):
    method: bytes
    path: bytes
    body: bytes


class UpstreamProtocol(asyncio.Protocol):
    """One client connection: requests parsed with httptools, answered one after another."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiting: deque[_Request] = deque()
        self.busy = False
        self.timer: asyncio.TimerHandle | None = None
        self._url = b""
        self._body: list[bytes] = []

    # ------------------------------------------------------------ the connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._send(_head(400, b"Bad Request", b"text/plain", 0))
            if self.transport is not None:
                self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._url, self._body = b"", []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.waiting.append(_Request(self.parser.get_method(), self._url.split(b"?")[0], b"".join(self._body)))
        if not self.busy:
            self._next()

    # ------------------------------------------------------------ answers

    def _next(self) -> None:
        self.busy = False
        if self.waiting and self.transport is not None:
            self.busy = True
            request = self.waiting.popleft()
            if self.options.latency and request.method == b"POST":
                self.timer = self.loop.call_later(self.options.latency, self._answer, request)
            else:
                self._answer(request)

    def _answer(self, request: _Request) -> None:
        if request.method == b"GET" and request.path.rstrip(b"/").endswith(b"/models"):
            return self._whole(200, b"OK", MODELS)
        if request.method != b"POST" or not request.path.endswith(b"/chat/completions"):
            return self._whole(404, b"Not Found", _encode({"error": {"message": "no such route", "type": "not_found"}}))
        try:
            payload = _decode(request.body)
            if not isinstance(payload, dict):
                raise ValueError("the body is not a JSON object")
        except (msgspec.DecodeError, ValueError) as exc:
            return self._whole(400, b"Bad Request", _encode({"error": {"message": str(exc), "type": "invalid_json"}}))
        if not payload.get("stream"):
            return self._whole(200, b"OK", answer_body(payload, self.options))
        events, waits = answer_events(payload, self.options)
        self._send(_head(200, b"OK", b"text/event-stream", None))
        self._stream(events, waits, 0, self.loop.time())

    def _stream(self, events: list[bytes], waits: list[bool], at: int, due: float) -> None:
        """Send events from ``at`` on until one is followed by a wait, then come back on the clock."""
        self.timer = None
        while at < len(events):
            event = events[at]
            self._send(b"%x\r\n%b\r\n" % (len(event), event))
            at += 1
            if waits[at - 1] and self.options.chunk_delay:
                due += self.options.chunk_delay
                self.timer = self.loop.call_at(due, self._stream, events, waits, at, due)
                return
        self._send(b"0\r\n\r\n")
        self._next()

    def _whole(self, status: int, reason: bytes, body: bytes) -> None:
        self._send(_head(status, reason, b"application/json", len(body)) + body)
        self._next()

    def _send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)


async def serve(host: str, port: int, options: Options) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: UpstreamProtocol(options), host, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--latency", type=float, default=0.0, help="Seconds before the response head.")
    parser.add_argument("--chunk-delay", type=float, default=0.0, help="Seconds between stream events.")
    parser.add_argument("--output-words", type=int, default=20, help="Words in every answer.")
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port, Options(args.latency, args.chunk_delay, args.output_words)))


if __name__ == "__main__":
    main()
