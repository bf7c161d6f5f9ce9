"""Translation between OpenAI wire requests/responses and the engine's parameters/outputs."""

from __future__ import annotations

import codecs
import json
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from msgspec import UNSET

from backends.base import BadRequest, Meter
from backends.function_tools import function_call
from backends.local.chat_rules import check_conversation
from backends.local.structured import output_constraint
from backends.logprobs_wire import PromptLogprob, PromptLogprobs
from backends.nested_fields import unknown_nested_field
from backends.openai_wire import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    ChoiceLogprobs,
    CompletionLogprobs,
    CompletionRequest,
    SamplingFields,
    TextCompletion,
    TextPart,
    TokenLogprob,
    TopLogprob,
    Usage,
    extra_params,
)
from engine import InvalidRequest, SamplingParams
from engine.sequence import TokenLogprob as EngineTokenLogprob
from engine.structured_output import StructuredOutput
from engine.tokenizer import piece_bytes


def opt(value: Any, default: Any) -> Any:
    return default if value is None or value is UNSET else value


StreamChunk = TypeVar("StreamChunk", ChatCompletionChunk, TextCompletion)
StreamChunk_co = TypeVar("StreamChunk_co", ChatCompletionChunk, TextCompletion, covariant=True)


class ChunkMaker(Protocol[StreamChunk_co]):
    def __call__(self, choices: list[Any], usage: Usage | None = None) -> StreamChunk_co: ...


def chunk_maker(kind: type[StreamChunk], request: ChatCompletionRequest | CompletionRequest, cid: str,
                meter: Meter, usage_of: Callable[[Meter], Usage]) -> ChunkMaker[StreamChunk]:
    """The chunks of one streamed answer: its id, model and creation time in each, and the usage
    when given (the last chunk) or, where the client asked for vLLM's continuous usage, so far.
    With ``n`` > 1 or several prompts that is the whole request's so far (every choice's tokens),
    not vLLM's one choice's: each chunk's figure is what the call has cost, whichever choice it carries."""
    created, continuous = int(time.time()), request.continuous_usage

    def chunk(choices: list[Any], usage: Usage | None = None) -> StreamChunk:
        if usage is None and continuous:
            usage = usage_of(meter)
        return kind(id=cid, model=request.model, choices=choices, created=created,
                    usage=usage if usage is not None else UNSET)

    return chunk


# Accepted though the engine does nothing with them: they do not change the output.
NO_EFFECT_PARAMS = frozenset({"metadata", "store", "user", "service_tier", "prompt_cache_key", "safety_identifier"})


_TOKEN_ID = re.compile(r"-?[0-9]+")  # a logit_bias key: a token id in ASCII digits (a negative one is out of range)
MAX_STOP_TOKEN_IDS = 1024  # each generated token is looked up in them, and min_tokens bans them at every step

# vLLM's chat fields the engine honours (``chat_prompt_options``, ``chat_echo``): a chat request's, nobody else's.
CHAT_PARAMS = frozenset({"add_generation_prompt", "continue_final_message", "echo"})
# A text completion's fields the engine honours though the gateway does not model them (an HTTP
# upstream gets them as sent): ``response_format``, read by ``backends.local.structured``.
COMPLETION_PARAMS = frozenset({"response_format"})


def honoured_extras(request: SamplingFields) -> frozenset[str]:
    """The unmodelled fields of ``request`` that the engine honours or that change nothing."""
    return NO_EFFECT_PARAMS | (CHAT_PARAMS if isinstance(request, ChatCompletionRequest) else COMPLETION_PARAMS)


def refuse_unsupported(request: SamplingFields) -> None:
    """A request field the engine does not support, at any depth, is a 400 naming it, never a silent drop."""
    refuse_unknown_fields(request, "the local engine")
    if opt(request.prompt_logprobs, None) is not None and request.is_stream:  # as vLLM: they are not streamed
        raise BadRequest("prompt_logprobs are not available when stream is true", param="prompt_logprobs")


def refuse_unknown_fields(request: SamplingFields, who: str) -> None:
    """A 400 naming the first field of ``request`` that ``who`` (an in-process provider) would
    ignore: a top-level one it does not honour, or one nested below a modelled field that the wire
    types do not model (``stream_options.bogus``, ``messages[0].foo``)."""
    taken = honoured_extras(request)
    for name in extra_params(request):
        if name not in taken:
            raise BadRequest(f"'{name}' is not supported by {who}", param=name)
    if (path := unknown_nested_field(request)) is not None:
        raise BadRequest(f"'{path}' is not supported by {who}", param=path)


