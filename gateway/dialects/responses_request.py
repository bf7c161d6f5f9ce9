"""OpenAI's Responses API requests at the gateway's edge (``POST /v1/responses``): what is decoded,
and the translation to an OpenAI chat request (``to_chat_request``), so a call is authenticated,
admitted, routed and metered like chat. A field is either mapped to chat or a 400 naming it, never
dropped; errors about the chat request name the Responses field where the mapping is known
(``responses_params``). ``sent_items`` gives a request's input as a kept conversation holds it,
``listed`` as ``input_items`` lists it (with ids), ``echoed_fields`` the request's settings as a
response object reports them. The answers' side is ``gateway.dialects.responses``.
"""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from backends.openai_wire import (
    MAX_TOKEN_COUNT,
    ChatCompletionRequest,
    ChatMessage,
    FilePart,
    FunctionCall,
    FunctionDef,
    ImagePart,
    ImageURL,
    JSONSchemaFormat,
    RefusalPart,
    ResponseFormat,
    StreamOptions,
    TextPart,
    Tool,
    ToolCall,
    set_extra_params,
)
from backends.turn_thinking import place_thinking
from gateway.body import RAW_BODY, validation_error
from gateway.dialects.responses_reasoning import asks_encrypted_content, decoded_blocks, honoured_include, restored
from gateway.dialects.unmodelled import unmodelled_field
from gateway.errors import ApiError


class _Wire(Struct, kw_only=True):
    pass


class InputText(_Wire, tag_field="type", tag="input_text"):
    text: str


class OutputText(_Wire, tag_field="type", tag="output_text"):
    text: str


class Refusal(_Wire, tag_field="type", tag="refusal"):
    """An assistant message's refusal, as a response's output gives it (chat's ``refusal`` part)."""

    refusal: str


class InputImage(_Wire, tag_field="type", tag="input_image", forbid_unknown_fields=True):
    """An image by URL or data URL (chat's ``image_url`` part); chat has no image by ``file_id``."""

    image_url: str
    detail: Literal["low", "high", "auto"] | UnsetType = UNSET


class InputFile(_Wire, tag_field="type", tag="input_file", forbid_unknown_fields=True):
    """A file by id or as data (chat's ``file`` part); chat has no file by URL."""

    file_id: str | UnsetType = UNSET
    file_data: str | UnsetType = UNSET
    filename: str | UnsetType = UNSET


Part = InputText | OutputText | Refusal | InputImage | InputFile


class MessageItem(_Wire, tag_field="type", tag="message"):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | Annotated[list[Part], Meta(min_length=1)]


class FunctionCallItem(_Wire, tag_field="type", tag="function_call"):
    call_id: str
    name: str
    arguments: str
    id: str | UnsetType = UNSET


class FunctionCallOutputItem(_Wire, tag_field="type", tag="function_call_output"):
    call_id: str
    output: str | list[InputText | InputImage | InputFile]  # chat's tool message holds text only (``_items``)


class ReasoningItem(_Wire, tag_field="type", tag="reasoning"):
    """Earlier reasoning, as a response's output gives it: its text not sent to chat, which has no
    field for it (DeepSeek refuses ``reasoning_content`` in its input); the answer is in the message.
    Thinking blocks its ``encrypted_content`` carries (the gateway's: ``responses_reasoning``) go with
    the assistant turn after it, in their place there, for a provider that takes them back
    (``backends.turn_thinking``); another's blob is read nowhere."""

    summary: list[dict[str, Any]]
    encrypted_content: Any = None


Item = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
_ITEM: Any = Item  # for ``_convert``, which takes a type
# An answer's fields, on output items a client sends back as they came: they ask nothing of the next one.
_ANSWER_ONLY: dict[type, frozenset[str]] = {t: frozenset(f.split()) for t, f in [
    (MessageItem, "id status phase"), (OutputText, "annotations logprobs"), (ReasoningItem, "id status content"),
    (FunctionCallItem, "status caller namespace async"), (FunctionCallOutputItem, "id status caller name namespace")]}


# What is translated to chat is read strictly: a field these do not model is a 400 naming it.
class FunctionTool(_Wire, tag_field="type", tag="function", forbid_unknown_fields=True):
    name: str
    parameters: dict[str, Any] | None = None
    description: str | None | UnsetType = UNSET
    strict: bool | None | UnsetType = UNSET


class TextFormat(_Wire, forbid_unknown_fields=True):
    type: Literal["text", "json_object", "json_schema"]
    name: str | UnsetType = UNSET
    schema: dict[str, Any] | UnsetType = UNSET
    description: str | None | UnsetType = UNSET
    strict: bool | None | UnsetType = UNSET


