"""A tiny OpenAI-compatible upstream that echoes the prompt back, word by word.

``make run`` starts it (``python -m backends.dev.echo_server``) while its config (``config/echo.yaml``) routes
to it, so the gateway works on a fresh machine before any model is downloaded. It is a plain
ASGI app with no framework; the tests' fake upstream builds on it (error injection, recording).

Behaviour: a chat completion answers with the last user message, a text completion with its
(first) prompt; ``max_tokens`` truncates (finish_reason ``length``); ``n`` repeats the choice;
one "token" is one whitespace-delimited word; streams send one word per chunk and a usage chunk
when ``stream_options.include_usage`` is set (with vLLM's ``continuous_usage_stats`` too, every
chunk carries the usage so far, as vLLM's do).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_PIECE = re.compile(r"\S+\s*")


@dataclass
class EchoOptions:
    latency: float = 0.0  # seconds before the response headers
    # seconds between stream chunks (but the usage chunk), on a fixed clock like a model server's
    # decode steps: chunk k leaves k delays after the first, at once if this process ran late
    chunk_delay: float = 0.0
    report_usage: bool = True  # False: behave like an upstream that never reports usage
    output_words: int | None = None  # answer with this many words (one stream chunk each), not the echo
    model_ids: tuple[str, ...] = ("echo",)


def pieces(text: str) -> list[str]:
    return _PIECE.findall(text)


@dataclass
class Exchange:
    """One HTTP request as the echo app sees it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    receive: Receive
    send: Send
    query: str = ""  # the query string, as sent

    def json(self) -> Any:
        return json.loads(self.body or b"null")


