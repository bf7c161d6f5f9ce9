"""A loopback upstream that serves OpenAI's Responses API (``POST /v1/responses``), streaming and not,
answering with fields and events the gateway does not model (a reasoning item, a vendor field, a
reasoning-summary event), echoing the last user text, and recording every body it received;
``answer_headers`` go in the head of every answer. A ``background: true`` request is answered
``queued`` and held (``held``) until ``finish`` (streamed, its stream waits before its last event
until it no longer runs, finished or cancelled, and that event tells it as it then stands: a
``response.cancelled`` for one cancelled); ``GET /v1/responses/{id}``, ``POST .../cancel``
and ``DELETE`` reach a held one (any other id is a 404), each recorded in ``reached``, its query in
``queries`` (all answered ``reach_failure``, when set). ``GET ...?stream=true`` streams a held one's
events (those after ``starting_after``, if given), numbered as its ``POST`` stream numbers them, the
last waiting as there (with ``streams_as_json`` set, it answers as it does without ``stream``).
``POST /v1/responses/input_tokens`` answers ``INPUT_TOKENS`` and ``POST /v1/responses/compact`` a
compacted response (the input's user messages and a compaction item, with ``USAGE``), each body
recorded in ``counted`` and ``compacted``. The ``POST`` stream of one for ``BREAK_PART_WAY`` breaks
part-way; it runs on (``event_seconds``: a pause before each event of such a stream)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import time
from collections.abc import Awaitable
from typing import Any
from urllib.parse import parse_qs

from backends.dev.echo_server import EchoOptions, EchoUpstream, Exchange, send_json
from tests.support.fake_upstream import served_tier, with_headers
from tests.support.servers import OnLoopback

SEARCH = "search:"  # an input that begins so is answered with TOOL_CALLS after the message
# two web searches and a file search (the provider's tools), and a call of the client's own function
TOOL_CALLS: list[dict[str, Any]] = [
    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "a"}},
    {"type": "web_search_call", "id": "ws_2", "status": "completed", "action": {"type": "search", "query": "b"}},
    {"type": "file_search_call", "id": "fs_1", "status": "completed", "queries": ["c"], "results": None},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}",
     "status": "completed"},
]
HOLD_SECONDS = 30.0  # the longest a held streamed background response waits for ``finish``
INPUT_TOKENS = 1234  # what ``POST /v1/responses/input_tokens`` answers
USAGE = {"input_tokens": 7, "input_tokens_details": {"cached_tokens": 2}, "output_tokens": 3,
         "output_tokens_details": {"reasoning_tokens": 1}, "total_tokens": 10}


def _last_user_text(body: dict[str, Any]) -> str:
    given = body.get("input")
    if isinstance(given, str):
        return given
    for item in reversed(given or []):
        if item.get("role") == "user":
            content = item.get("content")
            return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
    return ""


# A streamed background input whose stream's connection breaks after its first ``BROKEN_AFTER``
# events (the application fails, the server drops the connection); the response runs on, held.
BREAK_PART_WAY = "break part-way"
BROKEN_AFTER = 5

# An input answered as a failure whose message echoes the request's authorization header (as some
# upstreams and proxies in front of them do).
ECHO_FAILURE = "fail, echoing my headers"
ERROR_PART_WAY = "error part-way"  # a streamed input answered with a few events, then its own ``error`` event
ERROR_THEN_FAILED = "error, then failed"  # ... and then ``response.failed``
UPSTREAM_ERROR = {"type": "error", "code": "server_error", "message": "boom", "param": None}
# An input answered with an ``{"error": ...}`` object echoing it: the whole answer (with status 200), or
# an event of a stream after its first.
ECHO_ERROR_OBJECT = "an error object, echoing my headers"


class FakeResponsesUpstream(EchoUpstream, OnLoopback):
    def __init__(self) -> None:
        super().__init__(EchoOptions())
        self.received: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self.answer_headers: dict[str, str] = {}  # added to the head of every answer
        self.id_prefix = "resp_up_"  # of the response ids it mints (a proxy's are long)
        self.held: dict[str, dict[str, Any]] = {}  # background responses, as a GET answers them now
        self._finals: dict[str, dict[str, Any]] = {}  # what each becomes when finished
        self._streams: dict[str, list[dict[str, Any]]] = {}  # each one's events, but its last
        self.reached: list[tuple[str, str]] = []  # (method, path) of every request for a held response
        self.queries: list[str] = []  # the query string of each of them
        self.reach_failure: int | None = None  # when set, the HTTP status every such request is answered with
        self.event_seconds = 0.0  # the pause before each event of a background response's stream
        self.streams_as_json = False  # when set, a held one's stream is asked for in vain: its JSON answers
        self.counted: list[dict[str, Any]] = []  # the bodies of ``POST /v1/responses/input_tokens``
        self.compacted: list[dict[str, Any]] = []  # the bodies of ``POST /v1/responses/compact``

    def finish(self, response_id: str) -> None:
        """The background response ``response_id`` is completed (with ``USAGE``)."""
        self.held[response_id] = self._finals[response_id]

    def response(self, body: dict[str, Any], status: str = "completed") -> dict[str, Any]:
        n = next(self._ids)
        text = _last_user_text(body)
        return {
            "id": f"{self.id_prefix}{n}", "object": "response", "created_at": 1_700_000_000, "status": status,
            "model": body.get("model"), "service_tier": served_tier(body), "x_vendor_field": {"kept": True},
            "previous_response_id": body.get("previous_response_id"),
            "output": [
                {"type": "reasoning", "id": f"rs_{n}", "summary": [], "encrypted_content": "opaque"},
                {"type": "message", "id": f"msg_up_{n}", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": text, "annotations": []}]},
                *(TOOL_CALLS if text.startswith(SEARCH) else ()),
            ],
            "usage": USAGE if status != "in_progress" else None,
        }

    async def handle(self, ex: Exchange) -> None:
        if ex.method == "POST" and ex.path.endswith(("/responses/input_tokens", "/responses/compact")):
            return await self._count_or_compact(ex)
        if "/responses/" in ex.path:
            return await self._reach(ex)
        if ex.method != "POST" or not ex.path.endswith("/responses"):
            return await super().handle(ex)
        body = ex.json()
        self.received.append(body)
        if self.answer_headers:
            ex = dataclasses.replace(ex, send=with_headers(ex.send, self.answer_headers))
        final = self.response(body)
        if body.get("background") and not body.get("stream"):
            self._hold(final, final | {"status": "queued", "output": [], "usage": None})
            return await send_json(ex, 200, self.held[final["id"]])
        if _last_user_text(body) == ECHO_ERROR_OBJECT:
            return await self._error_object(ex, body, {"error": {
                "type": "server_error", "message": f"refused {ex.headers.get('authorization')}"}})
        if _last_user_text(body) == ECHO_FAILURE:
            final |= {"status": "failed", "error": {"code": "server_error",
                                                    "message": f"refused {ex.headers.get('authorization')}"}}
        if not body.get("stream"):
            return await send_json(ex, 200, final)
        events = _events(final)
        if body.get("background"):  # held: the last event waits for ``finish``
            self._hold(final, events[0]["response"])
        if (text := _last_user_text(body)) in (ERROR_PART_WAY, ERROR_THEN_FAILED):
            failed = final | {"status": "failed", "error": {"code": "server_error", "message": "boom"}}
            ending = [{"type": "response.failed", "response": failed}] if text == ERROR_THEN_FAILED else []
            return await send_events(ex, [*events[:BROKEN_AFTER], UPSTREAM_ERROR, *ending])
        if body.get("background"):
            if _last_user_text(body) == BREAK_PART_WAY:
                await send_events(ex, events[:BROKEN_AFTER], end=False)
                raise ConnectionAbortedError("the stream's connection breaks; its response runs on")
            return await send_events(ex, events[:-1], last=self._ended(final["id"]), pause=self.event_seconds)
        await send_events(ex, events)

    async def _count_or_compact(self, ex: Exchange) -> None:
        body = ex.json()
        if ex.path.endswith("/input_tokens"):
            self.counted.append(body)
            return await send_json(ex, 200, {"object": "response.input_tokens", "input_tokens": INPUT_TOKENS})
        self.compacted.append(body)
        given = body.get("input")
        items = [{"role": "user", "content": given}] if isinstance(given, str) else given or []
        kept = [{"type": "message", "id": f"msg_c{i}", "role": "user", "status": "completed",
                 "content": [{"type": "input_text", "text": _last_user_text({"input": [item]})}]}
                for i, item in enumerate(items) if item.get("role") == "user"]
        await send_json(ex, 200, {"id": f"cmp_{next(self._ids)}", "object": "response.compaction",
                                  "created_at": 1_700_000_000, "usage": USAGE, "output": [
                                      *kept, {"type": "compaction", "id": "cmp_item", "encrypted_content": "opaque"}]})

    def _hold(self, final: dict[str, Any], now: dict[str, Any]) -> None:
        """A background response, ``now`` as it stands, ``final`` once finished."""
        self._finals[final["id"]], self.held[final["id"]] = final, now
        self._streams[final["id"]] = _events(final)[:-1]

    async def _ended(self, response_id: str) -> dict[str, Any] | None:
        """The last event of held ``response_id``'s stream, once it is no longer running; None (the
        stream ends without it) after ``HOLD_SECONDS``."""
        deadline = time.monotonic() + HOLD_SECONDS
        while (held := self.held.get(response_id, {})).get("status") in ("queued", "in_progress"):
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.02)
        return {"type": f"response.{held.get('status')}", "response": held}

    async def _reach(self, ex: Exchange) -> None:
        self.reached.append((ex.method, ex.path))
        self.queries.append(ex.query)
        response_id, _, action = ex.path.split("/responses/", 1)[1].partition("/")
        held = self.held.get(response_id)
        if self.reach_failure is not None:
            return await send_json(ex, self.reach_failure, {"error": {"type": "server_error", "message": "down"}})
        if held is None:
            return await send_json(ex, 404, {"error": {"type": "invalid_request_error", "code": "not_found",
                                                       "message": f"No response with id '{response_id}' found."}})
        asked = parse_qs(ex.query)
        if ex.method == "GET" and asked.get("stream") == ["true"] and not self.streams_as_json:
            after = int(asked.get("starting_after", ["-1"])[0])
            return await send_events(ex, self._streams[response_id], last=self._ended(response_id), after=after)
        if ex.method == "DELETE":
            del self.held[response_id]
            return await send_json(ex, 200, {"id": response_id, "object": "response", "deleted": True})
        if action == "cancel" and held["status"] in ("queued", "in_progress"):
            held = self.held[response_id] = held | {"status": "cancelled"}
        await send_json(ex, 200, held)

    async def _error_object(self, ex: Exchange, body: dict[str, Any], error: dict[str, Any]) -> None:
        if not body.get("stream"):
            return await send_json(ex, 200, error)
        start = self.response(body, "in_progress") | {"output": []}
        await ex.send({"type": "http.response.start", "status": 200,
                       "headers": [(b"content-type", b"text/event-stream")]})
        for data in ({"type": "response.created", "response": start, "sequence_number": 0}, error):
            await ex.send({"type": "http.response.body", "more_body": True,
                           "body": f"data: {json.dumps(data)}\n\n".encode()})
        await ex.send({"type": "http.response.body", "body": b"", "more_body": False})


def _events(final: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of a stream answering ``final``."""
    start = final | {"status": "in_progress", "output": [], "usage": None}
    text = final["output"][1]["content"][0]["text"]
    return [
        {"type": "response.created", "response": start},
        {"type": "response.in_progress", "response": start},
        {"type": "response.output_item.added", "output_index": 0, "item": final["output"][0]},
        {"type": "response.reasoning_summary_text.delta", "item_id": final["output"][0]["id"], "delta": "hm"},
        {"type": "response.output_item.added", "output_index": 1,
         "item": final["output"][1] | {"status": "in_progress", "content": []}},
        *({"type": "response.output_text.delta", "item_id": final["output"][1]["id"], "output_index": 1,
           "content_index": 0, "delta": word} for word in text.split(" ")),
        {"type": "response.output_text.done", "item_id": final["output"][1]["id"], "output_index": 1,
         "content_index": 0, "text": text},
        *({"type": f"response.output_item.{step}", "output_index": i, "item": item}  # TOOL_CALLS, if any
          for i, item in enumerate(final["output"][2:], 2) for step in ("added", "done")),
        {"type": f"response.{final['status']}", "response": final},
    ]


