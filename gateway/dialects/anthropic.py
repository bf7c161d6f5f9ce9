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
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, Response
from msgspec import UNSET, Meta, Struct, UnsetType

from backends.openai_wire import (
    MAX_TOKEN_COUNT,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDef,
    ImagePart,
    ImageURL,
    StreamOptions,
    TextPart,
    Tool,
    ToolCall,
    Usage,
)
from gateway.dialects import Dialect
from gateway.errors import ApiError, exception_handlers

_FINISH_TO_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                   "content_filter": "refusal", "function_call": "tool_use"}


class _Wire(Struct, kw_only=True):
    pass


class TextBlock(_Wire, tag_field="type", tag="text"):
    text: str


class ImageSource(_Wire):
    type: Literal["base64", "url"]
    media_type: str | UnsetType = UNSET
    data: str | UnsetType = UNSET
    url: str | UnsetType = UNSET


class ImageBlock(_Wire, tag_field="type", tag="image"):
    source: ImageSource


class ToolUseBlock(_Wire, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Wire, tag_field="type", tag="tool_result"):
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool | UnsetType = UNSET


Block = TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock


class InputMessage(_Wire):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class InputTool(_Wire):
    name: str
    input_schema: dict[str, Any]
    description: str | UnsetType = UNSET


class ToolChoice(_Wire):
    type: Literal["auto", "any", "tool", "none"]
    name: str | UnsetType = UNSET


class Metadata(_Wire):
    user_id: str | None | UnsetType = UNSET


class MessagesRequest(_Wire):
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


# ---------------------------------------------------------------- request -> OpenAI


def _result_text(block: ToolResultBlock) -> str:
    return block.content if isinstance(block.content, str) else "".join(b.text for b in block.content)


def _convert_message(message: InputMessage) -> list[ChatMessage]:
    if isinstance(message.content, str):
        return [ChatMessage(role=message.role, content=message.content)]
    parts: list[TextPart | ImagePart] = []
    calls: list[ToolCall] = []
    results: list[ChatMessage] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            parts.append(TextPart(text=block.text))
        elif isinstance(block, ImageBlock):
            src = block.source
            url = src.url if src.type == "url" else f"data:{src.media_type};base64,{src.data}"
            parts.append(ImagePart(image_url=ImageURL(url=str(url))))
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
        chat.stop = req.stop_sequences[:4]
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
    return chat


# ---------------------------------------------------------------- OpenAI -> response


def _usage(usage: Any) -> dict[str, int]:
    if not isinstance(usage, Usage):
        return {"input_tokens": 0, "output_tokens": 0}
    return {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}


def message_body(response: ChatCompletion) -> bytes:
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
        "stop_reason": _FINISH_TO_STOP.get(choice.finish_reason or "stop", "end_turn"), "stop_sequence": None,
        "usage": _usage(response.usage),
    })


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode({"type": kind} | data) + b"\n\n"


class MessagesEvents:
    """OpenAI chunks -> Anthropic stream events (a ``gateway.streaming.StreamEncoder``)."""

    def __init__(self) -> None:
        self._started = False
        self._block: int = -1  # index of the open content block
        self._block_kind: str | None = None
        self._tools: dict[int, int] = {}  # OpenAI tool call index -> content block index
        self._stop = "end_turn"
        self._usage: dict[str, int] = {"output_tokens": 0}

    def chunk(self, chunk: ChatCompletionChunk) -> bytes:
        out = b""
        if not self._started:
            self._started = True
            out += _event("message_start", {"message": {
                "id": chunk.id, "type": "message", "role": "assistant", "model": chunk.model, "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}})
        if isinstance(chunk.usage, Usage):
            self._usage = _usage(chunk.usage)
        for choice in chunk.choices[:1]:
            delta = choice.delta
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
                self._stop = _FINISH_TO_STOP.get(choice.finish_reason, "end_turn")
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
        return (self._close()
                + _event("message_delta", {"delta": {"stop_reason": self._stop, "stop_sequence": None},
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
        body = {"type": "error", "error": {"type": _ERROR_TYPES.get(response.status_code, "api_error"),
                                           "message": error["message"]}}
        return Response(content=msgspec.json.encode(body), status_code=response.status_code,
                        media_type="application/json", headers=dict(response.headers))

    return handle


def error_handlers() -> dict[Any, Callable[..., Any]]:
    """The gateway's exception handlers, answering in Anthropic's error shape."""
    return {exc: _in_anthropic_shape(h) for exc, h in exception_handlers.items()}
