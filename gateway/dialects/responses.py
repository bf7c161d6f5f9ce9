"""OpenAI's Responses API answers at the gateway's edge: chat answers converted back to a
``response`` object (``response_object``) or the Responses event stream (``ResponsesEvents``), under
an id the gateway mints (an upstream's completion ids need not be unique); a stream that fails part
way ends with ``error`` and ``response.failed``. A per-call ``responses_dialect`` hands every finished
response object to a callback, so the controller can keep it (``gateway.stored_responses``); from an
upstream that serves Responses itself the answer and its events are relayed as they came (``RelayedResponse``,
``RelayedEvents``, its own ``error`` event too; a held background one's cut short says it runs on:
``gateway.dialects.responses_resume``). An answer's thinking blocks (``thinking_blocks``) go in its reasoning item's
``encrypted_content`` where asked for, and always in the output handed to the callback for a stored conversation
(``responses_reasoning.kept_output``). Requests: ``gateway.dialects.responses_request``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from backends.base import Meter, RelayedFailure
from backends.function_tools import answered_function, check_delta
from backends.openai_wire import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    PromptTokensDetails,
    Usage,
    reasoning_text,
    relayed,
)
from backends.responses_wire import FINAL_EVENTS, RelayedResponse, ResponsesEvent
from backends.tools_wire import ToolCallDelta
from backends.turn_thinking import Blocks, placed_thinking, thinking_before
from gateway.dialects import Dialect
from gateway.dialects.responses_params import responses_param
from gateway.dialects.responses_reasoning import (
    TRANSLATED_REASONING,
    answer_blocks,
    joined_blocks,
    kept_output,
    with_encrypted_content,
)
from gateway.dialects.responses_resume import runs_on, still_running
from gateway.dialects.tool_call_slots import CallSlots, own_call_id
from gateway.errors import ApiError
from gateway.streaming import KEEP_ALIVE

# Gets a finished response (as the client gets it) and its output as a stored conversation keeps it.
OnFinal = Callable[[dict[str, Any], list[dict[str, Any]]], None]


def _usage(usage: Any, meter: Meter | None = None, reasoning: int = 0) -> dict[str, Any]:
    """A response's ``usage``: the provider's, else (it reported none, or not every count) what was
    metered (an estimate where it reported none), so the answer always says what the usage record holds."""
    if isinstance(usage, Usage) and (meter is None or meter.exact):
        details = usage.prompt_tokens_details
        cached = details.cached_tokens if isinstance(details, PromptTokensDetails) else 0
        prompt, completion = usage.prompt_tokens, usage.completion_tokens
    elif meter is not None:
        prompt, completion, cached = meter.prompt_tokens, meter.completion_tokens, meter.cached_tokens
    else:
        prompt = completion = cached = 0
    return {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion,
            "input_tokens_details": {"cached_tokens": cached or 0},
            "output_tokens_details": {"reasoning_tokens": reasoning}}


def _reasoning_tokens(answer: Any) -> int:
    """An answer's (or usage chunk's) ``usage.completion_tokens_details.reasoning_tokens`` as it came (0: none)."""
    raw = (relayed(answer) or {}).get("usage")
    try:
        usage = msgspec.json.decode(raw) if raw is not None else None
    except msgspec.DecodeError:
        return 0
    details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
    tokens = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return tokens if isinstance(tokens, int) else 0


# chat's finish reasons that end a response short, and the reason a response object gives
_API = "the Responses API served by chat completions"
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def _response(rid: str, model: str, status: str, output: list[dict[str, Any]], usage: Any,
              incomplete: str | None = None, extra: dict[str, Any] | None = None,
              created_at: int | None = None) -> dict[str, Any]:
    return {"id": rid, "object": "response", "created_at": created_at or int(time.time()), "status": status,
            "model": model, "output": output, "error": None,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "usage": usage} | (extra or {})


def new_response_id() -> str:
    """A response id of the gateway's own: unique whatever ids the upstream's completions carry."""
    return "resp_" + uuid.uuid4().hex


def _failure(error: ApiError) -> dict[str, Any]:
    """A response object's ``error`` for a response that failed with ``error``."""
    return {"code": error.code or error.type, "message": error.message}


