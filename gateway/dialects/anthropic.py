"""Anthropic's Messages API at the gateway's edge (``POST /v1/messages``): the whole dialect.

Requests (``gateway.dialects.anthropic_request``) go as the client sent them to a deployment that
speaks the Messages API, and are translated to an OpenAI chat request for any other, so they are
authenticated, admitted, routed and metered exactly like ``/v1/chat/completions``. Answers are
converted back (here): a ``message`` object, or the Messages stream events (``ANTHROPIC``); errors
take Anthropic's shape ``{"type": "error", "error": {"type", "message"}}`` (``error_handlers``, and
``on_messages_paths`` for the app's own: an unknown URL or method under ``/v1/messages``). The
provider side (OpenAI requests sent to Anthropic) is ``backends.anthropic_wire``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from litestar import Request, Response

from backends.anthropic_thinking import answer_blocks
from backends.base import Meter, UntranslatableAnswer
from backends.function_tools import answered_function, check_delta
from backends.openai_wire import (
    ANTHROPIC_MESSAGE,
    ChatCompletion,
    ChatCompletionChunk,
    PromptTokensDetails,
    Usage,
    anthropic_events,
    reasoning_text,
)
from gateway.dialects import Dialect
from gateway.dialects.anthropic_request import CountTokensRequest as CountTokensRequest
from gateway.dialects.anthropic_request import MessagesRequest as MessagesRequest
from gateway.dialects.anthropic_request import to_chat_request as to_chat_request
from gateway.dialects.tool_call_slots import CallSlots, own_call_id
from gateway.errors import ApiError, exception_handlers
from gateway.ids import random_id
from gateway.quotas.headers import anthropic_ratelimit_headers

_FINISH_TO_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                   "content_filter": "refusal", "function_call": "tool_use"}
_API = "the Messages API"


def message_id(answer_id: str) -> str:
    """A Messages answer's id: Anthropic's ``msg_`` form; an answer translated from a chat completion
    (``chatcmpl-...``) gets a new one, one that already has it (from Anthropic) is kept."""
    return answer_id if answer_id.startswith("msg_") else "msg_" + random_id()
_QUOTED = 500  # characters of a tool call's unusable arguments quoted in the error
_CUT = ("max_tokens", "stop_sequence")  # stop reasons of an answer cut short, a tool call's JSON with it


def tool_use_id() -> str:
    """A tool_use block's id of the gateway's own, in Anthropic's ``toolu_`` form, for a call the
    upstream gave none (an upstream's own id is kept, as the client sends it back in ``tool_result``)."""
    return "toolu_" + random_id()


# ---------------------------------------------------------------- OpenAI -> response


def _usage(usage: Any, meter: Meter | None = None) -> dict[str, int]:
    """Anthropic's usage from OpenAI's, else (the provider reported none, or not every count) what
    ``meter`` counted: a prompt's cached tokens are ``cache_read_input_tokens``, apart from
    ``input_tokens`` (as Anthropic counts them; the two add up to the prompt)."""
    if meter is not None and not (isinstance(usage, Usage) and meter.exact):
        usage = Usage(prompt_tokens=meter.prompt_tokens, completion_tokens=meter.completion_tokens,
                      prompt_tokens_details=PromptTokensDetails(cached_tokens=meter.cached_tokens))
    if not isinstance(usage, Usage):
        return {"input_tokens": 0, "output_tokens": 0}
    details = usage.prompt_tokens_details
    cached = min(details.cached_tokens, usage.prompt_tokens) if isinstance(details, PromptTokensDetails) else 0
    counts = {"input_tokens": usage.prompt_tokens - cached, "output_tokens": usage.completion_tokens}
    return counts | ({"cache_read_input_tokens": cached} if cached > 0 else {})


def _thinking(text: str) -> dict[str, Any]:
    """A thinking block of an upstream's reasoning: it has no signature (an Anthropic upstream's
    blocks are relayed as they came; a whole answer's ``thinking_blocks``, as LiteLLM gives them,
    are taken instead, signatures included)."""
    return {"type": "thinking", "thinking": text, "signature": ""}


def message_body(response: ChatCompletion, meter: Meter) -> bytes:
    if (message := response.__dict__.get(ANTHROPIC_MESSAGE)) is not None:  # an Anthropic upstream's, as it came
        return msgspec.json.encode(message | {"model": response.model})
    if not response.choices:  # no content, as a stream of no choice has none
        return msgspec.json.encode({"id": message_id(response.id), "type": "message", "role": "assistant",
                                    "model": response.model, "content": [], **_stop(None),
                                    "usage": _usage(response.usage, meter)})
    choice = response.choices[0]
    content: list[dict[str, Any]] = []
    if blocks := answer_blocks(choice.message.thinking_blocks):  # an upstream's signed blocks (LiteLLM's)
        content.extend(blocks)
    elif reasoning := reasoning_text(choice.message):
        content.append(_thinking(reasoning))  # as the stream has it: a thinking block first
    if text := (choice.message.content or "") + (choice.message.refusal or ""):  # a refusal is told in text
        content.append({"type": "text", "text": text})
    stop = _stop(choice.finish_reason, choice.stop_reason, choice.matched_stop)
    if choice.message.tool_calls:
        stop = _with_calls(stop)
    for call in choice.message.tool_calls or []:
        function = answered_function(call, _API)
        call_id = own_call_id(call.id, tool_use_id)
        arguments = _tool_input(call_id, function.name, function.arguments, cut=stop["stop_reason"] in _CUT)
        content.append({"type": "tool_use", "id": call_id, "name": function.name, "input": arguments})
    return msgspec.json.encode({
        "id": message_id(response.id), "type": "message", "role": "assistant", "model": response.model,
        "content": content,
        **stop, "usage": _usage(response.usage, meter),
    })


def _tool_input(call_id: str, name: str, arguments: str, *, cut: bool = False) -> dict[str, Any]:
    """A tool call's ``arguments`` as a ``tool_use`` block's ``input``, which is always a JSON object
    (none sent: ``{}``). Other text (invalid JSON from a small model, an array, a string) cannot be
    written there, and ``{}`` would lose it: the answer fails as untranslatable (a 502, ``api_error``,
    naming the call and quoting the text; the upstream's usage recorded). A stream relays the text as
    it comes (``input_json_delta``), then ends the same way: an ``error`` event (``MessagesEvents``).

    An answer ``cut`` by the length limit or by one of the client's stop sequences is not a failure:
    Anthropic's own API answers such a call as an incomplete ``tool_use`` block with ``stop_reason:
    max_tokens`` (or ``stop_sequence``), which tells the client why; its ``input`` is ``{}`` here (a
    stream has relayed the text as sent)."""
    try:
        value = json.loads(arguments or "{}")
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        if cut:
            return {}
        quoted = arguments if len(arguments) <= _QUOTED else arguments[:_QUOTED] + "..."
        raise UntranslatableAnswer(f"the upstream's tool call {call_id!r} ({name!r}) has arguments that are not a "
                                   f"JSON object, which a tool_use block's input must be: {quoted!r}")
    return value


def _stop(finish: str | None, *matched: Any) -> dict[str, Any]:
    """``stop_reason`` and ``stop_sequence``: a matched stop string (vLLM's ``stop_reason``, SGLang's
    ``matched_stop``; a token id is none) is reported as ``stop_sequence``."""
    hit = next((m for m in matched if isinstance(m, str)), None)
    if finish == "stop" and hit is not None:
        return {"stop_reason": "stop_sequence", "stop_sequence": hit}
    return {"stop_reason": _FINISH_TO_STOP.get(finish or "stop", "end_turn"), "stop_sequence": None}


def _with_calls(stop: dict[str, Any]) -> dict[str, Any]:
    """The stop of an answer that made tool calls: ``tool_use``, though the upstream finished it as
    ``stop`` (vLLM does for a call it was made to make: a named tool_choice, ``required``)."""
    return {"stop_reason": "tool_use", "stop_sequence": None} if stop["stop_reason"] == "end_turn" else stop


def _role_only(chunk: ChatCompletionChunk) -> bool:
    """Whether a chunk says nothing but that the answer began (the role, empty content): a provider's
    first, sent before its first output (the engine's, before the prompt is computed)."""
    if isinstance(chunk.usage, Usage) or len(chunk.choices) != 1:
        return False
    choice = chunk.choices[0]
    delta = choice.delta
    return (choice.finish_reason is None and not delta.content and not delta.refusal and not delta.tool_calls
            and not reasoning_text(delta) and not delta.thinking_blocks)


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode({"type": kind} | data) + b"\n\n"


_PING = _event("ping", {})


def _relayed_event(event: dict[str, Any], model: str) -> bytes:
    """An Anthropic upstream's event as it came; the gateway owns only the model's name."""
    if event.get("type") == "message_start" and isinstance(message := event.get("message"), dict):
        event = event | {"message": message | {"model": model}}
    return b"event: " + str(event.get("type", "")).encode() + b"\ndata: " + msgspec.json.encode(event) + b"\n\n"


class MessagesEvents:
    """OpenAI chunks -> Anthropic stream events (a ``gateway.streaming.StreamEncoder``). From an
    Anthropic upstream the events are relayed as they came (thinking signatures, pings, event types
    the gateway does not know), not rebuilt from the chunks."""

    def __init__(self, meter: Meter | None = None) -> None:
        self._meter = meter  # the call's: the prompt's tokens (those read from a cache apart) for message_start
        self._relaying: bool | None = None  # decided by the first chunk
        self._relayed_open: list[int] = []  # relaying: the content blocks started and not yet stopped
        self._relayed_stop = False  # relaying: message_stop came
        self._started = False
        self._head: tuple[str, str] | None = None  # the first chunk's id and model, for message_start
        self._block: int = -1  # index of the open content block
        self._block_kind: str | None = None
        self._slots = CallSlots(tool_use_id)  # chat's tool call deltas placed in calls
        self._tools: dict[int, int] = {}  # a call's number (``CallSlot.number``) -> its block's index, once open
        self._calls: dict[int, tuple[str, str, list[str]]] = {}  # a call's number -> its id, name, arguments so far
        self._waiting: list[int] = []  # tool calls begun while another's block was open, in order
        self._held: list[tuple[str, str]] = []  # (block kind, text) sent amid a call's partial arguments
        self._stop: dict[str, Any] = {"stop_reason": "end_turn", "stop_sequence": None}
        self._usage: dict[str, int] = {"output_tokens": 0}

    keep_alive = _PING  # as Anthropic's API sends while a stream is silent; its SDK skips it

    def chunk(self, chunk: ChatCompletionChunk) -> bytes:
        events = anthropic_events(chunk)
        if self._relaying is None:
            self._relaying = events is not None
        if self._relaying:
            if isinstance(chunk.usage, Usage):
                self._usage = _usage(chunk.usage)
            return b"".join(self._relay(e, chunk.model) for e in events or ())
        if self._head is None:
            self._head = (chunk.id, chunk.model)
        if not self._started and _role_only(chunk):
            return b""  # message_start waits for the answer's first output (the prompt's cached tokens known)
        out = self._start()
        if isinstance(chunk.usage, Usage):
            self._usage = _usage(chunk.usage, self._meter)  # the meter has taken this usage in
        for choice in chunk.choices[:1]:
            delta = choice.delta
            if reasoning := reasoning_text(delta):
                out += self._text("thinking", reasoning)
            if isinstance(delta.content, str) and delta.content:
                out += self._text("text", delta.content)
            if isinstance(delta.refusal, str) and delta.refusal:  # a refusal is told in text
                out += self._text("text", delta.refusal)
            for position, call in enumerate(delta.tool_calls or []):
                check_delta(call, _API)
                function = call.function if isinstance(call.function, dict) else {}
                slot, new = self._slots.place(call, position)
                if new:
                    self._calls[slot.number] = (slot.id, function.get("name") or "", [])
                    self._waiting.append(slot.number)
                if arguments := function.get("arguments"):
                    self._calls[slot.number][2].append(arguments)
                    if self._block_kind == "tool_use" and self._tools.get(slot.number) == self._block:
                        out += self._input_delta(slot.number, arguments)  # (a stopped block's: checked at the end)
                out += self._open_calls() + self._release()
            if choice.finish_reason:
                self._stop = _stop(choice.finish_reason, choice.stop_reason, choice.matched_stop)
        return out

    def _start(self) -> bytes:
        """``message_start``, once, then a ``ping`` (as Anthropic's API sends): its usage the prompt's,
        as metered so far (the tokens read from the prompt cache apart, as ``message_delta`` has them)."""
        if self._started:
            return b""
        self._started = True
        answer_id, model = self._head or ("", "")
        usage = _usage(None, self._meter) if self._meter is not None else {"input_tokens": 0}
        return _event("message_start", {"message": {
            "id": message_id(answer_id), "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": usage | {"output_tokens": 0}}}) + _PING

    def _text(self, kind: str, text: str) -> bytes:
        """Text or reasoning: a delta of the open block of its kind, else of a new one; held while a
        call's arguments are partial JSON (its block cannot stop before they are whole)."""
        if self._held or (self._block_kind == "tool_use" and not self._open_call_whole()):
            self._held.append((kind, text))
            return b""
        return self._write(kind, text)

    def _write(self, kind: str, text: str) -> bytes:
        out = b""
        if self._block_kind != kind:
            out += self._open(_thinking("") if kind == "thinking" else {"type": "text", "text": ""}, kind)
        delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" else {"type": "text_delta",
                                                                                          "text": text}
        return out + _event("content_block_delta", {"index": self._block, "delta": delta})

    def _release(self, *, all_: bool = False) -> bytes:
        """The text held (``_text``), once the open call's arguments are whole (``all_``: in any case)."""
        if not self._held or (not all_ and self._block_kind == "tool_use" and not self._open_call_whole()):
            return b""
        held, self._held = self._held, []
        return b"".join(self._write(kind, text) for kind, text in held)

    def _open_calls(self, *, all_: bool = False) -> bytes:
        """Waiting tool calls' blocks opened in turn, their arguments so far as one delta, while the
        open block is not a call whose arguments are still partial JSON (``all_``: in any case). Chat
        may interleave parallel calls' deltas; Anthropic's blocks are each whole before the next starts."""
        out = b""
        while self._waiting and (all_ or self._block_kind != "tool_use" or self._open_call_whole()):
            index = self._waiting.pop(0)
            call_id, name, arguments = self._calls[index]
            out += self._open({"type": "tool_use", "id": call_id, "name": name, "input": {}}, "tool_use")
            self._tools[index] = self._block
            if arguments:
                out += self._input_delta(index, "".join(arguments))
        return out

    def _open_call_whole(self) -> bool:
        """Whether the open tool_use block's arguments so far are a whole JSON document."""
        try:
            msgspec.json.decode("".join(self._calls[next(reversed(self._tools))][2]))
        except msgspec.DecodeError:
            return False
        return True

    def _input_delta(self, index: int, arguments: str) -> bytes:
        return _event("content_block_delta", {"index": self._tools[index],
                                              "delta": {"type": "input_json_delta", "partial_json": arguments}})

    def _relay(self, event: dict[str, Any], model: str) -> bytes:
        kind, index = event.get("type"), event.get("index")
        if kind == "content_block_start" and isinstance(index, int):
            self._relayed_open.append(index)
        elif kind == "content_block_stop" and index in self._relayed_open:
            self._relayed_open.remove(index)
        elif kind == "message_stop":
            self._relayed_stop = True
        return _relayed_event(event, model)

    def _open(self, block: dict[str, Any], kind: str) -> bytes:
        out = self._close()
        self._block += 1
        self._block_kind = kind
        return out + _event("content_block_start", {"index": self._block, "content_block": block})

    def _close(self) -> bytes:
        if self._block_kind is None:
            return b""
        self._block_kind = None
        return _event("content_block_stop", {"index": self._block})

    def done(self) -> bytes:
        """The message's end. A relayed stream ended by the upstream's ``message_stop`` has it; one
        cut short by the drain (``gateway.drain``) is ended here as a translated stream is: its open
        blocks stopped, ``max_tokens`` (the cut chunk's ``length``) with the usage so far. A tool call
        whose arguments (relayed as sent) are not a JSON object raises ``UntranslatableAnswer`` instead,
        as a whole answer's does: the relay ends the stream with an ``error`` event."""
        if self._relaying:
            if self._relayed_stop:
                return b""
            return (b"".join(_event("content_block_stop", {"index": i}) for i in self._relayed_open)
                    + _event("message_delta", {"delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                                               "usage": self._usage})
                    + _event("message_stop", {}))
        cut = self._stop["stop_reason"] in _CUT
        for call_id, name, arguments in self._calls.values():
            _tool_input(call_id, name, "".join(arguments), cut=cut)
        if self._calls:
            self._stop = _with_calls(self._stop)
        out = self._start() + self._open_calls(all_=True)
        out += self._release(all_=True)
        return (out + self._close()
                + _event("message_delta", {"delta": self._stop,
                                           "usage": self._usage})
                + _event("message_stop", {}))

    def error(self, error: ApiError) -> bytes:
        return _event("error", {"error": {"type": error_type(error.status), "message": error.message}})


ANTHROPIC = Dialect(unary=message_body, stream=MessagesEvents, ratelimit_headers=anthropic_ratelimit_headers)

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                429: "rate_limit_error", 503: "overloaded_error", 504: "timeout_error"}


def error_type(status: int) -> str:
    """Anthropic's error ``type`` for an HTTP status: a 4xx it names no type for is an
    ``invalid_request_error`` (as Anthropic's own are), a 5xx an ``api_error``."""
    return _ERROR_TYPES.get(status) or ("invalid_request_error" if 400 <= status < 500 else "api_error")


def _in_anthropic_shape(handler: Callable[[Request[Any, Any, Any], Any], Response[bytes]]) -> Callable[..., Any]:
    """Wrap one of the gateway's exception handlers to answer in Anthropic's error shape."""

    def handle(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
        response = handler(request, exc)
        error = msgspec.json.decode(response.content)["error"]
        body = {"type": "error", "error": {"type": error_type(response.status_code or 500),
                                           "message": error["message"]}}
        headers = dict(response.headers)
        if (rid := headers.get("x-request-id")) is not None:  # Anthropic's name for it, which its SDK reads:
            headers.setdefault("request-id", rid)  # here for an unrouted request (the middleware adds a routed one's)
        return Response(content=msgspec.json.encode(body), status_code=response.status_code,
                        media_type="application/json", headers=headers)

    return handle


def error_handlers() -> dict[Any, Callable[..., Any]]:
    """The gateway's exception handlers, answering in Anthropic's error shape."""
    return {exc: _in_anthropic_shape(h) for exc, h in exception_handlers.items()}  # type: ignore[arg-type]  # handlers are typed per exception


MESSAGES_PATH = "/v1/messages"


def on_messages_paths(handlers: Mapping[Any, Any]) -> dict[Any, Callable[..., Any]]:
    """The app's exception ``handlers``, answering in Anthropic's shape under ``/v1/messages``: an
    unknown URL or a method not allowed there fails before any controller's handlers apply."""

    def choose(handler: Callable[..., Response[bytes]]) -> Callable[..., Response[bytes]]:
        anthropic = _in_anthropic_shape(handler)

        def handle(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
            path = request.scope["path"]
            if path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/"):
                return anthropic(request, exc)
            return handler(request, exc)

        return handle

    return {exc: choose(handler) for exc, handler in handlers.items()}
