"""OpenAI wire types shared by the gateway (HTTP edge) and every backend.

The gateway decodes request bodies straight into these Structs (msgspec enforces types and
ranges; a failure becomes a 400 naming the parameter), and backends return responses and stream
chunks in the same shapes, so one provider's output can be relayed unchanged to the client.
Optional request fields default to ``UNSET`` so that what the client did not send is not sent upstream.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal, cast

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from backends.logprobs_wire import PromptLogprobs
from backends.tools_wire import FunctionCall as FunctionCall
from backends.tools_wire import FunctionDef as FunctionDef
from backends.tools_wire import Tool, ToolCall, ToolCallDelta

NonNegInt = Annotated[int, Meta(ge=0)]
PosInt = Annotated[int, Meta(ge=1)]
# Token counts a client may ask for: bounded so nothing downstream (quotas, cost, BIGINT columns) overflows.
MAX_TOKEN_COUNT = 2**31 - 1
TokenCount = Annotated[int, Meta(ge=0, le=MAX_TOKEN_COUNT)]
# OpenAI's own limits (temperature to 2, four stop strings) are not the gateway's: vLLM and others
# take more, and OpenAI answers its 400 itself; the built-in engine and the Anthropic translation
# check their own. 1,024 stop strings bound the matching work a request can ask for.
Temperature = Annotated[float, Meta(ge=0.0)]
TopP = Annotated[float, Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
TopLogprobs = Annotated[int, Meta(ge=0, le=20)]
ChoiceCount = Annotated[int, Meta(ge=1, le=128)]
StopList = Annotated[list[str], Meta(max_length=1024)]


class WireStruct(Struct, kw_only=True):
    """Base for wire types: UNSET optional fields are left out when encoding."""


# ---------------------------------------------------------------- pass-through
#
# The gateway models only the fields it reads. Requests and answers are Structs with a ``__dict__``
# (``dict=True``) that carries, besides the fields, what came on the wire: ``raw_fields`` (a client's
# request, every top-level field as raw JSON: an HTTP upstream gets these, nested bytes unchanged,
# with only the fields the gateway owns replaced), ``extra_params`` (its top-level fields not
# modelled) and ``relayed`` (an upstream answer or chunk as it came, top-level fields as raw JSON).
# Nothing the gateway does not own is lost either way; ``msgspec.structs.replace`` starts a fresh
# object without them (what the gateway builds itself is encoded from its fields alone). So a
# decoded request is never changed in place: a changed copy is made with ``replace``.

_EXTRA = "_extra_params"
_RAW_FIELDS = "_raw_fields"
_RELAYED = "_relayed"
_SOURCE = "_relayed_source"
_encoder = msgspec.json.Encoder()


def extra_params(obj: Struct) -> dict[str, msgspec.Raw]:
    """A request's top-level fields the gateway does not model (raw JSON values; empty: none)."""
    extra: dict[str, msgspec.Raw] = getattr(obj, "__dict__", {}).get(_EXTRA, {})
    return extra


def set_extra_params(obj: Struct, extra: dict[str, msgspec.Raw]) -> None:
    obj.__dict__[_EXTRA] = extra


def raw_fields(obj: Struct) -> dict[str, msgspec.Raw] | None:
    """A request's top-level fields as the client sent them (None: the gateway built the object)."""
    raw: dict[str, msgspec.Raw] | None = getattr(obj, "__dict__", {}).get(_RAW_FIELDS)
    return raw


def set_raw_fields(obj: Struct, fields: dict[str, msgspec.Raw]) -> None:
    obj.__dict__[_RAW_FIELDS] = fields


def relayed(obj: Struct) -> dict[str, msgspec.Raw] | None:
    """An upstream answer's top-level fields as they came (None: the gateway built this object)."""
    raw: dict[str, msgspec.Raw] | None = getattr(obj, "__dict__", {}).get(_RELAYED)
    return raw