class TextConfig(_Wire, forbid_unknown_fields=True):
    format: TextFormat | None | UnsetType = UNSET
    verbosity: Literal["low", "medium", "high"] | None | UnsetType = UNSET


class FunctionChoice(_Wire, tag_field="type", tag="function", forbid_unknown_fields=True):
    name: str


class AllowedTools(_Wire, tag_field="type", tag="allowed_tools", forbid_unknown_fields=True):
    mode: Literal["auto", "required"]
    tools: Annotated[list[FunctionChoice], Meta(min_length=1)]


_TOOL_CHOICE: Any = FunctionChoice | AllowedTools  # for ``_convert``, which takes a type


class ResponsesRequest(_Wire, dict=True):
    raw_body: ClassVar[bool] = True  # kept as sent (gateway.body), for an upstream that serves Responses

    model: str
    input: str | list[dict[str, Any]]  # items; checked where translated (``_items``), as sent otherwise
    instructions: str | None | UnsetType = UNSET
    tools: list[dict[str, Any]] | None | UnsetType = UNSET  # function tools where translated (``_function_tools``)
    tool_choice: str | dict[str, Any] | None | UnsetType = UNSET  # checked where translated (``_tool_choice``)
    text: dict[str, Any] | None | UnsetType = UNSET  # checked where translated (``TextConfig``)
    max_output_tokens: Annotated[int, Meta(ge=1, le=MAX_TOKEN_COUNT)] | None | UnsetType = UNSET
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None | UnsetType = UNSET
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None | UnsetType = UNSET
    stream: bool | None | UnsetType = UNSET
    store: bool | None | UnsetType = UNSET
    previous_response_id: str | None | UnsetType = UNSET
    user: str | None | UnsetType = UNSET
    parallel_tool_calls: bool | None | UnsetType = UNSET
    metadata: dict[str, Any] | None | UnsetType = UNSET  # the response's own, never sent to chat (``_check_metadata``)


# Fields of the Responses API with no chat equivalent, and the values that ask for nothing (so a
# translated request may carry them); any other value is a 400 naming the field. ``include`` may
# also ask for reasoning's ``encrypted_content`` (``responses_reasoning``), and nothing else.
_NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "include": (None,), "truncation": (None, "disabled"), "background": (None, False),
    "reasoning": (None, {}), "prompt": (None,), "conversation": (None,), "max_tool_calls": (None,),
    "context_management": (None, []), "moderation": (None,),
    "stream_options": (None, {}, {"include_obfuscation": False}),  # the gateway's streams are never obfuscated
    "top_logprobs": (None, 0),  # a translated answer carries no log-probabilities back
}
# Fields passed on to a chat provider under the same name (the built-in engine checks them itself).
_CHAT_SAME_NAME = ("service_tier", "prompt_cache_key", "safety_identifier")


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
        elif name == "reasoning" and isinstance(value, dict):
            if (effort := _reasoning_effort(value)) is not None:
                extras["reasoning_effort"] = effort
        elif name == "include" and honoured_include(value):
            continue
        elif value not in _NO_OP_VALUES.get(name, ()):
            raise _unsupported(name)
    return extras


def _reasoning_effort(reasoning: dict[str, Any]) -> msgspec.Raw | None:
    """``reasoning.effort`` as chat's ``reasoning_effort``; a field of ``reasoning`` chat cannot express
    (a ``summary`` other than ``auto``: no summaries come back through chat) is a 400 naming it."""
    for key, value in reasoning.items():
        if key not in ("effort", "summary") or (key == "summary" and value not in (None, "auto")):
            raise _unsupported(f"reasoning.{key}")
    effort = reasoning.get("effort")
    return None if effort is None else msgspec.Raw(msgspec.json.encode(effort))


def _unsupported(param: str) -> ApiError:
    return ApiError(400, f"'{param}' is not supported for this model: it is served through chat completions, "
                    "which have no equivalent", param=param, code="unsupported_parameter")


def _check_metadata(metadata: dict[str, Any] | None | UnsetType) -> None:
    """``metadata`` within the Responses API's limits (16 pairs, keys of 64 characters, string values
    of 512), or a 400 naming it. It tags the response object; chat providers refuse it (OpenAI's
    without ``store``, Anthropic's beyond ``user_id``), so it is never sent to chat."""
    if not isinstance(metadata, dict):
        return
    if len(metadata) > 16:
        raise ApiError(400, "invalid value for 'metadata': at most 16 pairs", param="metadata", code="invalid_value")
    for key, value in metadata.items():
        if len(key) > 64 or not isinstance(value, str) or len(value) > 512:
            raise ApiError(400, f"invalid value for 'metadata': key {key[:70]!r}: keys are strings of at most 64 "
                           "characters, values strings of at most 512", param="metadata", code="invalid_value")