async def send_events(ex: Exchange, events: list[dict[str, Any]],
                      last: Awaitable[dict[str, Any] | None] | None = None, after: int = -1, end: bool = True,
                      pause: float = 0.0) -> None:
    """A 200 event stream of ``events``, each named by its type and numbered in order (``pause``
    seconds before each), then the one ``last`` gives, if any; those numbered up to ``after`` left
    out; the body not ended unless ``end``."""
    await ex.send({"type": "http.response.start", "status": 200,
                   "headers": [(b"content-type", b"text/event-stream")]})
    for seq, event in enumerate(events):
        if seq > after:
            if pause:
                await asyncio.sleep(pause)
            await _send_event(ex, event, seq)
    if last is not None and (ending := await last) is not None and len(events) > after:
        await _send_event(ex, ending, len(events))
    if end:
        await ex.send({"type": "http.response.body", "body": b"", "more_body": False})


async def _send_event(ex: Exchange, event: dict[str, Any], seq: int) -> None:
    data = json.dumps(event | {"sequence_number": seq})
    await ex.send({"type": "http.response.body", "more_body": True,
                   "body": f"event: {event['type']}\ndata: {data}\n\n".encode()})


FAIL_PART_WAY = "fail part-way"  # a streamed input the upstream below fails after a few events
SEARCH_FAIL = "search, then fail part-way"  # ... after a web search made


