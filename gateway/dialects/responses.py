"""OpenAI's Responses API answers at the gateway's edge: chat answers converted back to a
``response`` object (``response_object``) or the Responses event stream (``ResponsesEvents``), under
an id the gateway mints (an upstream's completion ids need not be unique); a stream that fails part
way ends with ``error`` and ``response.failed``. A per-call ``responses_dialect`` hands every finished
response object to a callback, so the controller can keep it (``gateway.stored_responses``); from an
upstream that serves Responses itself the answer and its events are relayed as they came
(``RelayedResponse``, ``RelayedEvents``). Requests: ``gateway.dialects.responses_request``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from backends.base import Meter
from backends.openai_wire import (
    ChatCompletion,
    ChatCompletionChunk,
    PromptTokensDetails,
    Usage,
    relayed,
)
from backends.responses_wire import RelayedResponse, ResponsesEvent
from gateway.dialects import Dialect
from gateway.dialects.responses_request import responses_param
from gateway.errors import ApiError


def _usage(usage: Any, meter: Meter | None = None, reasoning: int = 0) -> dict[str, Any]:
    """A response's ``usage``: the provider's, else what was metered (an estimate where it reported
    none), so the answer always says what the usage record holds."""
    if isinstance(usage, Usage):
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
    """An upstream answer's (or usage chunk's) ``usage.completion_tokens_details.reasoning_tokens``
    as it came (0 where it sent none)."""
    raw = (relayed(answer) or {}).get("usage")
    try:
        usage = msgspec.json.decode(raw) if raw is not None else None
    except msgspec.DecodeError:
        return 0
    details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
    tokens = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return tokens if isinstance(tokens, int) else 0


# chat's finish reasons that end a response short, and the reason a response object gives
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def _response(rid: str, model: str, status: str, output: list[dict[str, Any]], usage: Any,
              incomplete: str | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": rid, "object": "response", "created_at": int(time.time()), "status": status, "model": model,
            "output": output, "error": None,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "usage": usage} | (extra or {})


def new_response_id() -> str:
    """A response id of the gateway's own: unique whatever ids the upstream's completions carry."""
    return "resp_" + uuid.uuid4().hex


def _failure(error: ApiError) -> dict[str, Any]:
    """A response object's ``error`` for a response that failed with ``error``."""
    return {"code": error.code or error.type, "message": error.message}


# a message's content part kinds (chat's ``content`` and ``refusal``) and the field holding their text
_PART_TEXT = {"output_text": "text", "refusal": "refusal"}


def _part(kind: str, text: str) -> dict[str, Any]:
    return {"type": kind, "text": text, "annotations": []} if kind == "output_text" else {"type": kind, kind: text}


def _message_item(parts: list[dict[str, Any]], status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": "msg_" + uuid.uuid4().hex, "role": "assistant", "status": status,
            "content": parts}


def response_object(response: ChatCompletion, extra: dict[str, Any] | None = None,
                    meter: Meter | None = None) -> dict[str, Any]:
    choice = response.choices[0]
    output: list[dict[str, Any]] = []
    parts = [_part(kind, text) for kind, text in (("output_text", choice.message.content),
                                                  ("refusal", choice.message.refusal)) if text]
    if parts:
        output.append(_message_item(parts))
    for call in choice.message.tool_calls or []:
        output.append({"type": "function_call", "id": "fc_" + uuid.uuid4().hex, "call_id": call.id,
                       "name": call.function.name, "arguments": call.function.arguments, "status": "completed"})
    incomplete = _INCOMPLETE.get(choice.finish_reason or "")
    if incomplete and output:
        output[-1]["status"] = "incomplete"  # the item being written when the answer was cut short
    return _response(new_response_id(), response.model, "incomplete" if incomplete else "completed", output,
                     _usage(response.usage, meter, _reasoning_tokens(response)), incomplete, extra)