_T = TypeVar("_T")
_UNKNOWN_FIELD = re.compile(r"Object contains unknown field `([^`]+)`")


def _convert(value: Any, type_: type[_T], where: str) -> _T:
    """``value`` read as ``type_``, or a 400 naming the field inside ``where`` (``input[0].role``)."""
    try:
        return msgspec.convert(value, type_)
    except msgspec.ValidationError as exc:
        error = validation_error(exc)  # names the field relative to ``value``
        param = f"{where}.{error.param}" if error.param else where
        if error.code == "missing_required_parameter":
            raise ApiError(400, f"missing required parameter '{param}'", param=param, code=error.code) from None
        problem = str(exc).rpartition(" - at `")[0] or str(exc)
        if unknown := _UNKNOWN_FIELD.match(problem):
            param = f"{param}.{unknown.group(1)}"
            raise ApiError(400, f"'{param}' is not supported for this model: it is served through chat "
                           "completions, which have no equivalent", param=param, code="unsupported_parameter") from None
        raise ApiError(400, f"invalid value for '{param}': {problem}", param=param, code=error.code) from None


# Fields of a function tool with no chat equivalent, and the values that ask for nothing.
_TOOL_NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "defer_loading": (None, False), "async": (None, False), "allowed_callers": (None, ["direct"]),
    "output_schema": (None,),
}


def _function_tools(tools: list[dict[str, Any]]) -> list[Tool]:
    out: list[Tool] = []
    for i, entry in enumerate(tools):
        if (kind := entry.get("type")) != "function":  # a dict: ``ResponsesRequest.tools`` holds only dicts
            raise ApiError(400, f"tools[{i}]: a {kind!r} tool is not supported for this model: it is served through "
                           "chat completions, which call function tools only", param=f"tools[{i}]",
                           code="unsupported_parameter")
        entry = {k: v for k, v in entry.items() if v not in _TOOL_NO_OP_VALUES.get(k, ())}
        tool = _convert(entry, FunctionTool, f"tools[{i}]")
        out.append(Tool(function=FunctionDef(name=tool.name, description=tool.description or UNSET,
                                             parameters=tool.parameters if tool.parameters is not None else UNSET,
                                             strict=tool.strict if isinstance(tool.strict, bool) else UNSET)))
    return out


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    """Responses' ``tool_choice`` in chat's shape; a choice chat has no twin for is a 400 naming it."""
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise ApiError(400, f"tool_choice must be none, auto, required or an object, not {choice!r}",
                           param="tool_choice", code="invalid_value")
        return choice
    kind = choice.get("type")
    if kind not in ("function", "allowed_tools"):
        raise ApiError(400, f"tool_choice of type {kind!r} is not supported for this model: it is served through "
                       "chat completions, which choose only among function tools", param="tool_choice",
                       code="unsupported_parameter")
    chosen: FunctionChoice | AllowedTools = _convert(choice, _TOOL_CHOICE, "tool_choice")
    if isinstance(chosen, FunctionChoice):
        return {"type": "function", "function": {"name": chosen.name}}
    return {"type": "allowed_tools", "allowed_tools": {
        "mode": chosen.mode, "tools": [{"type": "function", "function": {"name": t.name}} for t in chosen.tools]}}


def _response_format(fmt: TextFormat) -> ResponseFormat | None:
    """``text.format`` as chat's ``response_format`` (None for plain text, the default)."""
    if fmt.type == "json_object":
        return ResponseFormat(type="json_object")
    if fmt.type == "text":
        return None
    if fmt.name is UNSET:
        raise ApiError(400, "text.format of type json_schema needs a name", param="text.format.name",
                       code="missing_required_parameter")
    if fmt.schema is UNSET:
        raise ApiError(400, "text.format of type json_schema needs a schema", param="text.format.schema",
                       code="missing_required_parameter")
    return ResponseFormat(type="json_schema", json_schema=JSONSchemaFormat(
        name=fmt.name, schema=fmt.schema, description=fmt.description if isinstance(fmt.description, str) else UNSET,
        strict=fmt.strict if isinstance(fmt.strict, bool) else UNSET))