async def read_body(receive: Receive) -> bytes:
    """An HTTP request's whole body, from however many ASGI messages it comes in."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


class EchoUpstream:
    """The ASGI app. Subclasses override :meth:`handle` to inject behaviour."""

    def __init__(self, options: EchoOptions | None = None) -> None:
        self.options = options or EchoOptions()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        await self.handle(Exchange(scope["method"], scope["path"], headers, body, receive, send,
                                   scope.get("query_string", b"").decode("latin-1")))

    async def handle(self, ex: Exchange) -> None:
        if ex.method == "GET" and ex.path.rstrip("/").endswith("/models"):
            models = [{"id": m, "object": "model", "created": 0, "owned_by": "echo"} for m in self.options.model_ids]
            return await send_json(ex, 200, {"object": "list", "data": models})
        if ex.method != "POST" or not ex.path.endswith(("/chat/completions", "/completions", "/embeddings")):
            return await send_json(ex, 404, error_body(f"no route {ex.method} {ex.path}", "not_found"))
        try:
            payload = ex.json()
            if not isinstance(payload, dict):
                raise ValueError("body must be an object")
        except ValueError as exc:
            return await send_json(ex, 400, error_body(f"invalid JSON body: {exc}", "invalid_json"))
        if self.options.latency:
            await asyncio.sleep(self.options.latency)
        if ex.path.endswith("/embeddings"):
            return await send_json(ex, 200, _embeddings(payload))
        chat = ex.path.endswith("/chat/completions")
        if payload.get("stream"):
            await self.stream(ex, payload, chat)
        else:
            await send_json(ex, 200, self.reply(payload, chat))

    # ------------------------------------------------------------ content

    def prompt_text(self, payload: dict[str, Any], chat: bool) -> tuple[str, int]:
        """(text to echo, prompt token count)."""
        if chat:
            texts = [_message_text(m) for m in payload.get("messages") or [] if isinstance(m, dict)]
            users = [_message_text(m) for m in payload.get("messages") or []
                     if isinstance(m, dict) and m.get("role") == "user"]
            return (users[-1] if users else ""), sum(len(pieces(t)) + 1 for t in texts)
        prompt = payload.get("prompt", "")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt = [prompt]  # one prompt given as token ids
        first = prompt[0] if isinstance(prompt, list) and prompt else prompt
        if isinstance(first, list):  # token ids: echo them as numbers
            return " ".join(str(t) for t in first), len(first)
        text = first if isinstance(first, str) else ""
        return text, len(pieces(text))

    def output(self, payload: dict[str, Any], chat: bool) -> tuple[list[str], str, int]:
        """(output pieces, finish_reason, prompt tokens)."""
        text, prompt_tokens = self.prompt_text(payload, chat)
        if self.options.output_words is not None:
            text = " ".join(f"w{i}" for i in range(self.options.output_words))
        out = pieces(text) or ["(empty)"]
        limit = payload.get("max_completion_tokens") or payload.get("max_tokens")
        if isinstance(limit, int) and 0 <= limit < len(out):
            return out[:limit], "length", prompt_tokens
        return out, "stop", prompt_tokens

    def reply(self, payload: dict[str, Any], chat: bool) -> dict[str, Any]:
        out, finish, prompt_tokens = self.output(payload, chat)
        n = payload.get("n") or 1
        text = "".join(out)
        if chat:
            choices = [{"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                        "logprobs": None} for i in range(n)]
        else:
            choices = [{"index": i, "text": text, "finish_reason": finish, "logprobs": None} for i in range(n)]
        body = _envelope(payload, chat, stream=False) | {"choices": choices}
        if self.options.report_usage:
            body["usage"] = _usage(prompt_tokens, len(out) * n)
        return body

    async def stream(self, ex: Exchange, payload: dict[str, Any], chat: bool) -> bool:
        """Send an SSE stream; True when it completed, False when the client went away."""
        out, finish, prompt_tokens = self.output(payload, chat)
        n = payload.get("n") or 1
        options = payload.get("stream_options") or {}
        want_usage = bool(options.get("include_usage")) and self.options.report_usage
        base = _envelope(payload, chat, stream=True)
        events: list[dict[str, Any]] = []
        if chat:
            events.append(base | {"choices": [_chat_delta(i, {"role": "assistant", "content": ""}) for i in range(n)]})
        for piece in out:
            delta = {"content": piece} if chat else None
            events.append(base | {"choices": [_chat_delta(i, delta) if chat else _text_delta(i, piece)
                                              for i in range(n)]})
        last = [_chat_delta(i, {}, finish) if chat else _text_delta(i, "", finish) for i in range(n)]
        events.append(base | {"choices": last})
        if want_usage:
            for event in events:
                event["usage"] = None
            if options.get("continuous_usage_stats"):
                _count_usage(events, prompt_tokens)
            events.append(base | {"choices": [], "usage": _usage(prompt_tokens, len(out) * n)})
        await ex.send({"type": "http.response.start", "status": 200,
                       "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        gone = asyncio.Event()
        watcher = asyncio.create_task(_watch_disconnect(ex.receive, gone))
        loop = asyncio.get_running_loop()
        due = loop.time()
        try:
            for item in [*events, None]:
                if gone.is_set():
                    return False
                data = b"[DONE]" if item is None else json.dumps(item).encode()
                await ex.send({"type": "http.response.body", "body": b"data: " + data + b"\n\n", "more_body": True})
                if self.options.chunk_delay and item is not None and item["choices"]:
                    # the usage chunk follows the last one at once, as OpenAI's does
                    due += self.options.chunk_delay
                    await _sleep_unless(gone, due - loop.time())
            await ex.send({"type": "http.response.body", "body": b"", "more_body": False})
            return not gone.is_set()
        finally:
            watcher.cancel()


async def _watch_disconnect(receive: Receive, gone: asyncio.Event) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


async def _sleep_unless(event: asyncio.Event, seconds: float) -> None:
    if seconds <= 0:
        return
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        pass


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _envelope(payload: dict[str, Any], chat: bool, *, stream: bool) -> dict[str, Any]:
    kind = ("chat.completion.chunk" if stream else "chat.completion") if chat else "text_completion"
    prefix = "chatcmpl" if chat else "cmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex[:16]}", "object": kind, "created": int(time.time()),
            "model": str(payload.get("model", "echo"))}


def _chat_delta(index: int, delta: dict[str, Any] | None, finish: str | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta or {}, "finish_reason": finish, "logprobs": None}


def _text_delta(index: int, text: str, finish: str | None = None) -> dict[str, Any]:
    return {"index": index, "text": text, "finish_reason": finish, "logprobs": None}


def _count_usage(events: list[dict[str, Any]], prompt_tokens: int) -> None:
    """vLLM's ``continuous_usage_stats``: each chunk carries the usage so far (a piece is a token)."""
    generated = 0
    for event in events:
        generated += sum(1 for c in event["choices"] if (c.get("delta") or {}).get("content") or c.get("text"))
        event["usage"] = _usage(prompt_tokens, generated)


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _embeddings(payload: dict[str, Any]) -> dict[str, Any]:
    """One vector per input (``dimensions`` long, default 8) made from the input's words: the same
    text always gives the same vector; usage counts words (or token ids) as tokens."""
    raw = payload.get("input")
    inputs = [raw] if isinstance(raw, str) or (isinstance(raw, list) and raw and isinstance(raw[0], int)) else raw
    width = int(payload.get("dimensions") or 8)
    data, tokens = [], 0
    for i, item in enumerate(inputs or []):
        words = item.split() if isinstance(item, str) else [str(t) for t in item]
        tokens += len(words)
        seed = sum(ord(c) * (k + 1) for k, c in enumerate(" ".join(words)))
        vector = [((seed * (j + 3)) % 1000) / 1000.0 for j in range(width)]
        if payload.get("encoding_format") == "base64":
            import base64
            import struct

            data.append({"object": "embedding", "index": i,
                         "embedding": base64.b64encode(struct.pack(f"<{width}f", *vector)).decode()})
        else:
            data.append({"object": "embedding", "index": i, "embedding": vector})
    return {"object": "list", "data": data, "model": payload.get("model", "echo"),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def error_body(message: str, code: str | None = None, type_: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


async def send_json(ex: Exchange, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
    raw = json.dumps(body).encode()
    extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await ex.send({"type": "http.response.start", "status": status,
                   "headers": [(b"content-type", b"application/json"), *extra]})
    await ex.send({"type": "http.response.body", "body": raw, "more_body": False})


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="OpenAI-compatible echo upstream for local development.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--chunk-delay", type=float, default=0.0, help="Seconds between stream chunks (a fixed clock).")
    parser.add_argument("--latency", type=float, default=0.0, help="Seconds before the response headers.")
    parser.add_argument("--output-words", type=int, default=None, help="Answer with this many words (chunks).")
    args = parser.parse_args()
    app = EchoUpstream(EchoOptions(latency=args.latency, chunk_delay=args.chunk_delay, output_words=args.output_words))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", lifespan="on", access_log=False,
                loop="uvloop", http="httptools")


if __name__ == "__main__":
    main()
