"""OpenAI's Responses API at the gateway's edge (``POST /v1/responses``), translated via chat.

Requests are decoded into the Structs below and converted to an OpenAI chat request
(``to_chat_request``), so they are authenticated, admitted, routed and metered like chat. Answers
are converted back: a ``response`` object (``response_object``) or the Responses event stream
(``ResponsesEvents``). ``input_items`` gives a request's input as stored items, and a per-call
``responses_dialect`` hands every finished response object to a callback, so the controller can keep
it (``gateway.stored_responses``); from an upstream that serves Responses itself the answer and its
events are relayed as they came (``RelayedResponse``, ``RelayedEvents``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from backends.base import Meter
from backends.openai_wire import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDef,
    JSONSchemaFormat,
    PromptTokensDetails,
    ResponseFormat,
    StreamOptions,
    TextPart,
    Tool,
    ToolCall,
    Usage,
    set_extra_params,
)
from backends.responses_wire import RelayedResponse, ResponsesEvent
from gateway.body import RAW_BODY
from gateway.dialects import Dialect
from gateway.errors import ApiError


class _Wire(Struct, kw_only=True):
    pass


class InputText(_Wire, tag_field="type", tag="input_text"):
    text: str


class OutputText(_Wire, tag_field="type", tag="output_text"):
    text: str


class MessageItem(_Wire, tag_field="type", tag="message"):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText | OutputText]


class FunctionCallItem(_Wire, tag_field="type", tag="function_call"):
    call_id: str
    name: str
    arguments: str
    id: str | UnsetType = UNSET


class FunctionCallOutputItem(_Wire, tag_field="type", tag="function_call_output"):
    call_id: str
    output: str


Item = MessageItem | FunctionCallItem | FunctionCallOutputItem


class FunctionTool(_Wire, tag_field="type", tag="function"):
    name: str
    parameters: dict[str, Any] | None = None
    description: str | None | UnsetType = UNSET
    strict: bool | None | UnsetType = UNSET


class TextFormat(_Wire):
    type: Literal["text", "json_object", "json_schema"]
    name: str | UnsetType = UNSET
    schema: dict[str, Any] | UnsetType = UNSET
    strict: bool | None | UnsetType = UNSET


class TextConfig(_Wire):
    format: TextFormat | UnsetType = UNSET


class ResponsesRequest(_Wire, dict=True):
    raw_body: ClassVar[bool] = True  # kept as sent (gateway.body), for an upstream that serves Responses

    model: str
    input: str | list[dict[str, Any]]  # items; checked where translated (``_items``), as sent otherwise
    instructions: str | None | UnsetType = UNSET
    tools: list[dict[str, Any]] | UnsetType = UNSET  # function tools where translated (``_function_tools``)
    tool_choice: str | dict[str, Any] | UnsetType = UNSET
    text: TextConfig | UnsetType = UNSET
    max_output_tokens: Annotated[int, Meta(ge=1)] | None | UnsetType = UNSET
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None | UnsetType = UNSET
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None | UnsetType = UNSET
    stream: bool | None | UnsetType = UNSET
    store: bool | None | UnsetType = UNSET
    previous_response_id: str | None | UnsetType = UNSET
    user: str | UnsetType = UNSET


# Fields of the Responses API with no chat equivalent, and the values that ask for nothing (so a
# translated request may carry them); any other value is a 400 naming the field.
_NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "include": (None, []), "truncation": (None, "disabled"), "background": (None, False),
    "reasoning": (None, {}), "prompt": (None,), "conversation": (None,),
}
# Fields passed on to a chat provider under the same name (the built-in engine checks them itself).
_CHAT_SAME_NAME = ("metadata", "parallel_tool_calls", "service_tier", "prompt_cache_key", "safety_identifier",
                   "top_logprobs")


def raw_request(req: ResponsesRequest) -> dict[str, Any]:
    """The request as the client sent it, every field included."""
    raw: dict[str, Any] = msgspec.json.decode(req.__dict__[RAW_BODY])
    return raw


def _translated_extras(req: ResponsesRequest) -> dict[str, msgspec.Raw]:
    """The fields the Structs do not model, as chat parameters (``reasoning.effort`` becomes
    ``reasoning_effort``); a field chat cannot express is a 400 naming it."""
    raw = raw_request(req)
    known = {f.encode_name for f in msgspec.structs.fields(ResponsesRequest)}
    extras: dict[str, msgspec.Raw] = {}
    for name, value in raw.items():
        if name in known:
            continue
        if name in _CHAT_SAME_NAME:
            extras[name] = msgspec.Raw(msgspec.json.encode(value))
        elif name == "reasoning" and isinstance(value, dict) and set(value) <= {"effort", "summary"} \
                and value.get("summary") in (None, "auto"):
            if value.get("effort") is not None:
                extras["reasoning_effort"] = msgspec.Raw(msgspec.json.encode(value["effort"]))
        elif value not in _NO_OP_VALUES.get(name, ()):
            raise ApiError(400, f"'{name}' is not supported for this model: it is served through chat "
                           "completions, which have no equivalent", param=name, code="unsupported_parameter")
    return extras


def _function_tools(tools: list[dict[str, Any]]) -> list[Tool]:
    out: list[Tool] = []
    for i, entry in enumerate(tools):
        try:
            tool = msgspec.convert(entry, FunctionTool)
        except msgspec.ValidationError as exc:
            raise ApiError(400, f"tools[{i}]: only function tools can be served by this model ({exc})",
                           param=f"tools[{i}]") from None
        out.append(Tool(function=FunctionDef(name=tool.name, description=tool.description or UNSET,
                                             parameters=tool.parameters if tool.parameters is not None else UNSET)))
    return out


def _items(raw: list[dict[str, Any]]) -> list[Item]:
    items: list[Item] = []
    for i, entry in enumerate(raw):
        if "type" not in entry and "role" in entry:
            entry = {"type": "message"} | entry
        try:
            items.append(msgspec.convert(entry, Item))
        except msgspec.ValidationError as exc:
            where = str(exc).rpartition(" - at `$")[2].rstrip("`")
            raise ApiError(400, f"input[{i}]: {exc}", param=f"input[{i}]{where}") from None
    return items


_ID_PREFIX = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_"}


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as Responses items, each with an id, as ``input_items`` lists them."""
    if isinstance(req.input, str):
        raw: list[dict[str, Any]] = [{"type": "message", "role": "user",
                                      "content": [{"type": "input_text", "text": req.input}]}]
    else:  # items this gateway does not model (say, for an upstream serving Responses) are kept as sent
        raw = [dict(entry) for entry in req.input]
    out = []
    for item in raw:
        if "type" not in item and "role" in item:
            item["type"] = "message"
        if isinstance(item.get("content"), str):
            kind = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": kind, "text": item["content"]}]
        item.setdefault("id", _ID_PREFIX.get(str(item.get("type")), "item_") + uuid.uuid4().hex)
        if item["type"] != "function_call_output" or "status" not in item:
            item.setdefault("status", "completed")
        out.append(item)
    return out