# content part kinds (chat's ``content``, ``refusal`` and reasoning text) and the field holding their text;
# each streams as ``response.<kind>.delta`` and ``.done``
_PART_TEXT = {"output_text": "text", "refusal": "refusal", "reasoning_text": "text"}


def _part(kind: str, text: str) -> dict[str, Any]:
    if kind == "output_text":
        return {"type": kind, "text": text, "annotations": []}
    return {"type": kind, _PART_TEXT[kind]: text}


def _content_item(kind: str, parts: list[dict[str, Any]], status: str = "completed") -> dict[str, Any]:
    """A ``message`` or ``reasoning`` item holding ``parts``."""
    if kind == "reasoning":
        return {"type": "reasoning", "id": TRANSLATED_REASONING + uuid.uuid4().hex, "summary": [], "content": parts,
                "status": status}
    return {"type": "message", "id": "msg_" + uuid.uuid4().hex, "role": "assistant", "status": status,
            "content": parts}


def _thought(blocks: Blocks) -> str:
    """The text of thinking blocks, joined (a redacted block has none)."""
    return "".join(str(b.get("thinking") or "") for b in blocks if b.get("type") == "thinking")


def _output(message: AssistantMessage, encrypted: bool = False) -> tuple[list[dict[str, Any]], dict[str, Blocks]]:
    """A chat answer's message as output items, and each reasoning item's thinking blocks (by its id):
    its reasoning (first, as OpenAI gives it), its text and refusal, then its function calls; thinking
    the backend placed in the turn (``backends.turn_thinking``: Anthropic's, interleaved) as one
    reasoning item per group, in its place, as a stream gives it. A reasoning item has
    ``encrypted_content`` if ``encrypted``, its blocks in it; blocks with no text (a redacted block)
    make one too."""
    output: list[dict[str, Any]] = []
    kept: dict[str, Blocks] = {}

    def add_reasoning(text: str, blocks: Blocks) -> None:
        if text or blocks:
            item = _content_item("reasoning", [_part("reasoning_text", text)] if text else [])
            output.append(with_encrypted_content(item, blocks) if encrypted else item)
            if blocks:
                kept[item["id"]] = blocks

    calls = message.tool_calls or []
    if not placed_thinking(message):
        add_reasoning(reasoning_text(message), answer_blocks(message.thinking_blocks))
    for group in thinking_before(message, None, len(calls)):
        add_reasoning(_thought(group), group)
    parts = [_part(kind, text) for kind, text in (("output_text", message.content), ("refusal", message.refusal))
             if text]
    if parts:
        output.append(_content_item("message", parts))
    for k, call in enumerate(calls):
        for group in thinking_before(message, k, len(calls)):
            add_reasoning(_thought(group), group)
        function = answered_function(call, _API)
        output.append({"type": "function_call", "id": "fc_" + uuid.uuid4().hex, "call_id": own_call_id(call.id),
                       "name": function.name, "arguments": function.arguments, "status": "completed"})
    for group in thinking_before(message, len(calls), len(calls)):
        add_reasoning(_thought(group), group)
    return output, kept


def _answer(response: ChatCompletion, extra: dict[str, Any] | None, meter: Meter | None,
            encrypted: bool) -> tuple[dict[str, Any], dict[str, Blocks]]:
    """``response_object``'s response, and each of its reasoning items' thinking blocks (by id)."""
    choice = response.choices[0] if response.choices else None
    output, blocks = _output(choice.message, encrypted) if choice is not None else ([], {})
    incomplete = _INCOMPLETE.get(choice.finish_reason or "") if choice is not None else None
    if incomplete and output:
        output[-1]["status"] = "incomplete"  # the item being written when the answer was cut short
    return _response(new_response_id(), response.model, "incomplete" if incomplete else "completed", output,
                     _usage(response.usage, meter, _reasoning_tokens(response)), incomplete, extra), blocks