def _items(raw: list[dict[str, Any]], sent: bool = True) -> list[Item]:
    """Items read for chat: in those the client ``sent`` (not a kept conversation's), a field unread is a 400."""
    items: list[Item] = []
    for i, entry in enumerate(raw):
        if isinstance(entry, dict) and "type" not in entry and "role" in entry:
            entry = {"type": "message"} | entry
        item = _convert(entry, _ITEM, f"input[{i}]")
        if sent and (path := unmodelled_field(entry, item, f"input[{i}]", _ANSWER_ONLY)):
            raise _unsupported(path)
        if isinstance(item, FunctionCallOutputItem) and not isinstance(item.output, str):
            for j, part in enumerate(item.output):
                if not isinstance(part, InputText):
                    kind = entry["output"][j]["type"]
                    raise ApiError(400, f"input[{i}].output[{j}]: a function call's output of type {kind!r} is "
                                   "not supported for this model: it is served through chat completions, whose tool "
                                   "messages hold text only", param=f"input[{i}].output[{j}]",
                                   code="unsupported_parameter")
        items.append(item)
    return items


_ID_PREFIX = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_"}


def sent_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as Responses items, as sent but for their form (a string as a user
    message, a string content as one text part, a reasoning item of the gateway's own with its text
    restored): what a kept conversation holds and passes on, with no id or status the client did not
    send (an upstream serving Responses refuses an id not of its own form, and a field an item lacks)."""
    if isinstance(req.input, str):
        raw: list[dict[str, Any]] = [{"type": "message", "role": "user",
                                      "content": [{"type": "input_text", "text": req.input}]}]
    else:  # items this gateway does not model (say, for an upstream serving Responses) are kept as sent
        raw = [dict(entry) for entry in req.input]
    for item in raw:
        if "type" not in item and "role" in item:
            item["type"] = "message"
        if isinstance(item.get("content"), str):
            kind = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": kind, "text": item["content"]}]
        restored(item)  # a reasoning item of the gateway's own: its text put back
    return raw


def listed(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``sent_items`` as the ``input_items`` endpoint lists them: each with an id and a status."""
    out = []
    for item in items:
        item = dict(item)
        item.setdefault("id", _ID_PREFIX.get(str(item.get("type")), "item_") + uuid.uuid4().hex)
        if item.get("type") != "function_call_output" or "status" not in item:  # no type: a 400 where translated
            item.setdefault("status", "completed")
        out.append(item)
    return out


def _item_messages(items: list[Item]) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    thinking: list[dict[str, Any]] = []  # reasoning items' blocks, for the assistant turn after them
    for item in items:
        if isinstance(item, ReasoningItem):
            thinking += decoded_blocks(item.encrypted_content) or []
            continue
        before_call: int | None = None  # where the blocks go in the turn: first, or before this call
        if isinstance(item, MessageItem):
            if isinstance(item.content, str):
                messages.append(ChatMessage(role=item.role, content=item.content))
            elif len(item.content) == 1 and isinstance(part := item.content[0], InputText | OutputText):
                messages.append(ChatMessage(role=item.role, content=part.text))  # reads the same as a string
            else:
                messages.append(ChatMessage(role=item.role, content=[_chat_part(p) for p in item.content]))
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":  # one chat turn: its text, then its calls
                last.tool_calls = [*(last.tool_calls or []), call]
                before_call = len(last.tool_calls) - 1
            else:
                messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        elif isinstance(item, FunctionCallOutputItem):  # a list of parts holds only text parts (``_items``)
            output = item.output if isinstance(item.output, str) else "\n".join(  # one per line
                p.text for p in item.output if isinstance(p, InputText))
            messages.append(ChatMessage(role="tool", tool_call_id=item.call_id, content=output))
        if thinking and (last := messages[-1]).role == "assistant":  # in its place in the turn, as they came
            place_thinking(last, thinking, before_call)
        thinking = []
    return messages


def _chat_part(part: Part) -> TextPart | RefusalPart | ImagePart | FilePart:
    if isinstance(part, Refusal):
        return RefusalPart(refusal=part.refusal)
    if isinstance(part, InputImage):
        return ImagePart(image_url=ImageURL(url=part.image_url, detail=part.detail))
    if isinstance(part, InputFile):
        return FilePart(file={k: v for k in ("file_id", "file_data", "filename")
                              if isinstance(v := getattr(part, k), str)})
    return TextPart(text=part.text)


