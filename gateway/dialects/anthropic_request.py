"""Anthropic's Messages API requests at the gateway's edge (``POST /v1/messages`` and
``/v1/messages/count_tokens``): what is decoded, and the translation to an OpenAI chat request.

The gateway decodes only what it reads for every provider (model, limits, the messages' roles,
``stream``); content blocks, tools and ``tool_choice`` are kept as the client sent them, so a request
routed to a deployment that speaks the Messages API itself (``ServesMessages``) goes as sent, block
and tool types the gateway does not know included. Only the translation for another provider reads
them, into the Structs below: what OpenAI's shape cannot carry is then a 400 naming the field
(``to_chat_request``). ``as_sent`` is the request for a Messages deployment: the body as sent, on a
best-effort translation that only sizes the call (estimates, routing key), where what cannot be
translated stands in as its JSON text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, Protocol, TypeVar, runtime_checkable

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from backends.anthropic import forward_client_headers
from backends.openai_wire import (
    ANTHROPIC_BODY,
    MAX_TOKEN_COUNT,
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
    extra_params,
    set_extra_params,
)
from gateway.body import RAW_BODY
from gateway.dialects.anthropic_output import add_output_config
from gateway.dialects.unmodelled import unmodelled_field
from gateway.errors import ApiError

T = TypeVar("T")


@runtime_checkable
class ServesMessages(Protocol):
    """A backend whose upstream speaks Anthropic's Messages API (``backends.anthropic``): it is given
    a /v1/messages request as the client sent it (``as_sent``) instead of its translation."""

    def serves_messages(self) -> bool: ...


def serves_messages(backend: Any) -> bool:
    return isinstance(backend, ServesMessages) and backend.serves_messages()


class _Wire(Struct, kw_only=True):
    pass


CacheControl = dict[str, Any] | None | UnsetType  # {"type": "ephemeral", "ttl"?}: for an Anthropic upstream only


# ---------------------------------------------------------------- what the gateway decodes


class InputMessage(_Wire):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]  # blocks as sent: read only when translated


class Metadata(_Wire):
    user_id: str | None | UnsetType = UNSET


class MessagesRequest(_Wire, dict=True):
    raw_body: ClassVar[bool] = True  # kept as sent (gateway.body), for an Anthropic upstream

    model: str
    max_tokens: Annotated[int, Meta(ge=1, le=MAX_TOKEN_COUNT)]
    messages: Annotated[list[InputMessage], Meta(min_length=1)]
    system: str | list[dict[str, Any]] | UnsetType = UNSET
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | UnsetType = UNSET
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] | UnsetType = UNSET
    top_k: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    stop_sequences: list[str] | UnsetType = UNSET
    stream: bool | UnsetType = UNSET
    tools: list[dict[str, Any]] | UnsetType = UNSET  # client tools, and server tools (a "type", no input_schema)
    tool_choice: dict[str, Any] | UnsetType = UNSET
    metadata: Metadata | UnsetType = UNSET
    thinking: dict[str, Any] | UnsetType = UNSET  # extended thinking: {"type": "enabled", "budget_tokens"}
    output_config: dict[str, Any] | None | UnsetType = UNSET  # structured output, effort: anthropic_output
    cache_control: CacheControl = UNSET  # automatic prompt caching: a hint no other provider takes


class CountTokensRequest(_Wire, dict=True):
    """``POST /v1/messages/count_tokens``: a Messages request without its generation settings."""

    raw_body: ClassVar[bool] = True  # an Anthropic upstream counts the body as sent

    model: str
    messages: Annotated[list[InputMessage], Meta(min_length=1)]
    system: str | list[dict[str, Any]] | UnsetType = UNSET
    tools: list[dict[str, Any]] | UnsetType = UNSET
    tool_choice: dict[str, Any] | UnsetType = UNSET

    def as_messages_request(self) -> MessagesRequest:
        request = MessagesRequest(model=self.model, max_tokens=1, messages=self.messages, system=self.system,
                                  tools=self.tools, tool_choice=self.tool_choice)
        if (raw := self.__dict__.get(RAW_BODY)) is not None:
            request.__dict__[RAW_BODY] = raw
        return request


# ---------------------------------------------------------------- what a translation reads


class TextBlock(_Wire, tag_field="type", tag="text"):
    text: str
    cache_control: CacheControl = UNSET


class ImageSource(_Wire):
    type: str  # base64 and url translate; file (the Files API) and newer kinds only pass as sent
    media_type: str | UnsetType = UNSET
    data: str | UnsetType = UNSET
    url: str | UnsetType = UNSET
    file_id: str | UnsetType = UNSET


class ImageBlock(_Wire, tag_field="type", tag="image"):
    source: ImageSource
    cache_control: CacheControl = UNSET


class DocumentBlock(_Wire, tag_field="type", tag="document"):
    source: dict[str, Any]  # base64 (a PDF) and text translate; url, content and file only pass as sent
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
    content: str | list[dict[str, Any]] = ""
    is_error: bool | UnsetType = UNSET
    cache_control: CacheControl = UNSET


Block = TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
_BLOCK_TYPES = frozenset({"text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking"})


class InputTool(_Wire):
    name: str
    input_schema: dict[str, Any]
    type: Literal["custom"] | None | UnsetType = UNSET  # a client tool's (a server tool is refused before it is read)
    description: str | UnsetType = UNSET
    strict: bool | UnsetType = UNSET  # strict tool use: the input follows input_schema (OpenAI's function.strict)
    cache_control: CacheControl = UNSET
    eager_input_streaming: bool | None | UnsetType = UNSET  # fine-grained tool streaming: a delivery hint, left out


class ToolChoice(_Wire):
    type: str
    name: str | UnsetType = UNSET
    disable_parallel_tool_use: bool | UnsetType = UNSET


_MISSING = re.compile(r"Object missing required field `([^`]+)`")
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
_ONLY_ANTHROPIC = "is served only by Anthropic deployments"


# ---------------------------------------------------------------- request -> OpenAI


def check_content(messages: list[InputMessage]) -> None:
    """Anthropic's rule: every message has content, but for a final assistant message (a prefill)."""
    last = len(messages) - 1
    for i, message in enumerate(messages):
        if not message.content and not (i == last and message.role == "assistant"):
            param = f"messages[{i}].content"
            raise ApiError(400, f"{param}: a message's content must not be empty (only a final assistant "
                                "message may have none)", param=param, code="invalid_value")