def set_relayed(obj: Struct, raw: dict[str, msgspec.Raw], source: bytes | None = None) -> None:
    """Keep an upstream answer's top-level fields (``raw``) and, given, its exact bytes (``source``)."""
    obj.__dict__[_RELAYED] = raw
    if source is not None:
        obj.__dict__[_SOURCE] = source


def encode_with_extra(obj: Struct, extra: dict[str, msgspec.Raw]) -> bytes:
    """``obj`` encoded with ``extra``'s fields appended (keys must not be fields of ``obj``)."""
    encoded = _encoder.encode(obj)
    if not extra:
        return encoded
    tail = _encoder.encode(extra)
    return encoded[:-1] + (b"," if len(encoded) > 2 else b"") + tail[1:]


ANTHROPIC_MESSAGE = "_anthropic_message"  # an Anthropic upstream's answer as it came, for /v1/messages
ANTHROPIC_BODY = "_anthropic_body"  # a /v1/messages request as the client sent it, for an Anthropic upstream
# A chunk's Anthropic upstream events (decoded ``data`` objects) since the previous chunk, relayed as they came.
ANTHROPIC_EVENTS = "_anthropic_events"


def anthropic_events(obj: Struct) -> list[dict[str, Any]] | None:
    return cast(list[dict[str, Any]] | None, getattr(obj, "__dict__", {}).get(ANTHROPIC_EVENTS))


def anthropic_body(obj: Struct) -> dict[str, Any] | None:
    """The Messages API body a chat request was translated from (None: it was not)."""
    return cast(dict[str, Any] | None, getattr(obj, "__dict__", {}).get(ANTHROPIC_BODY))


def encode_answer(obj: Any) -> bytes:
    """An answer or chunk for the client: an upstream's as it came, with the fields the gateway owns
    (``model``; ``usage`` where it was dropped) taken from the object; else the object's fields.
    When those fields are as the upstream sent them, its bytes go out untouched."""
    raw = relayed(obj) if isinstance(obj, Struct) else None
    if raw is None:
        return _encoder.encode(obj)
    model = msgspec.Raw(_encoder.encode(obj.model))
    drop_usage = "usage" in raw and getattr(obj, "usage", UNSET) is UNSET
    if not drop_usage and raw.get("model") == model and (source := obj.__dict__.get(_SOURCE)) is not None:
        return bytes(source)
    out = dict(raw)
    out["model"] = model
    if drop_usage:
        del out["usage"]
    return _encoder.encode(out)


# ---------------------------------------------------------------- requests

# A content part's (or a tool's) ``cache_control``: Anthropic's prompt-caching breakpoint, as clients
# of LiteLLM and OpenRouter send it (``{"type": "ephemeral"}``); an object, or null for none.
CacheControl = dict[str, Any] | None | UnsetType


class TextPart(WireStruct, tag_field="type", tag="text"):
    text: str
    cache_control: CacheControl = UNSET


class ImageURL(WireStruct):
    url: str
    detail: str | UnsetType = UNSET


class ImagePart(WireStruct, tag_field="type", tag="image_url"):
    image_url: ImageURL
    cache_control: CacheControl = UNSET


class InputAudio(WireStruct):
    data: str
    format: str


class AudioPart(WireStruct, tag_field="type", tag="input_audio"):
    input_audio: InputAudio


class FilePart(WireStruct, tag_field="type", tag="file"):
    file: dict[str, Any]  # file_data (a data URL), file_id, filename
    cache_control: CacheControl = UNSET


class RefusalPart(WireStruct, tag_field="type", tag="refusal"):
    """An assistant turn's refusal, as OpenAI's answers carry it."""

    refusal: str


class VideoURL(WireStruct):
    url: str


class VideoPart(WireStruct, tag_field="type", tag="video_url"):
    """vLLM's video input."""

    video_url: VideoURL


ContentPart = TextPart | ImagePart | AudioPart | FilePart | RefusalPart | VideoPart