def logit_bias(request: SamplingFields) -> dict[int, float]:
    """OpenAI's logit_bias (token id as a string -> bias in [-100, 100]); as many tokens as the
    vocabulary holds (the engine checks each id), applied in a few tensor operations a step."""
    asked = opt(request.logit_bias, None) or {}
    bias: dict[int, float] = {}
    for key, value in asked.items():
        token = bias_token(key)
        if token is None:
            raise BadRequest(f"logit_bias keys must be token ids, not {key!r}", param="logit_bias")
        if not -100.0 <= value <= 100.0:
            raise BadRequest("logit_bias values must be in [-100, 100]", param="logit_bias")
        bias[token] = float(value)
    return bias


def bias_token(key: str) -> int | None:
    """A logit_bias key as a token id (None: not one). Only ASCII digits: int() would also read
    "1_0" as 10, " 1" as 1 and full-width digits, other tokens than the client meant."""
    return int(key) if _TOKEN_ID.fullmatch(key) else None


def stop_token_ids(request: SamplingFields) -> list[int]:
    ids = list(opt(request.stop_token_ids, []))
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise BadRequest(f"stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} tokens, not {len(ids)}",
                         param="stop_token_ids")
    return ids


def limit_field(request: SamplingFields) -> str:
    """The wire field holding the request's output limit: chat's ``max_completion_tokens`` when the
    client sent it (it wins over ``max_tokens``), else ``max_tokens``."""
    return "max_completion_tokens" if isinstance(getattr(request, "max_completion_tokens", None), int) else "max_tokens"


def sampling_params(request: SamplingFields, limit: int | None, logprobs: int | None,
                    prompt_logprobs: int | None = None, structured: StructuredOutput | None = None,
                    score_only: bool = False) -> SamplingParams:
    """Engine sampling parameters for a wire request; a BadRequest names the offending field.
    ``structured`` is tool calling's grammar (a forced call), used instead of the request's own
    output constraint, which the request may then not give. ``score_only``: a limit of 0, the
    prompt processed alone (a text completion's ``max_tokens: 0``). The output constraint is read
    first: what it cannot take (a ``structural_tag`` format) is named before the fields it holds."""
    structured = output_constraint(request, structured)
    refuse_unsupported(request)
    if limit is not None and limit < 1 and not (score_only and limit == 0):
        raise BadRequest(f"{limit_field(request)} must be >= 1", param=limit_field(request))
    top_k = opt(request.top_k, 0)
    try:
        return SamplingParams(
            n=opt(request.n, 1),
            temperature=opt(request.temperature, 1.0),
            top_p=opt(request.top_p, 1.0),
            top_k=0 if top_k == -1 else top_k,
            min_p=opt(request.min_p, 0.0),
            repetition_penalty=opt(request.repetition_penalty, 1.0),
            presence_penalty=opt(request.presence_penalty, 0.0),
            frequency_penalty=opt(request.frequency_penalty, 0.0),
            seed=opt(request.seed, None),
            max_tokens=limit,
            min_tokens=opt(request.min_tokens, 0),
            stop=request.stop_list(),
            stop_token_ids=stop_token_ids(request),
            include_stop_str_in_output=bool(opt(request.include_stop_str_in_output, False)),
            skip_special_tokens=bool(opt(request.skip_special_tokens, True)),
            ignore_eos=bool(opt(request.ignore_eos, False)),
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            logit_bias=logit_bias(request),
            structured=structured,
        )
    except InvalidRequest as exc:  # the engine spells the output limit max_tokens: the client's name for it
        message = exc.message.replace("max_tokens", limit_field(request)) if exc.param == "min_tokens" else exc.message
        raise BadRequest(message, param=exc.param) from None


def chat_prompt_options(request: ChatCompletionRequest, add_generation_prompt: bool = True) -> tuple[bool, bool]:
    """vLLM's ``add_generation_prompt`` (default true) and ``continue_final_message`` (default false:
    true makes the answer go on with the final assistant message instead of starting a new turn)."""
    add = _chat_flag(request, "add_generation_prompt", add_generation_prompt)
    cont = _chat_flag(request, "continue_final_message", False)
    if add and cont:
        raise BadRequest("continue_final_message and add_generation_prompt cannot both be true",
                         param="continue_final_message")
    if cont and (not request.messages or request.messages[-1].role != "assistant"):
        raise BadRequest("continue_final_message needs the final message to be the assistant's", param="messages")
    return add, cont