def _item_messages(items: list[Item]) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    for item in items:
        if isinstance(item, MessageItem):
            if isinstance(item.content, str) or len(item.content) == 1:  # one part reads the same as a string
                text = item.content if isinstance(item.content, str) else item.content[0].text
                messages.append(ChatMessage(role=item.role, content=text))
            else:
                messages.append(ChatMessage(role=item.role, content=[TextPart(text=p.text) for p in item.content]))
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant" and last.tool_calls:
                last.tool_calls.append(call)
            else:
                messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        else:
            messages.append(ChatMessage(role="tool", tool_call_id=item.call_id, content=item.output))
    return messages


def to_chat_request(req: ResponsesRequest, context: list[dict[str, Any]] | None = None) -> ChatCompletionRequest:
    """The chat request for ``req``, continuing ``context`` (a stored conversation's items) if given;
    instructions are the request's own (never carried over from earlier responses)."""
    messages: list[ChatMessage] = []
    if req.instructions:
        messages.append(ChatMessage(role="system", content=req.instructions))
    if context:  # what chat can carry of it (an upstream's reasoning items, say, it cannot)
        messages.extend(_item_messages(_items([i for i in context if i.get("type") in _ID_PREFIX])))
    if isinstance(req.input, str):
        if not req.input:
            raise ApiError(400, "input must not be empty", param="input")
        messages.append(ChatMessage(role="user", content=req.input))
    else:
        if not req.input:
            raise ApiError(400, "input must not be empty", param="input")
        messages.extend(_item_messages(_items(req.input)))
    chat = ChatCompletionRequest(model=req.model, messages=messages)
    if isinstance(req.max_output_tokens, int):
        chat.max_tokens = req.max_output_tokens
    if req.temperature is not UNSET:
        chat.temperature = req.temperature
    if req.top_p is not UNSET:
        chat.top_p = req.top_p
    if req.tools:
        chat.tools = _function_tools(req.tools)
    if req.tool_choice is not UNSET:
        choice = req.tool_choice
        if isinstance(choice, dict) and choice.get("type") == "function":
            choice = {"type": "function", "function": {"name": choice.get("name", "")}}
        chat.tool_choice = choice
    if req.text is not UNSET and req.text.format is not UNSET:
        fmt = req.text.format
        if fmt.type == "json_schema":
            if fmt.name is UNSET:
                raise ApiError(400, "text.format of type json_schema needs a name", param="text.format.name")
            chat.response_format = ResponseFormat(type="json_schema", json_schema=JSONSchemaFormat(
                name=fmt.name, schema=fmt.schema, strict=fmt.strict if isinstance(fmt.strict, bool) else UNSET))
        elif fmt.type == "json_object":
            chat.response_format = ResponseFormat(type="json_object")
    if req.user is not UNSET:
        chat.user = req.user
    if req.stream:
        chat.stream = True
        chat.stream_options = StreamOptions(include_usage=True)
    if RAW_BODY in req.__dict__ and (extras := _translated_extras(req)):
        set_extra_params(chat, extras)
    return chat