class ChatMessage(WireStruct, dict=True):  # dict: turn_thinking
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | UnsetType = UNSET
    tool_calls: list[ToolCall] | None | UnsetType = UNSET  # null: none (as an answer sent back may hold)
    tool_call_id: str | UnsetType = UNSET
    function_call: FunctionCall | None | UnsetType = UNSET  # legacy function calling: an assistant's call
    thinking_blocks: list[Any] | None | UnsetType = UNSET  # an answer's (LiteLLM's), sent back: anthropic_thinking

    def text(self) -> str:
        """The message's text: a string content, or its text parts joined."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


class StreamOptions(WireStruct):
    include_usage: bool = False
    continuous_usage_stats: bool | UnsetType = UNSET  # vLLM: the usage so far in every chunk


class JSONSchemaFormat(WireStruct):
    name: str
    schema: dict[str, Any] | UnsetType = UNSET
    description: str | UnsetType = UNSET
    strict: bool | None | UnsetType = UNSET  # null (OpenAI's schema allows it): as unset


class ResponseFormat(WireStruct):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]  # the last: vLLM's, for HTTP upstreams
    json_schema: JSONSchemaFormat | UnsetType = UNSET


class SamplingFields(WireStruct, dict=True):
    """Fields common to chat and text completions."""

    model: str
    max_tokens: TokenCount | None | UnsetType = UNSET
    temperature: Temperature | None | UnsetType = UNSET
    top_p: TopP | None | UnsetType = UNSET
    n: ChoiceCount | None | UnsetType = UNSET
    stop: str | StopList | None | UnsetType = UNSET
    seed: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] | None | UnsetType = UNSET  # OpenAI's: a 64-bit integer
    presence_penalty: Penalty | None | UnsetType = UNSET
    frequency_penalty: Penalty | None | UnsetType = UNSET
    logit_bias: dict[str, float] | None | UnsetType = UNSET
    user: str | None | UnsetType = UNSET
    stream: bool | None | UnsetType = UNSET
    stream_options: StreamOptions | None | UnsetType = UNSET
    # Extensions understood by vLLM-style engines (ours included); passed through elsewhere.
    top_k: Annotated[int, Meta(ge=-1, le=2**31 - 1)] | None | UnsetType = UNSET
    min_p: TopP | None | UnsetType = UNSET
    repetition_penalty: Annotated[float, Meta(gt=0.0)] | None | UnsetType = UNSET  # vLLM's: no upper bound
    min_tokens: NonNegInt | None | UnsetType = UNSET
    ignore_eos: bool | None | UnsetType = UNSET
    stop_token_ids: list[NonNegInt] | None | UnsetType = UNSET
    skip_special_tokens: bool | None | UnsetType = UNSET
    include_stop_str_in_output: bool | None | UnsetType = UNSET
    prompt_logprobs: Annotated[int, Meta(ge=0, le=20)] | None | UnsetType = UNSET  # vLLM's -1 (all tokens): a 400
    # vLLM's structured outputs: {"json": schema, "regex": ..., "choice": [...], "grammar": ...},
    # and the older guided_* spellings.
    structured_outputs: dict[str, Any] | None | UnsetType = UNSET
    guided_json: dict[str, Any] | str | None | UnsetType = UNSET
    guided_regex: str | None | UnsetType = UNSET
    guided_choice: list[str] | None | UnsetType = UNSET
    guided_grammar: str | None | UnsetType = UNSET

    @property
    def is_stream(self) -> bool:
        return bool(self.stream)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options) and bool(self.stream_options.include_usage)  # type: ignore[union-attr]

    @property
    def continuous_usage(self) -> bool:
        """vLLM's ``stream_options.continuous_usage_stats``: the client wants usage in every chunk. As
        vLLM, only together with ``include_usage``: without it, no chunk carries usage."""
        options = self.stream_options
        return isinstance(options, StreamOptions) and options.include_usage and options.continuous_usage_stats is True

    def stop_list(self) -> list[str]:
        if not self.stop:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_completion_tokens: TokenCount | None | UnsetType = UNSET
    logprobs: bool | None | UnsetType = UNSET
    top_logprobs: TopLogprobs | None | UnsetType = UNSET
    response_format: ResponseFormat | None | UnsetType = UNSET
    tools: list[Tool] | None | UnsetType = UNSET
    tool_choice: str | dict[str, Any] | None | UnsetType = UNSET
    parallel_tool_calls: bool | None | UnsetType = UNSET
    chat_template_kwargs: dict[str, Any] | None | UnsetType = UNSET  # vLLM: variables for the chat template

    def sequences(self) -> int:
        """How many sequences the request generates (``n`` choices)."""
        return self.n if isinstance(self.n, int) else 1

    def output_limit(self) -> int | None:
        """The client's cap on generated tokens (max_completion_tokens wins over max_tokens)."""
        for value in (self.max_completion_tokens, self.max_tokens):
            if isinstance(value, int):
                return value
        return None


