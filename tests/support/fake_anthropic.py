"""A loopback server speaking Anthropic's Messages API (``POST /v1/messages``), for tests.

It echoes the last user text (cut at the first of ``stop_sequences`` it contains, reported as
``stop_reason: stop_sequence``); when the request offers tools and the text starts with ``tool:``,
it answers with a ``tool_use`` block for the first tool instead; a ``tool_choice`` forcing a tool
is answered with a call of that tool, whose input is the JSON after ``json:`` in the text (else
``{"q": text}``). ``fail_mid_stream_next`` has the next stream fail after its first events with an
``event: error`` whose message echoes the request's headers (as some upstreams' do). Its usage reports 2 prompt tokens
read from the cache, ``CACHE_WRITE`` written to it per ``cache_control`` breakpoint (by TTL), and a
web search tool's ``max_uses`` searches. ``fail_next`` queues an HTTP status (its message's
``{headers}`` replaced by the request's); ``stop_reason`` forces
the answers' stop reason; ``answer_headers`` go in the head of every answer (as Anthropic's
rate-limit headers do); every request body is kept in ``received``. With thinking on, its answers
start with a signed thinking block, and, as Anthropic, it refuses (400) a conversation whose last
assistant turn has tool_use blocks but does not start with a signed thinking or redacted thinking block,
and a final assistant message whose content ends in whitespace. ``SilentAnthropic`` streams a message's
start, then nothing until the client leaves (a model thinking).
"""

from __future__ import annotations

import json
import threading
from collections import deque
from typing import Any

from backends.dev.echo_server import Exchange, pieces, read_body, send_json
from tests.support.fake_upstream import with_headers
from tests.support.servers import OnLoopback


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text")


async def send_events(ex: Exchange, events: list[tuple[str, dict[str, Any]]], end: bool = True) -> None:
    """Answer with an event stream of ``events`` ((event type, data) pairs), then end the body (if ``end``)."""
    await ex.send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for kind, data in events:
        raw = f"event: {kind}\ndata: {json.dumps({'type': kind} | data)}\n\n".encode()
        await ex.send({"type": "http.response.body", "body": raw, "more_body": True})
    if end:
        await ex.send({"type": "http.response.body", "body": b"", "more_body": False})


CACHE_WRITE = 8  # prompt tokens reported written to the cache per cache_control breakpoint


def _cache_writes(payload: dict[str, Any]) -> dict[str, int]:
    """Tokens written to the prompt cache by TTL ("5m", "1h"): CACHE_WRITE per breakpoint."""
    written: dict[str, int] = {}
    stack: list[Any] = [payload.get("system"), payload.get("messages"), payload.get("tools")]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            if isinstance(marker := item.get("cache_control"), dict):
                ttl = marker.get("ttl", "5m")
                written[ttl] = written.get(ttl, 0) + CACHE_WRITE
            stack.extend(v for k, v in item.items() if k != "cache_control")
    return written


def _unsigned_tool_turn(payload: dict[str, Any]) -> str | None:
    """Anthropic's rule with thinking on: the last assistant turn, if it has tool_use blocks, starts
    with the thinking (signed) or redacted thinking it came with. Its refusal's message, or None."""
    if (payload.get("thinking") or {}).get("type") != "enabled":
        return None
    turns = [m["content"] for m in payload["messages"] if m["role"] == "assistant" and isinstance(m["content"], list)]
    if not turns or not any(b.get("type") == "tool_use" for b in turns[-1]):
        return None
    first = turns[-1][0]
    if (first.get("type") == "thinking" and first.get("signature")) or \
            (first.get("type") == "redacted_thinking" and first.get("data")):
        return None
    return (f"messages: Expected `thinking` or `redacted_thinking`, but found `{first.get('type')}`. When "
            "`thinking` is enabled, a final `assistant` message must start with a thinking block")


def _trailing_whitespace(payload: dict[str, Any]) -> str | None:
    """Anthropic's rule: a final assistant message (a prefill) does not end in whitespace. Its refusal's
    message, or None."""
    last = payload["messages"][-1] if payload.get("messages") else {}
    content = last.get("content")
    text = content if isinstance(content, str) else (content[-1].get("text") if content else None)
    if last.get("role") == "assistant" and isinstance(text, str) and text != text.rstrip():
        return "messages: final assistant content cannot end with trailing whitespace"
    return None


