"""Translation between OpenAI chat requests/responses and Anthropic's Messages API.

Pure functions over plain dicts (Anthropic side) and the wire Structs (OpenAI side), used by the
``anthropic`` provider in both directions and, reversed, by the gateway's ``/v1/messages`` route.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection
from typing import Any

import msgspec
from msgspec import UNSET

from backends.anthropic_functions import as_tools
from backends.anthropic_json import add_json_tool, json_format
from backends.anthropic_thinking import THINKING_TYPES, answer_blocks, request_blocks
from backends.anthropic_tools import add_tools
from backends.base import BadRequest, Meter
from backends.function_tools import function_call
from backends.openai_wire import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    ChatMessage,
    FilePart,
    FunctionCall,
    ImagePart,
    PromptTokensDetails,
    TextPart,
    ToolCall,
    Usage,
    extra_params,
)
from backends.turn_thinking import Placed, place_thinking, thinking_before

DEFAULT_MAX_TOKENS = 4096
_PROVIDER = "the anthropic provider"  # as the 400s for what it cannot take name it
STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
                "pause_turn": "stop", "refusal": "content_filter", "model_context_window_exceeded": "length"}


def _image_block(url: str) -> dict[str, Any]:
    """A data URL's image as base64 (its media type as Anthropic names it: lower case, no parameters,
    ``image/jpg`` as ``image/jpeg``), any other URL's by reference."""
    if url.startswith("data:") and ";base64," in url:
        header, data = url[5:].split(";base64,", 1)
        media_type = header.split(";", 1)[0].strip().lower()
        media_type = "image/jpeg" if media_type == "image/jpg" else media_type
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _document_block(file: dict[str, Any]) -> dict[str, Any]:
    data = file.get("file_data")
    if isinstance(data, str) and data.startswith("data:") and ";base64," in data:
        media_type, payload = data[5:].split(";base64,", 1)
        return {"type": "document", "source": {"type": "base64", "media_type": media_type, "data": payload}}
    raise BadRequest("the anthropic provider takes files as base64 data URLs (file_data)", param="messages")


def _cached(block: dict[str, Any], cache_control: Any) -> dict[str, Any]:
    """``block`` with the part's ``cache_control`` (Anthropic's prompt-caching breakpoint), if it has one."""
    return block | {"cache_control": cache_control} if isinstance(cache_control, dict) else block


def _content_blocks(message: ChatMessage) -> list[dict[str, Any]]:
    if message.content is None:
        return []
    if isinstance(message.content, str):
        return [{"type": "text", "text": message.content}] if message.content.strip() else []
    blocks: list[dict[str, Any]] = []
    for part in message.content:
        if isinstance(part, TextPart):  # one of whitespace only left out: Anthropic refuses it
            if part.text.strip():
                blocks.append(_cached({"type": "text", "text": part.text}, part.cache_control))
        elif isinstance(part, ImagePart):
            blocks.append(_cached(_image_block(part.image_url.url), part.cache_control))
        elif isinstance(part, FilePart):
            blocks.append(_cached(_document_block(part.file), part.cache_control))
        else:
            from backends.openai_wire import RefusalPart  # here: the module's imports are not this function's

            if isinstance(part, RefusalPart) and message.role == "assistant":  # what the assistant said
                blocks.extend([{"type": "text", "text": part.refusal}] if part.refusal.strip() else [])
                continue
            if isinstance(part, RefusalPart):
                raise BadRequest(f"a 'refusal' content part is accepted only in an assistant message, not in a "
                                 f"{message.role} message", param="messages")
            raise BadRequest(f"the anthropic provider does not accept '{part.__struct_config__.tag}' content parts "
                             f"(in a {message.role} message's content)", param="messages")
    return blocks


_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]+")


def tool_use_id(call_id: str) -> str:
    """A conversation's tool call id in the form Anthropic takes (letters, digits, ``_`` and ``-``):
    as it is, or (another provider's, such as Kimi's ``functions.search:0``) with every other character
    as ``_`` and a digest of it appended, the same for the call and its result, and apart for two ids."""
    if _ID_PATTERN.fullmatch(call_id):
        return call_id
    digest = hashlib.sha256(call_id.encode()).hexdigest()[:12]
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', call_id)}_{digest}"