def _usage(usage: Any) -> dict[str, Any]:
    if not isinstance(usage, Usage):
        return {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
                "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}
    details = usage.prompt_tokens_details
    cached = details.cached_tokens if isinstance(details, PromptTokensDetails) else 0
    return {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "input_tokens_details": {"cached_tokens": cached or 0},
            "output_tokens_details": {"reasoning_tokens": 0}}


def _response(rid: str, model: str, status: str, output: list[dict[str, Any]], usage: Any,
              incomplete: bool = False, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": rid, "object": "response", "created_at": int(time.time()), "status": status, "model": model,
            "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "usage": usage} | (extra or {})


def _message_item(text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": "msg_" + uuid.uuid4().hex, "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def response_object(response: ChatCompletion, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    choice = response.choices[0]
    output: list[dict[str, Any]] = []
    if choice.message.content:
        output.append(_message_item(choice.message.content))
    for call in choice.message.tool_calls or []:
        output.append({"type": "function_call", "id": "fc_" + uuid.uuid4().hex, "call_id": call.id,
                       "name": call.function.name, "arguments": call.function.arguments, "status": "completed"})
    incomplete = choice.finish_reason == "length"
    return _response("resp_" + response.id.removeprefix("chatcmpl-"), response.model,
                     "incomplete" if incomplete else "completed", output, _usage(response.usage), incomplete, extra)


class ResponsesEvents:
    """OpenAI chat chunks -> the Responses event stream (a ``gateway.streaming.StreamEncoder``)."""

    def __init__(self, meter: Meter | None = None, extra: dict[str, Any] | None = None,
                 on_final: Callable[[dict[str, Any]], None] | None = None) -> None:
        # ``meter`` as Dialect.stream passes it (usage comes in chunks); ``extra`` fields go on every
        # response object; ``on_final`` gets the finished response before its last event is sent.
        self._extra = extra
        self._on_final = on_final
        self._seq = 0
        self._id = ""
        self._model = ""
        self._output: list[dict[str, Any]] = []
        self._text: int | None = None  # output index of the open message item
        self._tools: dict[int, int] = {}  # chat tool call index -> output index
        self._usage: Any = None
        self._finish: str | None = None

    def _event(self, kind: str, data: dict[str, Any]) -> bytes:
        body = {"type": kind, "sequence_number": self._seq} | data
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(body) + b"\n\n"

    def chunk(self, chunk: ChatCompletionChunk) -> bytes:
        out = b""
        if not self._id:
            self._id = "resp_" + chunk.id.removeprefix("chatcmpl-")
            self._model = chunk.model
            start = _response(self._id, self._model, "in_progress", [], None, extra=self._extra)
            out += self._event("response.created", {"response": start})
            out += self._event("response.in_progress", {"response": start})
        if isinstance(chunk.usage, Usage):
            self._usage = chunk.usage
        for choice in chunk.choices[:1]:
            delta = choice.delta
            if isinstance(delta.content, str) and delta.content:
                if self._text is None:
                    self._text = len(self._output)
                    item = _message_item("", "in_progress")
                    item["content"] = []
                    self._output.append(item)
                    out += self._event("response.output_item.added", {"output_index": self._text, "item": item})
                    out += self._event("response.content_part.added", {
                        "item_id": item["id"], "output_index": self._text, "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": []}})
                    item["content"] = [{"type": "output_text", "text": "", "annotations": []}]
                item = self._output[self._text]
                item["content"][0]["text"] += delta.content
                out += self._event("response.output_text.delta", {
                    "item_id": item["id"], "output_index": self._text, "content_index": 0, "delta": delta.content,
                    "logprobs": []})
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

    def done(self) -> bytes:
        out = b""
        for index, item in enumerate(self._output):
            item["status"] = "completed"
            if item["type"] == "message":
                part = item["content"][0]
                out += self._event("response.output_text.done", {
                    "item_id": item["id"], "output_index": index, "content_index": 0, "text": part["text"],
                    "logprobs": []})
                out += self._event("response.content_part.done", {
                    "item_id": item["id"], "output_index": index, "content_index": 0, "part": part})
            else:
                out += self._event("response.function_call_arguments.done", {
                    "item_id": item["id"], "output_index": index, "arguments": item["arguments"]})
            out += self._event("response.output_item.done", {"output_index": index, "item": item})
        incomplete = self._finish == "length"
        final = _response(self._id or "resp_" + uuid.uuid4().hex, self._model,
                          "incomplete" if incomplete else "completed", self._output, _usage(self._usage), incomplete,
                          self._extra)
        if self._on_final is not None:
            self._on_final(final)
        return out + self._event("response.incomplete" if incomplete else "response.completed", {"response": final})

    def error(self, error: ApiError) -> bytes:
        return self._event("error", {"code": str(error.status), "message": error.message, "param": error.param})


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

    def chunk(self, chunk: Any) -> bytes:
        if not isinstance(chunk, ResponsesEvent):
            return super().chunk(chunk)
        event = chunk.data
        kind = str(event.get("type", ""))
        if isinstance(response := event.get("response"), dict):
            event = event | {"response": _relayed(response, chunk.model, self._relayed_extra)}
            if kind in ("response.completed", "response.incomplete") and self._on_final is not None:
                self._on_final(event["response"])
        self._relaying = True
        return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(event) + b"\n\n"

    def done(self) -> bytes:
        return b"" if self._relaying else super().done()


def responses_dialect(extra: dict[str, Any], on_final: Callable[[dict[str, Any]], None],
                      relayed_extra: dict[str, Any] | None = None) -> Dialect:
    """The Responses dialect for one call: ``extra`` fields on the response objects it builds
    (``relayed_extra`` on an upstream's own), and every finished response handed to ``on_final``
    (for ``store``)."""
    relayed_extra = relayed_extra or {}

    def unary(response: ChatCompletion | RelayedResponse) -> bytes:
        if isinstance(response, RelayedResponse):
            final = _relayed(response.body, response.model, relayed_extra)
        else:
            final = response_object(response, extra)
        if final.get("status") in ("completed", "incomplete"):
            on_final(final)
        return msgspec.json.encode(final)

    return Dialect(unary=unary, stream=lambda meter: RelayedEvents(meter, extra, relayed_extra, on_final))