def chat_echo(request: ChatCompletionRequest) -> str:
    """vLLM's chat ``echo``: the text every choice's content starts with. That is the final message's
    text when it has the answer's role (the assistant's with ``add_generation_prompt``, else the
    final message's own: a ``continue_final_message`` prefix comes back before its continuation),
    "" otherwise or without ``echo``. It is not generated: no logprobs, no completion tokens."""
    if not _chat_flag(request, "echo", False):
        return ""
    last = request.messages[-1]
    return message_text(last) if last.role == answer_role(request) else ""


def answer_role(request: ChatCompletionRequest) -> str:
    """vLLM's role of the answer: the assistant's, or without ``add_generation_prompt`` the final
    message's (the answer goes on with it rather than starting a turn)."""
    add, _ = chat_prompt_options(request)
    return "assistant" if add or not request.messages else request.messages[-1].role


def message_text(message: ChatMessage) -> str:
    """A message's text as vLLM gives it to a chat template: its text parts joined by newlines."""
    if isinstance(message.content, list):
        return "\n".join(p.text for p in message.content if isinstance(p, TextPart))
    return message.content or ""


def _chat_flag(request: ChatCompletionRequest, name: str, default: bool) -> bool:
    """A boolean vLLM chat field sent as an extra (null or absent: ``default``)."""
    extras = extra_params(request)
    value = json.loads(bytes(extras[name])) if name in extras else None
    if value is not None and not isinstance(value, bool):
        raise BadRequest(f"{name} must be a boolean", param=name)
    return default if value is None else value


# What the chat template is rendered with besides its variables: the request's own fields, never a
# template variable (in ``chat_template_kwargs`` they were two values for one argument, or lost).
RENDER_ARGUMENTS = ("messages", "add_generation_prompt", "continue_final_message", "add_special_tokens")


def template_variables(request: ChatCompletionRequest) -> dict[str, Any]:
    """vLLM's ``chat_template_kwargs``: variables for the chat template; a renderer's own argument there is a 400."""
    variables: dict[str, Any] = opt(request.chat_template_kwargs, None) or {}
    for name in RENDER_ARGUMENTS:
        if name in variables:
            where = "the request's messages" if name == "messages" else f"the request's own '{name}' field"
            raise BadRequest(f"chat_template_kwargs cannot set '{name}'; use {where}",
                             param=f"chat_template_kwargs.{name}")
    return variables


def chat_messages(request: ChatCompletionRequest) -> list[dict[str, str]]:
    """The conversation as the chat template expects it; one OpenAI refuses, or with features this
    model does not support, is refused."""
    check_conversation(request.messages)
    messages: list[dict[str, Any]] = []
    for i, m in enumerate(request.messages):
        if isinstance(m.content, list) and any(not isinstance(p, TextPart) for p in m.content):
            raise BadRequest("this model accepts text content only", param=f"messages[{i}].content")
        message: dict[str, Any] = {"role": m.role, "content": message_text(m)}
        if m.function_call is not None and m.function_call is not UNSET:  # as the request's legacy ``functions``
            raise BadRequest("legacy function calling is not supported by this model; send the call as tool_calls",
                             param=f"messages[{i}].function_call")
        if m.tool_calls:
            functions = [function_call(c, f"messages[{i}].tool_calls[{j}]", "this model")
                         for j, c in enumerate(m.tool_calls)]
            message["tool_calls"] = [  # a call's id where it has one (a provider's answer may have had none)
                ({"id": c.id} if isinstance(c.id, str) else {})
                | {"type": "function", "function": {"name": f.name, "arguments": _arguments(f.arguments)}}
                for c, f in zip(m.tool_calls, functions, strict=True)
            ]
        if m.tool_call_id:
            message["tool_call_id"] = m.tool_call_id
        if m.name:
            message["name"] = m.name
        messages.append(message)
    return messages