class CompletionRequest(SamplingFields, kw_only=True):
    prompt: str | Annotated[list[str | int | Annotated[list[int], Meta(min_length=1)]], Meta(min_length=1)]
    echo: bool | None | UnsetType = UNSET
    logprobs: TopLogprobs | None | UnsetType = UNSET
    suffix: str | None | UnsetType = UNSET
    best_of: ChoiceCount | None | UnsetType = UNSET

    def output_limit(self) -> int | None:
        return self.max_tokens if isinstance(self.max_tokens, int) else None

    def sequences(self) -> int:
        """Sequences generated: ``max(n, best_of)`` per prompt."""
        per_prompt = max(self.n if isinstance(self.n, int) else 1, self.best_of if isinstance(self.best_of, int) else 1)
        try:
            return per_prompt * len(self.prompts())
        except ValueError:
            return per_prompt

    def prompts(self) -> list[str] | list[list[int]]:
        """The prompt as a list: one string, several strings, one or several lists of token ids.

        Raises ValueError on a mixture (the gateway turns it into a 400 on ``prompt``).
        """
        if isinstance(self.prompt, str):
            return [self.prompt]
        if all(isinstance(p, str) for p in self.prompt):
            return list(self.prompt)  # type: ignore[return-value]
        if all(isinstance(p, int) for p in self.prompt):
            return [list(self.prompt)]  # type: ignore[return-value]
        if all(isinstance(p, list) for p in self.prompt):
            return [list(p) for p in self.prompt]  # type: ignore[arg-type, return-value]
        raise ValueError("prompt must be a string, a list of strings, or token id lists")

    @property
    def listed(self) -> bool:
        """Whether ``prompt`` is a list of prompts (strings or token-id lists), not one prompt."""
        return isinstance(self.prompt, list) and not all(isinstance(p, int) for p in self.prompt)


# ---------------------------------------------------------------- responses

class PromptTokensDetails(WireStruct):
    cached_tokens: int = 0


class Usage(WireStruct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | UnsetType = UNSET


class TopLogprob(WireStruct):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(WireStruct):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = msgspec.field(default_factory=list)


class ChoiceLogprobs(WireStruct):
    content: list[TokenLogprob] | None = None


class AssistantMessage(WireStruct, dict=True):  # dict: turn_thinking
    role: str = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None | UnsetType = UNSET  # null: none (LiteLLM, LM Studio send it), relayed
    function_call: FunctionCall | None | UnsetType = UNSET  # legacy function calling: the answer's call
    refusal: str | None = None  # always present, as OpenAI's schema requires
    reasoning_content: str | None | UnsetType = UNSET  # a reasoning model's thinking (vLLM, DeepSeek)
    reasoning: str | None | UnsetType = UNSET  # the same, as newer vLLM and OpenRouter name it
    thinking_blocks: list[Any] | None | UnsetType = UNSET  # Anthropic's, signatures included (as LiteLLM)


# The gateway's own finish reasons; an answer's is any str (DeepSeek's "insufficient_system_resource"), relayed.
FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]