class FailingResponsesUpstream(FakeResponsesUpstream):
    """The Responses upstream, but a stream for ``FAIL_PART_WAY`` ends with an ``error`` event (for
    ``SEARCH_FAIL`` after a web search's items)."""

    async def handle(self, ex: Exchange) -> None:
        body = ex.json() if ex.method == "POST" else None
        if not (isinstance(body, dict) and body.get("stream") and body.get("input") in (FAIL_PART_WAY, SEARCH_FAIL)):
            return await super().handle(ex)
        self.received.append(body)
        start = self.response(body, "in_progress") | {"output": []}
        search = {"type": "web_search_call", "id": "ws_f", "status": "in_progress"}
        searched = [{"type": "response.output_item.added", "output_index": 0, "item": search},
                    {"type": "response.output_item.done", "output_index": 0,
                     "item": search | {"status": "completed", "action": {"type": "search", "query": "q"}}}]
        events = [{"type": "response.created", "response": start}, {"type": "response.in_progress", "response": start},
                  *(searched if body["input"] == SEARCH_FAIL else ()),
                  {"type": "response.output_item.added", "output_index": 0,
                   "item": {"type": "message", "id": "msg_f", "role": "assistant", "status": "in_progress",
                            "content": []}},
                  {"type": "error", "code": "server_error", "message": "the upstream broke", "param": None}]
        await send_events(ex, events)