class ResponsesEvents:
    """OpenAI chat chunks -> the Responses event stream (a ``gateway.streaming.StreamEncoder``)."""

    def __init__(self, meter: Meter | None = None, extra: dict[str, Any] | None = None,
                 on_final: Callable[[dict[str, Any]], None] | None = None) -> None:
        # ``meter`` as Dialect.stream passes it (usage comes in chunks); ``extra`` fields go on every
        # response object; ``on_final`` gets the finished response before its last event is sent.
        self._meter = meter
        self._extra = extra
        self._on_final = on_final
        self._seq = 0
        self._id = new_response_id()  # the same in every event and in the stored response
        self._started = False
        self._model = ""
        self._output: list[dict[str, Any]] = []
        self._text: int | None = None  # output index of the open message item
        self._tools: dict[int, int] = {}  # chat tool call index -> output index
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
        start = _response(self._id, self._model, "in_progress", [], None, extra=self._extra)
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
            for kind, text in (("output_text", delta.content), ("refusal", delta.refusal)):
                if isinstance(text, str) and text:
                    out += self._message_delta(kind, text)
            for call in delta.tool_calls or []:
                function = call.function if isinstance(call.function, dict) else {}
                if call.index not in self._tools:
                    self._tools[call.index] = len(self._output)
                    call_id = call.id if isinstance(call.id, str) else ""
                    item = {"type": "function_call", "id": "fc_" + uuid.uuid4().hex, "call_id": call_id,
                            "name": function.get("name") or "", "arguments": "", "status": "in_progress"}
                    self._output.append(item)
                    out += self._event("response.output_item.added",
                                       {"output_index": self._tools[call.index], "item": dict(item)})
                index = self._tools[call.index]
                arguments = function.get("arguments")
                if arguments:
                    self._output[index]["arguments"] += arguments
                    out += self._event("response.function_call_arguments.delta", {
                        "item_id": self._output[index]["id"], "output_index": index, "delta": arguments})
            if choice.finish_reason:
                self._finish = choice.finish_reason
        return out

    def _message_delta(self, kind: str, text: str) -> bytes:
        """``text`` added to the open message's last part of ``kind`` (output_text or refusal), the
        message and the part opened first where they are not."""
        out = b""
        if self._text is None:
            self._text = len(self._output)
            self._output.append(_message_item([], "in_progress"))
            out += self._event("response.output_item.added", {"output_index": self._text,
                                                              "item": self._output[self._text]})
        item = self._output[self._text]
        parts: list[dict[str, Any]] = item["content"]
        where = {"item_id": item["id"], "output_index": self._text, "content_index": len(parts) - 1}
        if not parts or parts[-1]["type"] != kind:
            where["content_index"] = len(parts)
            parts.append(_part(kind, ""))
            out += self._event("response.content_part.added", where | {"part": parts[-1]})
        parts[-1][_PART_TEXT[kind]] += text
        if kind == "refusal":
            return out + self._event("response.refusal.delta", where | {"delta": text})
        return out + self._event("response.output_text.delta", where | {"delta": text, "logprobs": []})

    def done(self) -> bytes:
        out = b""
        incomplete = _INCOMPLETE.get(self._finish or "")
        for index, item in enumerate(self._output):
            # the item being written when the answer was cut short is incomplete
            item["status"] = "incomplete" if incomplete and index == len(self._output) - 1 else "completed"
            if item["type"] == "message":
                for content_index, part in enumerate(item["content"]):
                    where = {"item_id": item["id"], "output_index": index, "content_index": content_index}
                    if part["type"] == "refusal":
                        out += self._event("response.refusal.done", where | {"refusal": part["refusal"]})
                    else:
                        out += self._event("response.output_text.done", where | {"text": part["text"], "logprobs": []})
                    out += self._event("response.content_part.done", where | {"part": part})
            else:
                out += self._event("response.function_call_arguments.done", {
                    "item_id": item["id"], "output_index": index, "arguments": item["arguments"]})
            out += self._event("response.output_item.done", {"output_index": index, "item": item})
        final = _response(self._id, self._model, "incomplete" if incomplete else "completed", self._output,
                          _usage(self._usage, self._meter, self._reasoning), incomplete, self._extra)
        if self._on_final is not None:
            self._on_final(final)
        return out + self._event("response.incomplete" if incomplete else "response.completed", {"response": final})

    def error(self, error: ApiError) -> bytes:
        """A failure mid-stream: the ``error`` event, then ``response.failed`` ending the response
        (its items so far marked incomplete); a failed response is not stored."""
        out = self._start() + self._error_event(error)
        for item in self._output:
            item["status"] = "incomplete"
        failed = _response(self._id, self._model, "failed", self._output,
                           _usage(self._usage, self._meter, self._reasoning), extra=self._extra)
        return out + self._event("response.failed", {"response": failed | {"error": _failure(error)}})

    def _error_event(self, error: ApiError) -> bytes:
        return self._event("error", {"code": str(error.status), "message": error.message,
                                     "param": responses_param(error.param)})