def check_prefill(messages: list[InputMessage]) -> None:
    """Anthropic's rule: a final assistant message (a prefill) does not end in whitespace."""
    last = messages[-1]
    blocks = [{"type": "text", "text": last.content}] if isinstance(last.content, str) else last.content
    text = blocks[-1].get("text") if blocks and blocks[-1].get("type") == "text" else None
    if last.role == "assistant" and isinstance(text, str) and text != text.rstrip():
        param = f"messages[{len(messages) - 1}].content"
        raise ApiError(400, f"{param}: final assistant content cannot end with trailing whitespace",
                       param=param, code="invalid_value")


def _stand_in(value: Any) -> TextPart:
    """What cannot be translated, as text: sizes the call for a deployment that gets it as sent."""
    return TextPart(text=msgspec.json.encode(value).decode())


class _Translation:
    """One request translated. ``strict``: what OpenAI's shape cannot carry is a 400 naming the
    field; else a stand-in (``_stand_in``)."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict

    def refuse(self, param: str, message: str) -> None:
        if self.strict:  # the message names the field: Anthropic's error shape has no ``param``
            raise ApiError(400, f"{param}: {message}", param=param, code="invalid_value")

    def convert(self, value: Any, type_: type[T], param: str) -> T | None:
        try:
            converted = msgspec.convert(value, type_)
        except msgspec.ValidationError as exc:
            problem, sep, where = str(exc).rpartition(" - at `$")
            if not sep:
                problem, where = str(exc), "`"
            param += where[:-1]
            if missing := _MISSING.match(problem):
                param, problem = f"{param}.{missing.group(1)}", "a required field is missing"
            self.refuse(param, problem)
            return None
        self.unmodelled(value, converted, param)
        return converted

    def unmodelled(self, raw: Any, value: Any, where: str) -> None:
        """A field of ``raw`` (the JSON ``value`` was read from) that the translation would drop."""
        if self.strict and (path := unmodelled_field(raw, value, where)):
            self.refuse(path, f"the field {path.rpartition('.')[2]!r} {_ONLY_ANTHROPIC}")

    def block(self, raw: dict[str, Any], where: str) -> Block | None:
        kind = raw.get("type")
        if kind not in _BLOCK_TYPES:
            self.refuse(f"{where}.type", f"a content block of type {kind!r} {_ONLY_ANTHROPIC}")
            return None
        return self.convert(raw, Block, where)  # type: ignore[arg-type]  # a union of Structs converts

    def message(self, message: InputMessage, i: int) -> list[ChatMessage]:
        if isinstance(message.content, str):
            return [ChatMessage(role=message.role, content=message.content)]
        parts: list[TextPart | ImagePart | FilePart] = []
        calls: list[ToolCall] = []
        results: list[ChatMessage] = []
        for j, raw in enumerate(message.content):
            where = f"messages[{i}].content[{j}]"
            block = self.block(raw, where)
            if block is None:
                parts.append(_stand_in(raw))
            elif isinstance(block, TextBlock):
                parts.append(TextPart(text=block.text))
            elif isinstance(block, ImageBlock):
                parts.append(self.image(block, raw, where))
            elif isinstance(block, DocumentBlock):
                parts.append(self.document(block, raw, where))
            elif isinstance(block, ThinkingBlock | RedactedThinkingBlock):
                continue  # earlier thinking: only an Anthropic upstream uses it (it gets the request as sent)
            elif isinstance(block, ToolUseBlock):
                arguments = msgspec.json.encode(block.input).decode()
                calls.append(ToolCall(id=block.id, function=FunctionCall(name=block.name, arguments=arguments)))
            else:
                results.append(self.tool_result(block, where))
        out = list(results)
        if parts or calls:
            converted = ChatMessage(role=message.role, content=parts or None)  # type: ignore[arg-type]
            if calls:
                converted.tool_calls = calls
            out.append(converted)
        return out

    def image(self, block: ImageBlock, raw: dict[str, Any], where: str) -> ImagePart | TextPart:
        src = block.source
        if src.type == "url" and isinstance(src.url, str):
            return ImagePart(image_url=ImageURL(url=src.url))
        if src.type == "base64" and isinstance(src.data, str) and isinstance(src.media_type, str):
            return ImagePart(image_url=ImageURL(url=f"data:{src.media_type};base64,{src.data}"))
        if src.type in ("url", "base64"):
            self.refuse(f"{where}.source", f"an image source of type {src.type!r} needs "
                        + ("a url" if src.type == "url" else "media_type and data"))
        else:
            self.refuse(f"{where}.source.type", f"an image source of type {src.type!r} {_ONLY_ANTHROPIC}")
        return _stand_in(raw)

    def document(self, block: DocumentBlock, raw: dict[str, Any], where: str) -> TextPart | FilePart:
        """A document: its text, or a PDF as a ``file`` part."""
        source = block.source
        if source.get("type") == "text" and isinstance(source.get("data"), str):
            return TextPart(text=source["data"])
        if source.get("type") == "base64" and isinstance(source.get("data"), str):
            media = source.get("media_type") or "application/pdf"
            return FilePart(file={"file_data": f"data:{media};base64,{source['data']}",
                                  "filename": block.title or "document"})
        if source.get("type") in ("text", "base64"):
            self.refuse(f"{where}.source.data", f"a document source of type {source['type']!r} needs its data")
        else:
            self.refuse(f"{where}.source.type",
                        f"a document source of type {source.get('type')!r} {_ONLY_ANTHROPIC}")
        return _stand_in(raw)

    def tool_result(self, block: ToolResultBlock, where: str) -> ChatMessage:
        if isinstance(block.content, str):
            text = block.content
        else:  # OpenAI's tool message holds text only: text blocks, one per line
            texts = []
            for k, item in enumerate(block.content):
                at = f"{where}.content[{k}]"
                if item.get("type") == "text" and (part := self.convert(item, TextBlock, at)) is not None:
                    texts.append(part.text)
                    continue
                if item.get("type") != "text":  # a text block that does not convert is refused as such
                    self.refuse(f"{at}.type", f"a tool result holding a {item.get('type')!r} block {_ONLY_ANTHROPIC}")
                texts.append(_stand_in(item).text)
            text = "\n".join(texts)
        if block.is_error is True:
            # OpenAI's shape has no is_error. A failed tool is routine in an agent loop, so refusing it
            # would break the loop, and dropping the flag would pass the error text off as a result:
            # the model is told in the text, as OpenAI's own guides report a tool's failure.
            text = f"[tool error] {text}" if text else "[tool error]"
        return ChatMessage(role="tool", tool_call_id=block.tool_use_id, content=text)

    def system(self, system: str | list[dict[str, Any]]) -> str:
        if isinstance(system, str):
            return system
        texts = []
        for i, raw in enumerate(system):
            block = self.block(raw, f"system[{i}]")
            if isinstance(block, TextBlock):
                texts.append(block.text)
            else:
                if block is not None:
                    self.refuse(f"system[{i}].type", "a system prompt holds text blocks only")
                texts.append(_stand_in(raw).text)
        return "\n".join(texts)  # one per line: "S1" and "S2" must not become "S1S2"

    def tool(self, raw: dict[str, Any], i: int) -> Tool:
        kind = raw.get("type")
        if kind not in (None, "custom"):
            self.refuse(f"tools[{i}].type", f"a tool of type {kind!r} (a server tool) {_ONLY_ANTHROPIC}")
        elif (tool := self.convert(raw, InputTool, f"tools[{i}]")) is not None:
            return Tool(function=FunctionDef(name=tool.name, description=tool.description,
                                             parameters=tool.input_schema, strict=tool.strict))
        name = raw.get("name")
        return Tool(function=FunctionDef(name=name if isinstance(name, str) else str(kind or "tool"),
                                         description=_stand_in(raw).text))

    def tool_choice(self, raw: dict[str, Any], chat: ChatCompletionRequest) -> None:
        choice = self.convert(raw, ToolChoice, "tool_choice")
        if choice is None:
            return
        if choice.type == "tool":
            if not choice.name:
                self.refuse("tool_choice.name", "tool_choice of type 'tool' needs a name")
                return
            chat.tool_choice = {"type": "function", "function": {"name": choice.name}}
        elif choice.type in _TOOL_CHOICES:
            chat.tool_choice = _TOOL_CHOICES[choice.type]
        else:
            self.refuse("tool_choice.type", f"a tool_choice of type {choice.type!r} {_ONLY_ANTHROPIC}")
            return
        if choice.disable_parallel_tool_use is True:
            chat.parallel_tool_calls = False


_KNOWN_FIELDS = frozenset(f.encode_name for f in msgspec.structs.fields(MessagesRequest))
_MESSAGE_FIELDS = frozenset(f.encode_name for f in msgspec.structs.fields(InputMessage))
_METADATA_FIELDS = frozenset(f.encode_name for f in msgspec.structs.fields(Metadata))
_fields_of = msgspec.json.Decoder(dict[str, msgspec.Raw])
_messages_of = msgspec.json.Decoder(list[dict[str, msgspec.Raw]])  # their content stays undecoded


def _refuse_unknown_fields(req: MessagesRequest, translation: _Translation) -> None:
    """A field the gateway does not model, at the top (``mcp_servers``, ``container``,
    ``service_tier``, a typo), in a message or in ``metadata`` (blocks, tools and ``tool_choice`` are
    checked as they are read): only an Anthropic upstream can honour it, so a translation refuses it
    rather than drop it (null changes nothing)."""
    if (raw := req.__dict__.get(RAW_BODY)) is None:
        return
    fields = _fields_of.decode(raw)
    _refuse_unmodelled(fields, _KNOWN_FIELDS, translation)
    if (messages := fields.get("messages")) is not None:
        for i, message in enumerate(_messages_of.decode(messages)):
            _refuse_unmodelled(message, _MESSAGE_FIELDS, translation, f"messages[{i}].")
    if isinstance(req.metadata, Metadata):  # decoded, so an object (count_tokens reads none)
        _refuse_unmodelled(_fields_of.decode(fields["metadata"]), _METADATA_FIELDS, translation, "metadata.")


def _refuse_unmodelled(fields: dict[str, msgspec.Raw], known: frozenset[str], translation: _Translation,
                       where: str = "") -> None:
    for name, value in fields.items():
        if name not in known and bytes(value).strip() != b"null":
            translation.refuse(where + name, f"the field {name!r} {_ONLY_ANTHROPIC}")


def to_chat_request(req: MessagesRequest, *, strict: bool = True) -> ChatCompletionRequest:
    """The OpenAI chat request for ``req``; with ``strict`` (for any provider but Anthropic) what
    cannot be translated is a 400 naming the field, else it stands in as its JSON text."""
    return translate(req, strict=strict)[0]


def translate(req: MessagesRequest, *, strict: bool = True) -> tuple[ChatCompletionRequest, list[str]]:
    """``to_chat_request``, with where each chat message came from (``system`` or ``messages[i]``),
    for errors that name one (``anthropic_params``)."""
    check_content(req.messages)
    translation = _Translation(strict)
    if strict:  # an Anthropic upstream applies its rules itself
        check_prefill(req.messages)
        _refuse_unknown_fields(req, translation)
    messages: list[ChatMessage] = []
    origins: list[str] = []
    if req.system and (system := translation.system(req.system)):
        messages.append(ChatMessage(role="system", content=system))
        origins.append("system")
    for i, message in enumerate(req.messages):
        converted = translation.message(message, i)
        messages.extend(converted)
        origins.extend([f"messages[{i}]"] * len(converted))
    chat = ChatCompletionRequest(model=req.model, messages=messages, max_tokens=req.max_tokens)
    _prefill(chat)
    if req.temperature is not UNSET:
        chat.temperature = req.temperature
    if req.top_p is not UNSET:
        chat.top_p = req.top_p
    if req.top_k is not UNSET:
        chat.top_k = req.top_k
    if req.stop_sequences:
        chat.stop = list(req.stop_sequences)  # all of them: a provider allowing fewer refuses, never a cut
    if req.tools:
        chat.tools = [translation.tool(tool, i) for i, tool in enumerate(req.tools)]
    if req.tool_choice is not UNSET:
        translation.tool_choice(req.tool_choice, chat)
    if strict and isinstance(req.output_config, dict):  # an Anthropic upstream gets it as sent
        add_output_config(req.output_config, chat, translation)
    if req.metadata is not UNSET and isinstance(req.metadata.user_id, str):
        chat.user = req.metadata.user_id
    if req.stream:
        chat.stream = True
        chat.stream_options = StreamOptions(include_usage=True)  # message_delta carries the usage
    if req.thinking is not UNSET and req.thinking.get("type") != "disabled":  # (disabled asks for nothing)
        # the engine refuses it by name; an OpenAI-shaped upstream gets it
        set_extra_params(chat, extra_params(chat) | {"thinking": msgspec.Raw(msgspec.json.encode(req.thinking))})
    return chat, origins


# vLLM's (and SGLang's) chat fields for an answer that continues the final assistant message.
_CONTINUE = {"continue_final_message": msgspec.Raw(b"true"), "add_generation_prompt": msgspec.Raw(b"false")}


def _prefill(chat: ChatCompletionRequest) -> None:
    """A final assistant message (Anthropic's prefill) is the start of the answer, which continues it
    (the answer holds only what follows, as Anthropic's does): it goes last, with ``_CONTINUE``. One
    without text asks for nothing: it is left out (unless it is all there is), and the answer is a new turn."""
    last = chat.messages[-1] if chat.messages else None
    if last is None or last.role != "assistant" or last.tool_calls:
        return
    if last.text():
        set_extra_params(chat, extra_params(chat) | _CONTINUE)
    elif len(chat.messages) > 1:
        chat.messages.pop()


def as_sent(req: MessagesRequest, headers: Mapping[str, str]) -> ChatCompletionRequest:
    """The request for a ``ServesMessages`` deployment: the body and the ``anthropic-*`` headers as
    the client sent them, on a best-effort translation that sizes the call."""
    chat = to_chat_request(req, strict=False)
    if (raw := req.__dict__.get(RAW_BODY)) is not None:
        chat.__dict__[ANTHROPIC_BODY] = msgspec.json.decode(raw)
    forward_client_headers(chat, headers)
    return chat