class ChatChoice(WireStruct):
    index: int
    message: AssistantMessage
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None
    stop_reason: str | int | None | UnsetType = UNSET  # vLLM: the stop string or token that matched
    matched_stop: str | int | None | UnsetType = UNSET  # SGLang's name for it


class ChatCompletion(WireStruct, dict=True):
    id: str
    model: str
    choices: list[ChatChoice]
    created: int = msgspec.field(default_factory=lambda: int(time.time()))
    object: str = "chat.completion"
    usage: Usage | None | UnsetType = UNSET
    system_fingerprint: str | None | UnsetType = UNSET
    prompt_logprobs: PromptLogprobs | None | UnsetType = UNSET  # vLLM's, when the client asked for them


class ChatDelta(WireStruct):
    role: str | None | UnsetType = UNSET  # this and the lists: null for none, as OpenAI's schema allows
    content: str | None | UnsetType = UNSET
    tool_calls: list[ToolCallDelta] | None | UnsetType = UNSET
    function_call: dict[str, Any] | None | UnsetType = UNSET  # legacy function calling: the call's name, arguments
    refusal: str | None | UnsetType = UNSET
    reasoning_content: str | None | UnsetType = UNSET
    reasoning: str | None | UnsetType = UNSET
    thinking_blocks: list[Any] | None | UnsetType = UNSET  # pieces of Anthropic's (as LiteLLM streams them)


def reasoning_text(message: AssistantMessage | ChatDelta) -> str:
    """A chat message's (or a chunk's delta's) reasoning text, under either name providers give it
    (``reasoning_content``, or ``reasoning``); "" for none."""
    for text in (message.reasoning_content, message.reasoning):
        if isinstance(text, str) and text:
            return text
    return ""


class ChatChunkChoice(WireStruct):
    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None
    stop_reason: str | int | None | UnsetType = UNSET  # vLLM: the stop string or token that matched
    matched_stop: str | int | None | UnsetType = UNSET  # SGLang's name for it


class ChatCompletionChunk(WireStruct, dict=True):
    id: str
    model: str
    choices: list[ChatChunkChoice]
    created: int = msgspec.field(default_factory=lambda: int(time.time()))
    object: str = "chat.completion.chunk"
    usage: Usage | None | UnsetType = UNSET
    system_fingerprint: str | None | UnsetType = UNSET


class CompletionLogprobs(WireStruct):
    tokens: list[str] = msgspec.field(default_factory=list)
    token_logprobs: list[float | None] = msgspec.field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = msgspec.field(default_factory=list)
    text_offset: list[int] = msgspec.field(default_factory=list)


class CompletionChoice(WireStruct):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None
    stop_reason: str | int | None | UnsetType = UNSET  # vLLM: the stop string or token that matched
    prompt_logprobs: PromptLogprobs | None | UnsetType = UNSET  # vLLM's, when the client asked for them


class TextCompletion(WireStruct, dict=True):
    """A text completion (``object: text_completion``); also the shape of its stream chunks."""

    id: str
    model: str
    choices: list[CompletionChoice]
    created: int = msgspec.field(default_factory=lambda: int(time.time()))
    object: str = "text_completion"
    usage: Usage | None | UnsetType = UNSET
    system_fingerprint: str | None | UnsetType = UNSET


class ModelCard(WireStruct):
    id: str
    created: int = 0
    object: str = "model"
    owned_by: str = "switchyard"
    max_model_len: int | UnsetType = UNSET  # the context, for models the built-in engine serves (as vLLM)
    metadata: dict[str, Any] | UnsetType = UNSET


class ModelList(WireStruct):
    data: list[ModelCard]
    object: str = "list"


class ErrorDetail(WireStruct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(WireStruct):
    error: ErrorDetail


StreamChunk = ChatCompletionChunk | TextCompletion
Response = ChatCompletion | TextCompletion