def _tool_use_blocks(message: ChatMessage, index: int) -> list[dict[str, Any]]:
    blocks = []
    for j, call in enumerate(message.tool_calls or []):
        function = function_call(call, f"messages[{index}].tool_calls[{j}]", _PROVIDER)
        try:
            arguments = json.loads(function.arguments or "{}")
        except (ValueError, RecursionError):
            arguments = None
        if not isinstance(arguments, dict):  # a tool_use block's input is an object: Anthropic refuses any other
            raise BadRequest("the anthropic provider takes a tool call's arguments as a JSON object",
                             param=f"messages[{index}].tool_calls[{j}].function.arguments")
        if not (isinstance(call.id, str) and call.id):  # a tool_use block has one, which its tool_result names
            raise BadRequest("the anthropic provider needs each tool call's id",
                             param=f"messages[{index}].tool_calls[{j}].id")
        blocks.append({"type": "tool_use", "id": tool_use_id(call.id), "name": function.name, "input": arguments})
    return blocks


def _assistant_blocks(message: ChatMessage, index: int) -> list[dict[str, Any]]:
    """An assistant message's text and tool_use blocks, with the thinking blocks the gateway placed in
    its turn (``turn_thinking``) where they were: first, or just before their tool call."""
    calls = _tool_use_blocks(message, index)
    blocks = [b for group in thinking_before(message, None, len(calls)) for b in group] + _content_blocks(message)
    for k, call in enumerate(calls):
        blocks += [b for group in thinking_before(message, k, len(calls)) for b in group]
        blocks.append(call)
    return blocks + [b for group in thinking_before(message, len(calls), len(calls)) for b in group]


def _system_blocks(message: ChatMessage) -> list[dict[str, Any]]:
    """A system or developer message's text blocks, one per text part (empty ones left out: Anthropic
    refuses them), each with its ``cache_control``: Anthropic's system prompt takes text only, so any
    other part is a 400 naming its type, never dropped."""
    for part in message.content if isinstance(message.content, list) else []:
        if not isinstance(part, TextPart):
            raise BadRequest(f"the anthropic provider takes text only in a {message.role} message (its system "
                             f"prompt), not '{part.__struct_config__.tag}' content parts", param="messages")
    return _content_blocks(message)