def _arguments(text: str) -> Any:
    """Tool-call arguments as chat templates expect them (a mapping when the text is JSON)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def chat_logprobs_count(request: ChatCompletionRequest) -> int | None:
    if not request.logprobs:
        if opt(request.top_logprobs, None):
            raise BadRequest("top_logprobs requires logprobs: true", param="top_logprobs")
        return None
    return opt(request.top_logprobs, 0)


def completion_prompts(request: CompletionRequest) -> list[str] | list[list[int]]:
    if request.suffix:
        raise BadRequest("suffix is not supported by the local engine", param="suffix")
    if opt(request.best_of, None) not in (None, opt(request.n, 1)):
        raise BadRequest("best_of other than n is not supported", param="best_of")
    try:
        return request.prompts()
    except ValueError as exc:
        raise BadRequest(str(exc), param="prompt") from None


def echo_text(tokenizer: Any, prompt: str | list[int], ids: list[int]) -> tuple[str, frozenset[int]]:
    """A legacy completion's echoed prompt, and the positions in ``ids`` (the prompt's tokens) of
    those whose text it does not hold. As vLLM: a prompt sent as text comes back exactly as sent
    (special tokens' text in it too), less the tokens the tokenizer added (a BOS); one sent as token
    ids is decoded with every token's text, special ones' too."""
    if not isinstance(prompt, str):
        return tokenizer.decode(ids, skip_special_tokens=False), frozenset()
    own = tokenizer.encode(prompt, add_special_tokens=False)  # the text's tokens, without the added ones
    for start in range(len(ids) - len(own) + 1):
        if ids[start:start + len(own)] == own:
            return prompt, frozenset(range(start)) | frozenset(range(start + len(own), len(ids)))
    return prompt, frozenset()


def finish_reason(reason: str | None) -> Any:
    return None if reason is None else ("length" if reason == "length" else "stop")


class LogprobFormatter:
    """Engine ``TokenLogprob`` lists -> the chat and legacy-completion logprob shapes."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> list[int]:
        """The token's own bytes, also when it holds only part of a character (OpenAI's ``bytes``)."""
        return list(self.own_bytes(token_id))

    def own_bytes(self, token_id: int) -> bytes:
        """The engine tokenizer's ``token_bytes``; for a transformers tokenizer (plain ``generate``),
        the bytes of the token's piece when its text is part of a character (a U+FFFD)."""
        own = getattr(self.tokenizer, "token_bytes", None)
        if own is not None:
            return bytes(own(token_id))
        text = self.token(token_id)
        if "\ufffd" in text:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            data = piece_bytes(piece) if isinstance(piece, str) else None
            return data if data is not None else text.encode()
        return text.encode()

    def text_bytes(self, token_id: int, skip_special_tokens: bool) -> bytes:
        """What the token adds to a text decoded with ``skip_special_tokens`` (nothing for a skipped
        special token), as UTF-8 bytes."""
        if skip_special_tokens and not self.tokenizer.decode([token_id], skip_special_tokens=True):
            return b""
        return self.own_bytes(token_id)

    def chat(self, items: list[Any] | None) -> ChoiceLogprobs | None:
        if items is None:
            return None
        out = []
        for lp in items:
            text = self.token(lp.token_id)
            top = [TopLogprob(token=self.token(i), logprob=v, bytes=self.token_bytes(i))
                   for i, v in sorted(lp.top.items(), key=lambda kv: -kv[1])]
            out.append(TokenLogprob(token=text, logprob=lp.logprob, bytes=self.token_bytes(lp.token_id),
                                    top_logprobs=top))
        return ChoiceLogprobs(content=out)

    def prompt(self, prompt_ids: list[int], items: list[Any], k: int | None = None,
               added: frozenset[int] = frozenset()) -> CompletionLogprobs:
        """The echoed prompt's tokens with their logprobs and ``k`` alternatives (``items[0]`` is None:
        nothing predicts the first token). Text offsets are positions in the echoed text, which holds
        every prompt token's text, special ones' too (``echo_text``), but for those at positions
        ``added``: the tokenizer's own (a BOS), not in a prompt sent as text, take no room there."""
        result = CompletionLogprobs()
        offsets = TextOffsets(self, 0, skip_special_tokens=False)
        for i, token_id in enumerate(prompt_ids):
            lp = items[i] if i < len(items) else None
            result.tokens.append(self.token(token_id))
            result.token_logprobs.append(lp.logprob if lp is not None else None)
            result.top_logprobs.append(self._top(lp, k) if lp is not None else None)
            result.text_offset.append(offsets.push(token_id, shown=i not in added))
        return result

    def prompt_entries(self, items: list[Any] | None, k: int) -> PromptLogprobs:
        """vLLM's ``prompt_logprobs`` (``backends.logprobs_wire``) from the engine's: per prompt
        token, itself (with its rank) and its ``k`` most likely alternatives (ranks 1 to ``k``)."""
        out: PromptLogprobs = []
        for lp in items or []:
            if lp is None:
                out.append(None)
                continue
            best = sorted(lp.top.items(), key=lambda kv: -kv[1])[:k]
            entry = {str(lp.token_id): self._entry(lp.logprob, lp.rank, lp.token_id)}
            for rank, (token_id, value) in enumerate(best, start=1):
                entry.setdefault(str(token_id), self._entry(value, rank, token_id))
            out.append(entry)
        return out

    def _entry(self, logprob: float, rank: int | None, token_id: int) -> PromptLogprob:
        """One token's entry; -inf, which JSON cannot carry, becomes vLLM's -9999.0."""
        return PromptLogprob(logprob=max(logprob, -9999.0), rank=rank, decoded_token=self.token(token_id))

    def _top(self, lp: EngineTokenLogprob, k: int | None = None) -> dict[str, float]:
        """The ``k`` (default: all it has) most likely tokens and, as OpenAI and vLLM answer, always
        the token itself (so there may be ``k + 1`` entries): its logprob is there even when it is
        not among them."""
        top = {lp.token_id: lp.logprob, **dict(sorted(lp.top.items(), key=lambda kv: -kv[1])[:k])}
        return {self.token(i): v for i, v in sorted(top.items(), key=lambda kv: -kv[1])}

    def completion(self, items: list[Any] | None, offsets: TextOffsets) -> CompletionLogprobs | None:
        """Generated tokens, their offsets counted by ``offsets`` (a stream keeps one per choice
        across its chunks). Offsets index the returned text, which was decoded with
        ``offsets.skip_special_tokens`` as the request asked: a skipped special token (e.g. an
        end-of-turn the model emitted) takes no room there."""
        if items is None:
            return None
        result = CompletionLogprobs()
        for lp in items:
            result.tokens.append(self.token(lp.token_id))
            result.token_logprobs.append(lp.logprob)
            result.top_logprobs.append(self._top(lp))
            result.text_offset.append(offsets.push(lp.token_id))
        return result


class TextOffsets:
    """OpenAI's ``text_offset`` of tokens decoded one after another: where each token's text starts.

    Counted on the tokens' bytes, not on their text one by one, so that a token holding part of a
    character is at that character (the text holds one character for all its tokens), and a byte
    no later token completes takes the one U+FFFD the text shows for it. What a stream holds back
    (a possible stop string's start) does not move the offsets: they are those of the whole answer.
    A continuation of a ``prompt`` that ends inside a character is decoded after the prompt's text,
    which holds that character (``engine.detok``): the bytes that end it take no room here.
    """

    def __init__(self, formatter: LogprobFormatter, start: int, skip_special_tokens: bool,
                 prompt: Sequence[int] = ()) -> None:
        self.formatter = formatter
        self.skip_special_tokens = skip_special_tokens
        self.chars = start  # characters decoded so far (an incomplete last character not yet)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # The last tokens hold the bytes of any character the prompt begins (a character has at most 4).
        self._decoder.decode(b"".join(formatter.text_bytes(t, skip_special_tokens) for t in prompt[-4:]))
        self._begun = bool(self._decoder.getstate()[0])  # the next character decoded is the prompt's

    def push(self, token_id: int, shown: bool = True) -> int:
        """The offset of the next token, ``token_id`` (one not ``shown`` takes no room)."""
        data = self.formatter.text_bytes(token_id, self.skip_special_tokens) if shown else b""
        pending = self._decoder.getstate()[0]  # the bytes of a character begun and not yet complete
        offset = self.chars
        if pending and data and not self._begun and not _continues(pending + data[:1]):
            offset += len(pending.decode("utf-8", errors="replace"))  # the incomplete character is a U+FFFD
        text = self._decoder.decode(data)
        if self._begun and text:
            text, self._begun = text[1:], False
        self.chars += len(text)
        return offset


def _continues(data: bytes) -> bool:
    """Whether ``data`` is valid UTF-8 so far (possibly ending inside a character)."""
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data)
    except UnicodeDecodeError:
        return False
    return True