def _context_messages(context: list[dict[str, Any]]) -> list[ChatMessage]:
    """A kept conversation's turns as chat messages. One chat cannot carry (kept from an upstream
    serving Responses: an image by ``file_id``, say) is a 400 naming ``previous_response_id``, the
    field that brought it, not an ``input[i]`` of a request whose input holds no such item."""
    try:
        return _item_messages(_items([i for i in context if i.get("type") in _ID_PREFIX
                                      or decoded_blocks(i.get("encrypted_content"))], sent=False))
    except ApiError as exc:
        raise ApiError(400, f"the conversation previous_response_id continues cannot be served by this model: "
                       f"an earlier turn's {exc.message}", param="previous_response_id", code=exc.code) from None


def to_chat_request(req: ResponsesRequest, context: list[dict[str, Any]] | None = None) -> ChatCompletionRequest:
    """The chat request for ``req``, continuing ``context`` (a stored conversation's items) if given;
    instructions are the request's own (never carried over from earlier responses). A field chat
    cannot express is a 400 naming it."""
    messages: list[ChatMessage] = []
    if req.instructions:
        messages.append(ChatMessage(role="system", content=req.instructions))
    if context:  # what chat can carry of it (an upstream's reasoning items, say, it cannot; thinking blocks it can)
        messages.extend(_context_messages(context))
    if isinstance(req.input, str):
        if not req.input:
            raise ApiError(400, "input must not be empty", param="input")
        messages.append(ChatMessage(role="user", content=req.input))
    else:
        if not req.input:
            raise ApiError(400, "input must not be empty", param="input")
        messages.extend(_item_messages(_items(req.input)))
    chat = ChatCompletionRequest(model=req.model, messages=messages)
    if isinstance(req.max_output_tokens, int):  # not max_tokens, which OpenAI's reasoning models refuse
        chat.max_completion_tokens = req.max_output_tokens
    if req.temperature is not UNSET:
        chat.temperature = req.temperature
    if req.top_p is not UNSET:
        chat.top_p = req.top_p
    if req.tools:
        chat.tools = _function_tools(req.tools)
    # OpenAI's chat refuses these without tools (the Responses API does not): a choice that asks for
    # nothing then is left out, any other goes on for the provider to judge
    if isinstance(req.tool_choice, str | dict) and (req.tools or req.tool_choice not in ("auto", "none")):
        chat.tool_choice = _tool_choice(req.tool_choice)
    if isinstance(req.parallel_tool_calls, bool) and req.tools:
        chat.parallel_tool_calls = req.parallel_tool_calls
    _check_metadata(req.metadata)
    extras = _translated_extras(req) if RAW_BODY in req.__dict__ else {}
    if isinstance(req.text, dict):
        text = _convert(req.text, TextConfig, "text")
        if isinstance(text.format, TextFormat) and (response_format := _response_format(text.format)) is not None:
            chat.response_format = response_format
        if isinstance(text.verbosity, str):
            extras["verbosity"] = msgspec.Raw(msgspec.json.encode(text.verbosity))
    if isinstance(req.user, str):
        chat.user = req.user
    if req.stream:
        chat.stream = True
        chat.stream_options = StreamOptions(include_usage=True)
    if extras:
        set_extra_params(chat, extras)
    return chat


def wants_encrypted_reasoning(req: ResponsesRequest) -> bool:
    """Whether reasoning items made from a chat answer are to carry ``encrypted_content``."""
    return RAW_BODY in req.__dict__ and asks_encrypted_content(raw_request(req))


def echoed_fields(req: ResponsesRequest) -> dict[str, Any]:
    """The request's settings as a response object reports them (OpenAI's defaults where not sent)."""
    raw = raw_request(req) if RAW_BODY in req.__dict__ else {}
    return {
        "tools": req.tools if isinstance(req.tools, list) else [],
        "tool_choice": req.tool_choice if isinstance(req.tool_choice, str | dict) else "auto",
        "parallel_tool_calls": req.parallel_tool_calls if isinstance(req.parallel_tool_calls, bool) else True,
        "temperature": req.temperature if req.temperature is not UNSET else None,
        "top_p": req.top_p if req.top_p is not UNSET else None,
        "max_output_tokens": req.max_output_tokens if req.max_output_tokens is not UNSET else None,
        "text": {"format": {"type": "text"}} | (req.text if isinstance(req.text, dict) else {}),
        "metadata": req.metadata or {},
        "user": req.user if isinstance(req.user, str) else None,
    } | {name: raw[name] for name in ("reasoning", "truncation", "service_tier", "top_logprobs", "safety_identifier",
                                      "prompt_cache_key") if name in raw}