def _messages(request: ChatCompletionRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the system prompt's text blocks, in order, alternating user/assistant messages). Anthropic
    refuses an empty message: an assistant one with nothing to send (content "", as an answer can be)
    is left out, and its neighbours merge; a user one is a 400 naming it (left out, the turn before it
    would be continued instead of answered), as is a conversation left with none. A final assistant
    turn (a prefill) has the trailing whitespace of its last text cut, as LiteLLM does: Anthropic
    refuses it there."""
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:  # Anthropic wants alternating roles: merge neighbours
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for i, message in enumerate(request.messages):
        thinking = request_blocks(message, i)  # an assistant's sent back (first in its turn); else a 400
        if message.role in ("system", "developer"):
            system.extend(_system_blocks(message))
        elif message.role == "assistant":
            add("assistant", thinking + _assistant_blocks(message, i))
        elif message.role in ("tool", "function"):  # one text as a string; else (several texts, images,
            if not (isinstance(message.tool_call_id, str) and message.tool_call_id):  # documents, caching) blocks
                raise BadRequest("the anthropic provider needs each tool message's tool_call_id",
                                 param=f"messages[{i}].tool_call_id")
            parts = message.content if isinstance(message.content, list) else []
            plain = len(parts) <= 1 and all(isinstance(p, TextPart) and not isinstance(p.cache_control, dict)
                                            for p in parts)
            content = message.text() if plain else _content_blocks(message) or message.text()
            add("user", [{"type": "tool_result", "tool_use_id": tool_use_id(message.tool_call_id), "content": content}])
        elif not (blocks := _content_blocks(message)):
            raise BadRequest("the anthropic provider takes no user message without content (Anthropic refuses "
                             "empty and whitespace-only text)", param=f"messages[{i}].content")
        else:
            add("user", blocks)
    if not out:
        raise BadRequest("the anthropic provider needs a user or assistant message with content", param="messages")
    if out[-1]["role"] == "assistant" and (last := out[-1]["content"][-1]).get("type") == "text":
        last["text"] = last["text"].rstrip()  # a prefill: Anthropic refuses one ending in whitespace
    return system, out


# Modelled OpenAI request fields with no Messages API equivalent, and the values that leave the
# output as it would be without them (what clients such as LangChain send by default): any other
# value is a 400 naming the field, unless the deployment's ``drop_params`` lists it.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "seed": (None,),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "logit_bias": (None, {}),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "min_p": (None, 0),
    "repetition_penalty": (None, 1),
    "min_tokens": (None, 0),
    "ignore_eos": (None, False),
    "stop_token_ids": (None, []),
    "skip_special_tokens": (None, True),
    "include_stop_str_in_output": (None, False),
    "prompt_logprobs": (None,),
    "structured_outputs": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "chat_template_kwargs": (None, {}),
}


def _refuse_unmapped(request: ChatCompletionRequest, dropped: Collection[str]) -> None:
    for name, neutral in _NEUTRAL.items():
        value = getattr(request, name)
        if value is not UNSET and value not in neutral and name not in dropped:
            raise BadRequest(f"'{name}' is not supported by the anthropic provider", param=name)


def to_messages_request(request: ChatCompletionRequest, model: str, *, stream: bool,
                        max_tokens: int | None = None, dropped: Collection[str] = (),
                        answer_room: bool = False) -> dict[str, Any]:
    """The Messages API body for a chat request. ``max_tokens`` is required there: the caller's
    (the client's limit, else the gateway's cap, else the deployment's), else the client's limit,
    else ``DEFAULT_MAX_TOKENS``. ``answer_room``: that is a default nobody set as a limit, so a
    ``reasoning_effort``'s thinking budget is added to it (as OpenAI's reasoning models think beyond
    a default), rather than taken out of the answer's room. A field set to something Anthropic cannot
    do is a 400 naming it, never dropped silently, unless ``dropped`` (the deployment's ``drop_params``) names it."""
    if isinstance(request.n, int) and request.n > 1:
        raise BadRequest("the anthropic provider returns one choice (n must be 1)", param="n")
    if request.output_limit() == 0:  # Anthropic's max_tokens is at least 1 (0 is no limit to replace)
        field = "max_completion_tokens" if request.max_completion_tokens == 0 else "max_tokens"
        raise BadRequest(f"{field} must be at least 1 on the anthropic provider", param=field)
    request = as_tools(request)  # legacy function calling, as tool calling
    _refuse_unmapped(request, dropped)
    system, messages = _messages(request)
    body: dict[str, Any] = {"model": model, "messages": messages,
                            "max_tokens": max_tokens or request.output_limit() or DEFAULT_MAX_TOKENS}
    if system:
        body["system"] = system
    if isinstance(request.temperature, float | int):
        if request.temperature > 1:
            raise BadRequest(f"temperature {request.temperature} is out of the anthropic provider's range "
                             "(0 to 1)", param="temperature")
        body["temperature"] = request.temperature
    if isinstance(request.top_p, float | int) and request.top_p < 1:  # 1 asks for nothing, and newer
        body["top_p"] = request.top_p  # models refuse any top_p beside a temperature
    if isinstance(request.top_k, int) and request.top_k > 0:
        body["top_k"] = request.top_k
    if (count := len(request.stop_list())) > MAX_STOPS:  # the chat and completions contract, not Anthropic's
        raise BadRequest(f"stop may hold at most {MAX_STOPS} sequences, not {count}", param="stop")
    if stops := [s for s in request.stop_list() if s]:  # an empty one stops nowhere (Anthropic refuses it)
        if blank := [s for s in stops if not s.strip()]:
            raise BadRequest(f"the anthropic provider takes no stop sequence of whitespace only ({blank[0]!r})",
                             param="stop")
        body["stop_sequences"] = stops
    add_tools(request, body)
    if (user_id := _end_user(request, dropped)) is not None:
        body["metadata"] = {"user_id": user_id}
    _map_extra(request, body, answer_room)
    if (fmt := json_format(request, dropped)) is not None:  # a JSON answer, through one forced tool
        add_json_tool(fmt, body)
    if stream:
        body["stream"] = True
    return body


def _end_user(request: ChatCompletionRequest, dropped: Collection[str]) -> str | None:
    """Anthropic's ``metadata.user_id``, its one metadata key: the request's ``metadata.user_id``, else
    OpenAI's ``safety_identifier``, else the ``user`` it replaces (each names the end user). Any other
    ``metadata`` key (OpenAI's take any, as tags of a stored completion) Anthropic refuses the request
    for: a 400 naming it here, rather than a request sent that is certain to fail."""
    extra = extra_params(request)
    metadata = msgspec.json.decode(extra["metadata"]) if "metadata" in extra else None
    if metadata is not None and not isinstance(metadata, dict):
        raise BadRequest("metadata must be an object", param="metadata")
    for key, value in (metadata or {}).items():
        if key != "user_id":
            raise BadRequest(f"'metadata.{key}' is not supported by the anthropic provider (its metadata takes "
                             "user_id alone)", param=f"metadata.{key}")
        if value is not None and not isinstance(value, str):
            raise BadRequest("metadata.user_id must be a string (the end user's id on the anthropic provider)",
                             param="metadata.user_id")
    safety = msgspec.json.decode(extra["safety_identifier"]) if "safety_identifier" in extra else None
    if safety is not None and not isinstance(safety, str):
        raise BadRequest("safety_identifier must be a string", param="safety_identifier")
    user = request.user if isinstance(request.user, str) and "user" not in dropped else None
    for user_id in ((metadata or {}).get("user_id"), safety, user):
        if user_id is not None:
            return str(user_id)
    return None


MAX_STOPS = 4  # OpenAI's limit on stop, which this translation answers for itself (Anthropic takes more)
# reasoning_effort -> an extended-thinking budget (Anthropic's minimum is 1024 tokens)
THINKING_BUDGETS = {"minimal": 1024, "low": 1024, "medium": 4096, "high": 16384}
MIN_THINKING_BUDGET = 1024  # Anthropic's smallest budget_tokens
# Request fields of Anthropic's own Messages API that an OpenAI-shaped request may carry: sent as they are.
ANTHROPIC_FIELDS = frozenset({"thinking", "service_tier", "container", "mcp_servers",
                              "context_management", "top_k"})
# OpenAI fields that do not change the output and have no Anthropic equivalent: not sent.
NO_EFFECT_FIELDS = frozenset({"store", "prompt_cache_key"})
# Mapped to Anthropic's metadata.user_id by _end_user.
END_USER_FIELDS = frozenset({"metadata", "safety_identifier"})
# service_tier: OpenAI's values with an Anthropic equivalent, and Anthropic's own; any other
# (OpenAI's flex, priority, scale) is a tier Anthropic cannot be asked for: a 400 naming it.
SERVICE_TIERS = {"auto": "auto", "default": "standard_only", "standard_only": "standard_only"}


def _map_extra(request: ChatCompletionRequest, body: dict[str, Any], answer_room: bool = False) -> None:
    """The request's unmodelled fields, mapped for Anthropic: ``reasoning_effort`` -> ``thinking``
    budget; ``service_tier`` by ``SERVICE_TIERS``; Anthropic's own fields (``thinking``, ...) as they
    are (``metadata`` and ``safety_identifier`` are ``_end_user``'s); anything else is a 400 naming it,
    never a silent drop (a deployment's ``drop_params`` removes a field before this)."""
    for name, raw in extra_params(request).items():
        value = msgspec.json.decode(raw)
        if name == "reasoning_effort":
            if value == "none" or value is None:
                continue
            budget = THINKING_BUDGETS.get(value) if isinstance(value, str) else None
            if budget is None:
                raise BadRequest(f"unsupported reasoning_effort {value!r}", param="reasoning_effort")
            if answer_room:  # no limit set: the answer keeps the default's room beside the thinking
                body["max_tokens"] = int(body["max_tokens"]) + budget
            elif int(body["max_tokens"]) <= MIN_THINKING_BUDGET:  # the budget must lie below max_tokens
                field = "max_completion_tokens" if request.max_completion_tokens not in (UNSET, None) else "max_tokens"
                raise BadRequest(f"reasoning_effort needs {field} above {MIN_THINKING_BUDGET} on the anthropic "
                                 f"provider (its smallest thinking budget)", param=field)
            budget = min(budget, int(body["max_tokens"]) - 1)
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
            _refuse_with_thinking(body)
        elif name in END_USER_FIELDS:
            continue
        elif name == "service_tier":
            tier = SERVICE_TIERS.get(value) if isinstance(value, str) else None
            if tier is None and value is not None:  # null asks for nothing
                raise BadRequest(f"service_tier {value!r} cannot be served by the anthropic provider (it takes "
                                 "'auto' or 'default' ('standard_only'))", param="service_tier")
            if tier is not None:
                body["service_tier"] = tier
        elif name in ANTHROPIC_FIELDS:
            body[name] = value
        elif name not in NO_EFFECT_FIELDS:
            raise BadRequest(f"'{name}' is not supported by the anthropic provider", param=name)


def _refuse_with_thinking(body: dict[str, Any]) -> None:
    """Anthropic's extended thinking takes no temperature but 1, no top_k and no forced tool (tool_choice
    ``required`` or a named function): each is a 400 naming its field."""
    if body.get("temperature", 1) != 1:
        raise BadRequest("the anthropic provider takes no temperature but 1 with reasoning_effort (extended "
                         "thinking)", param="temperature")
    if "top_k" in body:
        raise BadRequest("the anthropic provider takes no top_k with reasoning_effort (extended thinking)",
                         param="top_k")
    if body.get("tool_choice", {}).get("type") in ("any", "tool"):
        raise BadRequest("the anthropic provider forces no tool call (tool_choice 'required' or a function) with "
                         "reasoning_effort (extended thinking)", param="tool_choice")


def usage_of(data: dict[str, Any]) -> Usage:
    """OpenAI's usage from Anthropic's: the prompt is the plain input, the cache reads and the cache
    writes; a count that is no positive integer is 0."""
    cached = _count(data.get("cache_read_input_tokens"))
    prompt = _count(data.get("input_tokens")) + cached + _count(data.get("cache_creation_input_tokens"))
    completion = _count(data.get("output_tokens"))
    usage = Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
    if cached:
        usage.prompt_tokens_details = PromptTokensDetails(cached_tokens=cached)
    return usage


def meter_billing(meter: Meter, usage: Any) -> None:
    """What an Anthropic ``usage`` object bills apart from plain tokens, onto ``meter``: the prompt's
    cache writes (``cache_creation_input_tokens``, of them ``cache_creation.ephemeral_1h_input_tokens``
    kept an hour), the server tools' calls and the service tier (``service_tier``)."""
    if not isinstance(usage, dict):
        return
    if isinstance(tier := usage.get("service_tier"), str) and tier:
        meter.service_tier = tier
    written = _count(usage.get("cache_creation_input_tokens"))
    detail = usage.get("cache_creation")
    meter.cache_write_tokens = written
    meter.cache_write_1h_tokens = min(written, _count(detail.get("ephemeral_1h_input_tokens"))) \
        if isinstance(detail, dict) else 0
    if isinstance(usage.get("server_tool_use"), dict):  # the calls billed: they replace the blocks counted
        meter.tool_calls = server_tool_calls(usage)


def _count(value: Any) -> int:
    return value if type(value) is int and value > 0 else 0


def server_tool_calls(usage: Any) -> dict[str, int]:
    """The calls of Anthropic's server tools a ``usage`` object reports (``"server_tool_use":
    {"web_search_requests": 2}``), by tool: ``{"web_search": 2}``."""
    reported = usage.get("server_tool_use") if isinstance(usage, dict) else None
    if not isinstance(reported, dict):
        return {}
    return {name.removesuffix("_requests"): _count(n) for name, n in reported.items()
            if name.endswith("_requests") and _count(n)}


def from_messages_response(data: dict[str, Any], public_model: str) -> ChatCompletion:
    """An Anthropic answer as a chat completion: its text joined, its tool calls, its thinking (the text
    joined, the blocks as they came); each run of thinking blocks also placed in the turn where it came
    (``turn_thinking``: first, or before the call that follows it), for the Responses API."""
    text, calls = [], []
    placed: Placed = []
    previous: str | None = None  # the type of the block before
    for block in data.get("content") or []:
        if block.get("type") == "text":
            text.append(block.get("text", ""))
        elif block.get("type") == "tool_use":
            calls.append(ToolCall(id=block.get("id", ""), function=FunctionCall(
                name=block.get("name", ""), arguments=msgspec.json.encode(block.get("input") or {}).decode())))
        elif block.get("type") in THINKING_TYPES:
            if previous in THINKING_TYPES:
                placed[-1][1].append(block)
            else:
                placed.append((len(calls) if text or calls else None, [block]))
        previous = block.get("type")
    message = AssistantMessage(content="".join(text) if text or not calls else None)
    for before_call, blocks in placed:
        place_thinking(message, blocks, before_call)
    thinking = [b.get("thinking", "") for b in data.get("content") or [] if b.get("type") == "thinking"]
    if thinking:
        message.reasoning_content = "".join(thinking)
    if blocks := answer_blocks(data.get("content")):  # signatures included, to be sent back (LiteLLM's)
        message.thinking_blocks = blocks
    if calls:
        message.tool_calls = calls
    finish = STOP_REASONS.get(data.get("stop_reason") or "", "stop")
    choice = ChatChoice(index=0, message=message, finish_reason=finish)
    if isinstance(stop := data.get("stop_sequence"), str):
        choice.stop_reason = stop  # the stop sequence that matched
    return ChatCompletion(id=str(data.get("id") or "msg"), model=public_model, choices=[choice],
                          usage=usage_of(data.get("usage") or {}))