def response_object(response: ChatCompletion, extra: dict[str, Any] | None = None,
                    meter: Meter | None = None, encrypted: bool = False) -> dict[str, Any]:
    """A chat answer as a response object; one with no choice has no output (as its stream would).
    Its reasoning items carry ``encrypted_content`` if ``encrypted`` (``include`` asked for it)."""
    return _answer(response, extra, meter, encrypted)[0]


def _arguments_complete(item: dict[str, Any]) -> bool:
    """Whether a function call's arguments so far are a whole JSON document (no delta can follow)."""
    try:
        msgspec.json.decode(item["arguments"])
    except msgspec.DecodeError:
        return False
    return True


class ResponsesEvents:
    """OpenAI chat chunks -> the Responses event stream (a ``gateway.streaming.StreamEncoder``).

    As OpenAI streams them, one item at a time: an item is done before the next is added. An item
    begun while another is open (a function call whose deltas chat interleaves with an earlier
    call's) waits, its text kept, until the open one is over: a message or reasoning item as soon as
    another begins, a function call once its arguments are whole JSON (else at the end)."""

    keep_alive = KEEP_ALIVE  # a comment: no event, no sequence number

    def __init__(self, meter: Meter | None = None, extra: dict[str, Any] | None = None,
                 on_final: OnFinal | None = None, encrypted: bool = False) -> None:
        # ``meter`` as Dialect.stream passes it (usage comes in chunks); ``extra`` fields go on every
        # response object; ``on_final`` gets the finished response before its last event is sent;
        # ``encrypted``: a reasoning item gets ``encrypted_content`` when it is done.
        self._meter = meter
        self._encrypted = encrypted
        self._extra = extra
        self._on_final = on_final
        self._seq = 0
        self._id = new_response_id()  # the same in every event and in the stored response
        self._created = int(time.time())  # as is the creation time
        self._started = False
        self._model = ""
        self._output: list[dict[str, Any]] = []  # items added so far, in output order
        self._open: dict[str, Any] | None = None  # the last of them, while it is not done
        self._waiting: list[dict[str, Any]] = []  # items begun while another was open, in order
        self._slots = CallSlots()  # chat's tool call deltas placed in calls
        self._tools: dict[int, dict[str, Any]] = {}  # a call's number (``CallSlot.number``) -> its item
        self._blocks: dict[str, list[dict[str, Any]]] = {}  # a reasoning item's id -> its thinking blocks
        self._usage: Any = None
        self._reasoning = 0  # the provider's reasoning tokens, from its usage chunk
        self._finish: str | None = None

    def _event(self, kind: str, data: dict[str, Any]) -> bytes:
        body = {"type": kind, "sequence_number": self._seq} | data
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(body) + b"\n\n"

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        start = _response(self._id, self._model, "in_progress", [], None, extra=self._extra, created_at=self._created)
        return self._event("response.created", {"response": start}) + \
            self._event("response.in_progress", {"response": start})

    def chunk(self, chunk: ChatCompletionChunk) -> bytes:
        if not self._started:
            self._model = chunk.model
        out = self._start()
        if isinstance(chunk.usage, Usage):
            self._usage, self._reasoning = chunk.usage, _reasoning_tokens(chunk)
        for choice in chunk.choices[:1]:
            delta = choice.delta
            if isinstance(delta.thinking_blocks, list) and delta.thinking_blocks:
                out += self._thinking(delta.thinking_blocks)
            for item_kind, kind, text in (("reasoning", "reasoning_text", reasoning_text(delta)),
                                          ("message", "output_text", delta.content),
                                          ("message", "refusal", delta.refusal)):
                if isinstance(text, str) and text:
                    out += self._content_delta(item_kind, kind, text)
            for position, call in enumerate(delta.tool_calls or []):
                out += self._call_delta(call, position)
            out += self._advance()
            if choice.finish_reason:
                self._finish = choice.finish_reason
        return out

    def _call_delta(self, call: ToolCallDelta, position: int) -> bytes:
        """A chat tool call delta (``position``: its place in its chunk's list): a new function call where
        it starts one (``CallSlots``: a new ``index``, a new id, a later place), else more of its call's arguments."""
        check_delta(call, _API)
        function = call.function if isinstance(call.function, dict) else {}
        slot, new = self._slots.place(call, position)
        out = b""
        if new:
            self._tools[slot.number] = {
                "type": "function_call", "id": "fc_" + uuid.uuid4().hex, "call_id": slot.id,
                "name": function.get("name") or "", "arguments": "", "status": "in_progress"}
            out += self._begin(self._tools[slot.number])
        item = self._tools[slot.number]
        if arguments := function.get("arguments"):
            out += self._add_arguments(item, arguments)
        return out

    def _begin(self, item: dict[str, Any]) -> bytes:
        """A new item: added now if no other is open, else once those before it are done."""
        self._waiting.append(item)
        return self._advance()

    def _advance(self) -> bytes:
        """The open item done and the next waiting one added, for as long as the open one is over."""
        out = b""
        while self._waiting and (self._open is None or self._open["type"] != "function_call"
                                 or _arguments_complete(self._open)):
            if self._open is not None:
                out += self._close(self._open, "completed")
            out += self._add(self._waiting.pop(0))
        return out

    def _add(self, item: dict[str, Any]) -> bytes:
        """``item`` added to the output and opened: its text so far sent as one delta per part."""
        self._output.append(item)
        self._open = item
        if item["type"] == "function_call":
            arguments, item["arguments"] = item["arguments"], ""
            out = self._event("response.output_item.added", {"output_index": len(self._output) - 1, "item": item})
            return out + (self._add_arguments(item, arguments) if arguments else b"")
        parts, item["content"] = item["content"], []
        out = self._event("response.output_item.added", {"output_index": len(self._output) - 1, "item": item})
        for part in parts:
            out += self._add_text(item, part["type"], part[_PART_TEXT[part["type"]]])
        return out

    def _add_arguments(self, item: dict[str, Any], arguments: str) -> bytes:
        item["arguments"] += arguments
        if item is not self._open:
            return b""
        return self._event("response.function_call_arguments.delta", {
            "item_id": item["id"], "output_index": len(self._output) - 1, "delta": arguments})

    def _pending(self, item_kind: str) -> tuple[dict[str, Any], bytes]:
        """The latest message (or reasoning) item not yet done, else a new one begun (and its events)."""
        pending = ([self._open] if self._open is not None else []) + self._waiting
        item = next((i for i in reversed(pending) if i["type"] == item_kind), None)
        if item is not None:
            return item, b""
        item = _content_item(item_kind, [], "in_progress")
        return item, self._begin(item)

    def _content_delta(self, item_kind: str, kind: str, text: str) -> bytes:
        """``text`` added to the latest message (or reasoning) item not yet done, else to a new one."""
        item, out = self._pending(item_kind)
        return out + self._add_text(item, kind, text)

    def _thinking(self, pieces: list[Any]) -> bytes:
        """A delta's thinking block pieces joined into the blocks of the reasoning item being written."""
        item, out = self._pending("reasoning")
        joined_blocks(self._blocks.setdefault(item["id"], []), pieces)
        return out

    def _add_text(self, item: dict[str, Any], kind: str, text: str) -> bytes:
        """``text`` added to ``item``'s last part of ``kind``, a part of that kind opened first where
        the last is another; events sent for the open item only."""
        parts: list[dict[str, Any]] = item["content"]
        where = {"item_id": item["id"], "output_index": len(self._output) - 1, "content_index": len(parts) - 1}
        out = b""
        if not parts or parts[-1]["type"] != kind:
            parts.append(_part(kind, ""))
            where["content_index"] = len(parts) - 1
            if item is self._open:
                out += self._event("response.content_part.added", where | {"part": parts[-1]})
        parts[-1][_PART_TEXT[kind]] += text
        if item is not self._open:
            return b""
        return out + self._event(f"response.{kind}.delta",
                                 where | {"delta": text} | ({"logprobs": []} if kind == "output_text" else {}))

    def _close(self, item: dict[str, Any], status: str) -> bytes:
        """The open item done, with ``status``."""
        self._open = None
        item["status"] = status
        if self._encrypted and item["type"] == "reasoning":
            with_encrypted_content(item, self._blocks.get(item["id"]))
        index = len(self._output) - 1
        out = b""
        if item["type"] == "function_call":
            out += self._event("response.function_call_arguments.done", {
                "item_id": item["id"], "output_index": index, "arguments": item["arguments"]})
        for content_index, part in enumerate(item.get("content", [])):
            where = {"item_id": item["id"], "output_index": index, "content_index": content_index}
            field = _PART_TEXT[part["type"]]
            done = {field: part[field]} | ({"logprobs": []} if part["type"] == "output_text" else {})
            out += self._event(f"response.{part['type']}.done", where | done)
            out += self._event("response.content_part.done", where | {"part": part})
        return out + self._event("response.output_item.done", {"output_index": index, "item": item})

    def done(self) -> bytes:
        out = b""
        incomplete = _INCOMPLETE.get(self._finish or "")
        while self._open is not None or self._waiting:
            if self._open is not None:  # the item being written when the answer was cut short is incomplete
                out += self._close(self._open, "incomplete" if incomplete and not self._waiting else "completed")
            if self._waiting:
                out += self._add(self._waiting.pop(0))
        final = _response(self._id, self._model, "incomplete" if incomplete else "completed", self._output,
                          _usage(self._usage, self._meter, self._reasoning), incomplete, self._extra, self._created)
        if self._on_final is not None:
            self._on_final(final, kept_output(self._output, self._blocks))
        return out + self._event("response.incomplete" if incomplete else "response.completed", {"response": final})

    def error(self, error: ApiError) -> bytes:
        """A failure mid-stream: ``error``, then ``response.failed`` (its item incomplete; not stored)."""
        out = self._start() + self._error_event(error)
        if self._open is not None:
            self._open["status"] = "incomplete"
        failed = _response(self._id, self._model, "failed", self._output,
                           _usage(self._usage, self._meter, self._reasoning), extra=self._extra,
                           created_at=self._created)
        return out + self._event("response.failed", {"response": failed | {"error": _failure(error)}})

    def _error_event(self, error: ApiError) -> bytes:
        """OpenAI's ``error`` event: the error's code (``server_error``, ...), as the failed response has it."""
        return self._event("error", {"code": _failure(error)["code"], "message": error.message,
                                     "param": responses_param(error.param)})