def _relayed(response: dict[str, Any], model: str, extra: dict[str, Any]) -> dict[str, Any]:
    """An upstream's response object as it came, but for the model's name (and ``extra``)."""
    return response | {"model": model} | extra


class RelayedEvents(ResponsesEvents):
    """An upstream's Responses events as they came (the model named as the client did); a
    translated answer (a fallback to a chat-only deployment) is encoded as ``ResponsesEvents`` does."""

    def __init__(self, meter: Meter | None, extra: dict[str, Any], relayed_extra: dict[str, Any],
                 on_final: Callable[[dict[str, Any]], None]) -> None:
        super().__init__(meter, extra, on_final)
        self._relayed_extra = relayed_extra
        self._relaying = False
        self._response: dict[str, Any] | None = None  # the upstream's latest response object

    def chunk(self, chunk: Any) -> bytes:
        if not isinstance(chunk, ResponsesEvent):
            return super().chunk(chunk)
        event = chunk.data
        kind = str(event.get("type", ""))
        if isinstance(response := event.get("response"), dict):
            event = event | {"response": _relayed(response, chunk.model, self._relayed_extra)}
            self._response = event["response"]
            if kind in ("response.completed", "response.incomplete") and self._on_final is not None:
                self._on_final(event["response"])
        if isinstance(seq := event.get("sequence_number"), int):
            self._seq = seq + 1  # events the gateway adds (a failure) follow the upstream's numbering
        self._relaying = True
        return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(event) + b"\n\n"

    def _message_delta(self, kind: str, text: str) -> bytes:
        """``text`` added to the open message's last part of ``kind`` (output_text or refusal), the
        message and the part opened first where they are not."""
        out = b""
        if self._text is None:
            self._text = len(self._output)
            self._output.append(_message_item([], "in_progress"))
            out += self._event("response.output_item.added", {"output_index": self._text,
                                                              "item": self._output[self._text]})
        item = self._output[self._text]
        parts: list[dict[str, Any]] = item["content"]
        where = {"item_id": item["id"], "output_index": self._text, "content_index": len(parts) - 1}
        if not parts or parts[-1]["type"] != kind:
            where["content_index"] = len(parts)
            parts.append(_part(kind, ""))
            out += self._event("response.content_part.added", where | {"part": parts[-1]})
        parts[-1][_PART_TEXT[kind]] += text
        if kind == "refusal":
            return out + self._event("response.refusal.delta", where | {"delta": text})
        return out + self._event("response.output_text.delta", where | {"delta": text, "logprobs": []})

    def done(self) -> bytes:
        return b"" if self._relaying else super().done()

    def error(self, error: ApiError) -> bytes:
        """A failure in the middle of an upstream's stream: the ``error`` event, then
        ``response.failed`` with the upstream's response as last relayed."""
        if not self._relaying:
            return super().error(error)
        out = self._error_event(error)
        if self._response is not None:
            failed = self._response | {"status": "failed", "error": _failure(error)}
            out += self._event("response.failed", {"response": failed})
        return out


def responses_dialect(extra: dict[str, Any], on_final: Callable[[dict[str, Any]], None],
                      relayed_extra: dict[str, Any] | None = None) -> Dialect:
    """The Responses dialect for one call: ``extra`` fields on the response objects it builds
    (``relayed_extra`` on an upstream's own), and every finished response handed to ``on_final``
    (for ``store``)."""
    relayed_extra = relayed_extra or {}

    def unary(response: ChatCompletion | RelayedResponse, meter: Meter) -> bytes:
        if isinstance(response, RelayedResponse):
            final = _relayed(response.body, response.model, relayed_extra)
        else:
            final = response_object(response, extra, meter)
        if final.get("status") in ("completed", "incomplete"):
            on_final(final)
        return msgspec.json.encode(final)

    return Dialect(unary=unary, stream=lambda meter: RelayedEvents(meter, extra, relayed_extra, on_final))
