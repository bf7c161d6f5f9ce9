"""Anthropic's Messages API at the gateway's edge (``POST /v1/messages``): the whole dialect.

Requests are decoded into the Structs below and converted to an OpenAI chat request, so they are
authenticated, admitted, routed and metered exactly like ``/v1/chat/completions`` (to any
provider). Answers are converted back: a ``message`` object, or the Messages stream events
(``ANTHROPIC``); errors take Anthropic's shape ``{"type": "error", "error": {"type", "message"}}``
(``error_handlers``). The provider side (OpenAI requests sent to Anthropic) is
``backends.anthropic_wire``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from litestar import Request, Response
from msgspec import UNSET, Meta, Struct, UnsetType

from backends.base import Meter
from backends.openai_wire import (
    ANTHROPIC_BODY,
    ANTHROPIC_MESSAGE,
    MAX_TOKEN_COUNT,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    FilePart,
    FunctionCall,
    FunctionDef,
    ImagePart,
    ImageURL,
    StreamOptions,
    TextPart,
    Tool,
    ToolCall,
    Usage,
    anthropic_events,
    set_extra_params,
)
from gateway.body import RAW_BODY
from gateway.dialects import Dialect
from gateway.errors import ApiError, exception_handlers

_FINISH_TO_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                   "content_filter": "refusal", "function_call": "tool_use"}


class _Wire(Struct, kw_only=True):
    pass


CacheControl = dict[str, Any] | UnsetType  # {"type": "ephemeral", "ttl"?}: passed to an Anthropic upstream


class TextBlock(_Wire, tag_field="type", tag="text"):
    text: str
    cache_control: CacheControl = UNSET


class ImageSource(_Wire):
    type: Literal["base64", "url"]
    media_type: str | UnsetType = UNSET
    data: str | UnsetType = UNSET
    url: str | UnsetType = UNSET


class ImageBlock(_Wire, tag_field="type", tag="image"):
    source: ImageSource
    cache_control: CacheControl = UNSET


class DocumentBlock(_Wire, tag_field="type", tag="document"):
    source: dict[str, Any]  # base64 (a PDF), text, url or content
    title: str | None | UnsetType = UNSET
    context: str | None | UnsetType = UNSET
    citations: dict[str, Any] | UnsetType = UNSET
    cache_control: CacheControl = UNSET


class ThinkingBlock(_Wire, tag_field="type", tag="thinking"):
    thinking: str
    signature: str | UnsetType = UNSET


class RedactedThinkingBlock(_Wire, tag_field="type", tag="redacted_thinking"):
    data: str


class ToolUseBlock(_Wire, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl = UNSET


class ToolResultBlock(_Wire, tag_field="type", tag="tool_result"):
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool | UnsetType = UNSET
    cache_control: CacheControl = UNSET


Block = TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock


class InputMessage(_Wire):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class InputTool(_Wire):
    name: str
    input_schema: dict[str, Any]
    description: str | UnsetType = UNSET
    cache_control: CacheControl = UNSET


class ToolChoice(_Wire):
    type: Literal["auto", "any", "tool", "none"]
    name: str | UnsetType = UNSET


class Metadata(_Wire):
    user_id: str | None | UnsetType = UNSET


class MessagesRequest(_Wire, dict=True):
    raw_body: ClassVar[bool] = True  # kept as sent (gateway.body), for an Anthropic upstream

    model: str
    max_tokens: Annotated[int, Meta(ge=1, le=MAX_TOKEN_COUNT)]
    messages: Annotated[list[InputMessage], Meta(min_length=1)]
    system: str | list[TextBlock] | UnsetType = UNSET
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | UnsetType = UNSET
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] | UnsetType = UNSET
    top_k: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    stop_sequences: list[str] | UnsetType = UNSET
    stream: bool | UnsetType = UNSET
    tools: list[InputTool] | UnsetType = UNSET
    tool_choice: ToolChoice | UnsetType = UNSET
    metadata: Metadata | UnsetType = UNSET
    thinking: dict[str, Any] | UnsetType = UNSET  # extended thinking: {"type": "enabled", "budget_tokens"}


class CountTokensRequest(_Wire):
    """``POST /v1/messages/count_tokens``: a Messages request without its generation settings."""

    model: str
    messages: Annotated[list[InputMessage], Meta(min_length=1)]
    system: str | list[TextBlock] | UnsetType = UNSET
    tools: list[InputTool] | UnsetType = UNSET
    tool_choice: ToolChoice | UnsetType = UNSET

    def as_messages_request(self) -> MessagesRequest:
        return MessagesRequest(model=self.model, max_tokens=1, messages=self.messages, system=self.system,
                               tools=self.tools, tool_choice=self.tool_choice)


# ---------------------------------------------------------------- request -> OpenAI


def _result_text(block: ToolResultBlock) -> str:
    return block.content if isinstance(block.content, str) else "".join(b.text for b in block.content)


def _convert_message(message: InputMessage) -> list[ChatMessage]:
    if isinstance(message.content, str):
        return [ChatMessage(role=message.role, content=message.content)]
    parts: list[TextPart | ImagePart | FilePart] = []
    calls: list[ToolCall] = []
    results: list[ChatMessage] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            parts.append(TextPart(text=block.text))
        elif isinstance(block, ImageBlock):
            src = block.source
            url = src.url if src.type == "url" else f"data:{src.media_type};base64,{src.data}"
            parts.append(ImagePart(image_url=ImageURL(url=str(url))))
        elif isinstance(block, DocumentBlock):
            parts.append(_document_part(block))
        elif isinstance(block, ThinkingBlock | RedactedThinkingBlock):
            continue  # earlier thinking: only an Anthropic upstream uses it (it gets the request as sent)
        elif isinstance(block, ToolUseBlock):
            arguments = msgspec.json.encode(block.input).decode()
            calls.append(ToolCall(id=block.id, function=FunctionCall(name=block.name, arguments=arguments)))
        else:
            results.append(ChatMessage(role="tool", tool_call_id=block.tool_use_id, content=_result_text(block)))
    out = list(results)
    if parts or calls:
        converted = ChatMessage(role=message.role, content=parts or None)  # type: ignore[arg-type]
        if calls:
            converted.tool_calls = calls
        out.append(converted)
    return out


def _document_part(block: DocumentBlock) -> TextPart | FilePart:
    """A document for an OpenAI-shaped request: its text, or a PDF as a ``file`` part."""
    source = block.source
    if source.get("type") == "text" and isinstance(source.get("data"), str):
        return TextPart(text=source["data"])
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        media = source.get("media_type") or "application/pdf"
        return FilePart(file={"file_data": f"data:{media};base64,{source['data']}",
                              "filename": block.title or "document"})
    raise ApiError(400, f"document source of type {source.get('type')!r} is served only by Anthropic deployments",
                   param="messages")


def _tool_choice(choice: ToolChoice) -> str | dict[str, Any]:
    if choice.type == "tool":
        if not choice.name:
            raise ApiError(400, "tool_choice of type 'tool' needs a name", param="tool_choice.name")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def to_chat_request(req: MessagesRequest) -> ChatCompletionRequest:
    messages: list[ChatMessage] = []
    if req.system:
        system = req.system if isinstance(req.system, str) else "".join(b.text for b in req.system)
        messages.append(ChatMessage(role="system", content=system))
    for message in req.messages:
        messages.extend(_convert_message(message))
    chat = ChatCompletionRequest(model=req.model, messages=messages, max_tokens=req.max_tokens)
    if req.temperature is not UNSET:
        chat.temperature = req.temperature
    if req.top_p is not UNSET:
        chat.top_p = req.top_p
    if req.top_k is not UNSET:
        chat.top_k = req.top_k
    if req.stop_sequences:
        chat.stop = list(req.stop_sequences)  # all of them: a provider allowing fewer refuses, never a cut
    if req.tools:
        chat.tools = [Tool(function=FunctionDef(name=t.name, description=t.description, parameters=t.input_schema))
                      for t in req.tools]
    if req.tool_choice is not UNSET:
        chat.tool_choice = _tool_choice(req.tool_choice)
    if req.metadata is not UNSET and isinstance(req.metadata.user_id, str):
        chat.user = req.metadata.user_id
    if req.stream:
        chat.stream = True
        chat.stream_options = StreamOptions(include_usage=True)  # message_delta carries the usage
    if req.thinking is not UNSET:  # the engine refuses it by name; an OpenAI-shaped upstream gets it
        set_extra_params(chat, {"thinking": msgspec.Raw(msgspec.json.encode(req.thinking))})
    if (raw := req.__dict__.get(RAW_BODY)) is not None:  # an Anthropic upstream gets the request as sent
        chat.__dict__[ANTHROPIC_BODY] = msgspec.json.decode(raw)
    return chat


# ---------------------------------------------------------------- OpenAI -> response


def _usage(usage: Any) -> dict[str, int]:
    if not isinstance(usage, Usage):
        return {"input_tokens": 0, "output_tokens": 0}
    return {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}


def message_body(response: ChatCompletion) -> bytes:
    if (message := response.__dict__.get(ANTHROPIC_MESSAGE)) is not None:  # an Anthropic upstream's, as it came
        return msgspec.json.encode(message | {"model": response.model})
    choice = response.choices[0]
    content: list[dict[str, Any]] = []
    if choice.message.content:
        content.append({"type": "text", "text": choice.message.content})
    for call in choice.message.tool_calls or []:
        try:
            arguments = json.loads(call.function.arguments or "{}")
        except (ValueError, RecursionError):
            arguments = {}
        content.append({"type": "tool_use", "id": call.id, "name": call.function.name, "input": arguments})
    return msgspec.json.encode({
        "id": response.id, "type": "message", "role": "assistant", "model": response.model, "content": content,
        **_stop(choice.finish_reason, choice.stop_reason), "usage": _usage(response.usage),
    })


def _stop(finish: str | None, matched: Any) -> dict[str, Any]:
    """``stop_reason`` and ``stop_sequence``: a matched stop string is reported as ``stop_sequence``."""
    if finish == "stop" and isinstance(matched, str):
        return {"stop_reason": "stop_sequence", "stop_sequence": matched}
    return {"stop_reason": _FINISH_TO_STOP.get(finish or "stop", "end_turn"), "stop_sequence": None}


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode({"type": kind} | data) + b"\n\n"


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
        self._meter = meter  # the call's: the prompt's tokens for message_start
        self._relaying: bool | None = None  # decided by the first chunk
        self._started = False
        self._block: int = -1  # index of the open content block
        self._block_kind: str | None = None
        self._tools: dict[int, int] = {}  # OpenAI tool call index -> content block index
        self._stop: dict[str, Any] = {"stop_reason": "end_turn", "stop_sequence": None}
        self._usage: dict[str, int] = {"output_tokens": 0}

    def chunk(self, chunk: ChatCompletionChunk) -> bytes:
        events = anthropic_events(chunk)
        if self._relaying is None:
            self._relaying = events is not None
        if self._relaying:
            return b"".join(_relayed_event(e, chunk.model) for e in events or ())
        out = b""
        if not self._started:
            self._started = True
            out += _event("message_start", {"message": {
                "id": chunk.id, "type": "message", "role": "assistant", "model": chunk.model, "content": [],
                "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": self._meter.prompt_tokens if self._meter else 0, "output_tokens": 0}}})
        if isinstance(chunk.usage, Usage):
            self._usage = _usage(chunk.usage)
        for choice in chunk.choices[:1]:
            delta = choice.delta
            if isinstance(delta.reasoning_content, str) and delta.reasoning_content:
                if self._block_kind != "thinking":
                    out += self._open({"type": "thinking", "thinking": ""}, "thinking")
                out += _event("content_block_delta", {"index": self._block, "delta": {
                    "type": "thinking_delta", "thinking": delta.reasoning_content}})
            if isinstance(delta.content, str) and delta.content:
                if self._block_kind != "text":
                    out += self._open({"type": "text", "text": ""}, "text")
                out += _event("content_block_delta", {"index": self._block,
                                                      "delta": {"type": "text_delta", "text": delta.content}})
            for call in delta.tool_calls or []:
                if call.index not in self._tools:
                    function = call.function if isinstance(call.function, dict) else {}
                    out += self._open({"type": "tool_use", "id": call.id or "", "name": function.get("name", ""),
                                       "input": {}}, "tool_use")
                    self._tools[call.index] = self._block
                arguments = call.function.get("arguments") if isinstance(call.function, dict) else None
                if arguments:
                    out += _event("content_block_delta", {"index": self._tools[call.index],
                                                          "delta": {"type": "input_json_delta",
                                                                    "partial_json": arguments}})
            if choice.finish_reason:
                self._stop = _stop(choice.finish_reason, choice.stop_reason)
        return out

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
        if self._relaying:  # message_stop came from the upstream
            return b""
        return (self._close()
                + _event("message_delta", {"delta": self._stop,
                                           "usage": self._usage})
                + _event("message_stop", {}))

    def error(self, error: ApiError) -> bytes:
        kind = {429: "rate_limit_error", 503: "overloaded_error", 400: "invalid_request_error"}.get(
            error.status, "api_error")
        return _event("error", {"error": {"type": kind, "message": error.message}})


ANTHROPIC = Dialect(unary=message_body, stream=MessagesEvents)

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def _in_anthropic_shape(handler: Callable[[Request[Any, Any, Any], Any], Response[bytes]]) -> Callable[..., Any]:
    """Wrap one of the gateway's exception handlers to answer in Anthropic's error shape."""

    def handle(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
        response = handler(request, exc)
        error = msgspec.json.decode(response.content)["error"]
        body = {"type": "error", "error": {"type": _ERROR_TYPES.get(response.status_code or 500, "api_error"),
                                           "message": error["message"]}}
        return Response(content=msgspec.json.encode(body), status_code=response.status_code,
                        media_type="application/json", headers=dict(response.headers))

    return handle


def error_handlers() -> dict[Any, Callable[..., Any]]:
    """The gateway's exception handlers, answering in Anthropic's error shape."""
    return {exc: _in_anthropic_shape(h) for exc, h in exception_handlers.items()}  # type: ignore[arg-type]  # handlers are typed per exception