class FakeAnthropic(OnLoopback):
    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.faults: deque[tuple[int, dict[str, Any]]] = deque()
        self.stream_faults: deque[str] = deque()  # error types of the next streams' mid-stream error events
        self.stop_reason: str | None = None  # set: every answer's stop_reason
        self.answer_headers: dict[str, str] = {}  # added to the head of every answer

    def fail_next(self, status: int, error_type: str = "api_error", message: str = "injected") -> None:
        self.faults.append((status, {"type": "error", "error": {"type": error_type, "message": message}}))

    def fail_mid_stream_next(self, error_type: str = "api_error") -> None:
        self.stream_faults.append(error_type)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        ex = Exchange(scope["method"], scope["path"], headers, body, receive,
                      with_headers(send, self.answer_headers) if self.answer_headers else send)
        if ex.method == "GET":
            return await send_json(ex, 200, {"data": [{"id": "claude-test", "type": "model"}]})
        payload = json.loads(body)
        self.received.append(payload)
        self.headers.append(headers)
        if self.faults:
            status, error = self.faults.popleft()
            error["error"]["message"] = error["error"]["message"].replace("{headers}", str(headers))
            return await send_json(ex, status, error)
        if payload.get("stream") and self.stream_faults:
            error = {"type": self.stream_faults.popleft(), "message": f"refused, you sent {headers}"}
            return await send_events(ex, [("message_start", {"message": {
                "id": "msg_f", "type": "message", "role": "assistant", "model": payload["model"], "content": [],
                "usage": {"input_tokens": 1, "output_tokens": 1}}}), ("error", {"error": error})])
        if ex.path.endswith("/count_tokens"):
            return await send_json(ex, 200, {"input_tokens": sum(len(pieces(_text(m["content"])))
                                                                 for m in payload["messages"])})
        if refused := _unsigned_tool_turn(payload) or _trailing_whitespace(payload):
            return await send_json(ex, 400, {"type": "error", "error": {"type": "invalid_request_error",
                                                                        "message": refused}})
        blocks, stop = self._answer(payload)
        matched = self._stop_sequence(payload, blocks)
        if payload.get("thinking"):  # extended thinking: a thinking block first
            blocks.insert(0, {"type": "thinking", "thinking": "let me think", "signature": "sig-1"})
        stop = self.stop_reason or ("stop_sequence" if matched else stop)
        usage = {"input_tokens": sum(len(pieces(_text(m["content"]))) for m in payload["messages"]),
                 "output_tokens": sum(len(pieces(b.get("text", ""))) or 1 for b in blocks),
                 "cache_read_input_tokens": 2}
        searches = sum(t.get("max_uses", 1) for t in payload.get("tools") or []
                       if str(t.get("type", "")).startswith("web_search"))
        if searches:  # as many searches as the tool allows
            usage["server_tool_use"] = {"web_search_requests": searches, "web_fetch_requests": 0}
        if written := _cache_writes(payload):  # CACHE_WRITE tokens for each cache_control breakpoint
            usage["cache_creation_input_tokens"] = sum(written.values())
            usage["cache_creation"] = {f"ephemeral_{ttl}_input_tokens": n for ttl, n in written.items()}
        if "service_tier" in payload:  # "auto": served at the priority tier; "standard_only": the standard one
            usage["service_tier"] = "priority" if payload["service_tier"] == "auto" else "standard"
        if not payload.get("stream"):
            return await send_json(ex, 200, {"id": "msg_1", "type": "message", "role": "assistant",
                                             "model": payload["model"], "content": blocks, "stop_reason": stop,
                                             "stop_sequence": matched, "usage": usage})
        await self._stream(ex, payload, blocks, stop, usage, matched)

    @staticmethod
    def _stop_sequence(payload: dict[str, Any], blocks: list[dict[str, Any]]) -> str | None:
        for block in blocks:
            text = block.get("text", "")
            hits = [(text.find(s), s) for s in payload.get("stop_sequences") or [] if s in text]
            if hits:
                at, matched = min(hits)
                block["text"] = text[:at]
                return matched
        return None

    def _answer(self, payload: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
        text = _text(payload["messages"][-1]["content"]) if payload["messages"] else ""
        forced = payload.get("tool_choice") or {}
        if forced.get("type") == "tool":  # as Anthropic: a forced call, no text before it
            arguments = json.loads(text[5:]) if text.startswith("json:") else {"q": text}
            return [{"type": "tool_use", "id": "toolu_1", "name": forced["name"], "input": arguments}], "tool_use"
        if payload.get("tools") and text.startswith("tool:"):
            tool = payload["tools"][0]["name"]
            return [{"type": "tool_use", "id": "toolu_1", "name": tool, "input": {"q": text[5:]}}], "tool_use"
        words = pieces(text) or ["(empty)"]
        limit = payload.get("max_tokens", 4096)
        stop = "max_tokens" if len(words) > limit else "end_turn"
        return [{"type": "text", "text": "".join(words[:limit])}], stop

    async def _stream(self, ex: Exchange, payload: dict[str, Any], blocks: list[dict[str, Any]], stop: str,
                      usage: dict[str, Any], matched: str | None = None) -> None:
        await ex.send({"type": "http.response.start", "status": 200,
                       "headers": [(b"content-type", b"text/event-stream")]})

        async def event(kind: str, data: dict[str, Any]) -> None:
            raw = f"event: {kind}\ndata: {json.dumps({'type': kind} | data)}\n\n".encode()
            await ex.send({"type": "http.response.body", "body": raw, "more_body": True})

        cache = {k: v for k, v in usage.items() if k.startswith(("cache_", "service_tier"))}  # known at the start
        await event("message_start", {"message": {"id": "msg_s", "type": "message", "role": "assistant",
                                                  "model": payload["model"], "content": [],
                                                  "usage": {"input_tokens": usage["input_tokens"],
                                                            "output_tokens": 1} | cache}})
        await event("ping", {})
        for index, block in enumerate(blocks):
            if block["type"] == "thinking":
                await event("content_block_start", {"index": index, "content_block": {
                    "type": "thinking", "thinking": "", "signature": ""}})
                await event("content_block_delta", {"index": index, "delta": {"type": "thinking_delta",
                                                                              "thinking": block["thinking"]}})
                await event("content_block_delta", {"index": index, "delta": {"type": "signature_delta",
                                                                              "signature": block["signature"]}})
            elif block["type"] == "text":
                await event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
                for piece in pieces(block["text"]):
                    await event("content_block_delta", {"index": index,
                                                        "delta": {"type": "text_delta", "text": piece}})
            else:
                await event("content_block_start", {"index": index, "content_block": {
                    "type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}})
                arguments = json.dumps(block["input"])
                for part in (arguments[: len(arguments) // 2], arguments[len(arguments) // 2:]):
                    await event("content_block_delta", {"index": index,
                                                        "delta": {"type": "input_json_delta", "partial_json": part}})
            await event("content_block_stop", {"index": index})
        await event(
            "message_delta",
            {"delta": {"stop_reason": stop, "stop_sequence": matched},
             "usage": {"output_tokens": usage["output_tokens"]}
             | ({"server_tool_use": usage["server_tool_use"]} if "server_tool_use" in usage else {})},
        )
        await event("message_stop", {})
        await ex.send({"type": "http.response.body", "body": b"", "more_body": False})


class ScriptedAnthropic(FakeAnthropic):
    """Answers the next request with ``script``: a list of stream events, or (status, body); every
    other request as ``FakeAnthropic`` does."""

    def __init__(self) -> None:
        super().__init__()
        self.script: Any = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.script is None or scope["type"] != "http":
            return await super().__call__(scope, receive, send)
        script, self.script = self.script, None
        while (await receive()).get("more_body"):
            pass
        ex = Exchange(scope["method"], scope["path"], {}, b"", receive, send)
        if isinstance(script, list):
            return await send_events(ex, script)
        await send_json(ex, *script)


SILENT_START: list[tuple[str, dict[str, Any]]] = [
    ("message_start", {"message": {"id": "msg_quiet", "type": "message", "role": "assistant", "model": "claude-test",
                                   "content": [], "usage": {"input_tokens": 5, "output_tokens": 1}}}),
    ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
    ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Let me think"}}),
]


class SilentAnthropic(FakeAnthropic):
    """Streams a message's start and its first text, then says nothing until the client leaves
    (``wait_left``)."""

    def __init__(self) -> None:
        super().__init__()
        self._left = threading.Semaphore(0)

    def wait_left(self, streams: int, timeout: float = 10.0) -> bool:
        """Whether the clients of ``streams`` streams left within ``timeout`` seconds."""
        return all(self._left.acquire(timeout=timeout) for _ in range(streams))

    async def _stream(self, ex: Exchange, payload: dict[str, Any], blocks: list[dict[str, Any]], stop: str,
                      usage: dict[str, Any], matched: str | None = None) -> None:
        await send_events(ex, SILENT_START, end=False)
        while (await ex.receive())["type"] != "http.disconnect":
            pass
        self._left.release()