def _relayed(response: dict[str, Any], model: str, extra: dict[str, Any]) -> dict[str, Any]:
    """An upstream's response object as it came, but for the model's name (and ``extra``)."""
    return response | {"model": model} | extra


class RelayedEvents(ResponsesEvents):
    """An upstream's Responses events as they came (the model named as the client did); a
    translated answer (a fallback to a chat-only deployment) is encoded as ``ResponsesEvents`` does."""

    def __init__(self, meter: Meter | None, extra: dict[str, Any], relayed_extra: dict[str, Any],
                 on_final: OnFinal, encrypted: bool = False, held: Callable[[], str | None] = lambda: None) -> None:
        # ``held``: the id of the response when the gateway now holds it (a background one the upstream runs on)
        super().__init__(meter, extra, on_final, encrypted)
        self._relayed_extra = relayed_extra
        self._held = held
        self._relaying = False
        self._response: dict[str, Any] | None = None  # the upstream's latest response object
        self._ended = False  # the upstream's last event (``FINAL_EVENTS``) came
        self._last_seq: int | None = None  # the sequence number of the last upstream event relayed

    def chunk(self, chunk: Any) -> bytes:
        if not isinstance(chunk, ResponsesEvent):
            return super().chunk(chunk)
        event = chunk.data
        kind = str(event.get("type", ""))
        if isinstance(response := event.get("response"), dict):
            event = event | {"response": _relayed(response, chunk.model, self._relayed_extra)}
            self._response = event["response"]
            self._ended = kind in FINAL_EVENTS
            if self._ended and self._on_final is not None:  # failed too: the upstream's, its id owned
                self._on_final(event["response"], event["response"].get("output") or [])
        if isinstance(seq := event.get("sequence_number"), int):
            self._seq, self._last_seq = seq + 1, seq  # events the gateway adds (a failure) follow the upstream's
        self._relaying = True
        return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(event) + b"\n\n"

    def done(self) -> bytes:
        """Nothing after the upstream's own last event, or after a stream of none (a resumed one with
        no event after ``starting_after``); a stream cut before it (the drain) ends with
        ``response.incomplete``: the response as last relayed, with the usage metered (one the
        gateway holds, with ``_still_running``)."""
        if not self._relaying:
            return super().done() if self._started else b""
        if self._ended:
            return b""
        if (held := self._held()) is not None:
            return self._still_running(held, None)
        if self._response is None:
            return b""
        cut = self._response | {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
                                "usage": _usage(None, self._meter)}
        return self._event("response.incomplete", {"response": cut})

    def error(self, error: ApiError) -> bytes:
        """A failure in the middle of an upstream's stream: the ``error`` event, then ``response.failed``
        with the upstream's response as last relayed (one the gateway holds, its upstream's connection
        broken, with ``_still_running``); nothing after the upstream's own ``error`` (``RelayedFailure``)."""
        if isinstance(error.cause, RelayedFailure):  # after it was relayed: the client has it
            return b""
        if not self._relaying:
            return super().error(error)
        if (held := self._held()) is not None and runs_on(error):
            return self._still_running(held, error)
        out = self._error_event(error)
        if self._response is not None:
            failed = self._response | {"status": "failed", "error": _failure(error)}
            out += self._event("response.failed", {"response": failed})
        return out

    def _still_running(self, response_id: str, error: ApiError | None) -> bytes:
        """The stream of ``response_id``, which the gateway holds, cut before its end by ``error``
        (None: the drain): one ``error`` event saying it runs on and how to resume it, no status claimed."""
        code, message = still_running(response_id, self._last_seq, error)
        return self._event("error", {"code": code, "message": message, "param": None})


def responses_dialect(extra: dict[str, Any], on_final: OnFinal, relayed_extra: dict[str, Any] | None = None,
                      encrypted: bool = False, held: Callable[[], str | None] = lambda: None) -> Dialect:
    """The Responses dialect for one call: ``extra`` fields on the response objects it builds
    (``relayed_extra`` on an upstream's own), every finished response handed to ``on_final`` (for
    ``store``, with its output as kept), and, if ``encrypted``, ``encrypted_content`` on the reasoning
    items it makes; ``held`` gives the id of a streamed background response once the gateway holds it
    (``RelayedEvents``)."""
    relayed_extra = relayed_extra or {}

    def unary(response: ChatCompletion | RelayedResponse, meter: Meter) -> bytes:
        if isinstance(response, RelayedResponse):
            final = _relayed(response.body, response.model, relayed_extra)
            kept = final.get("output") or []
        else:
            final, blocks = _answer(response, extra, meter, encrypted)
            kept = kept_output(final["output"], blocks)
        on_final(final, kept)  # any status: a relayed one unfinished or failed is kept, so its id is owned
        return msgspec.json.encode(final)

    return Dialect(unary=unary,
                   stream=lambda meter: RelayedEvents(meter, extra, relayed_extra, on_final, encrypted, held))
