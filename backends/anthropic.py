"""The ``anthropic`` provider: OpenAI chat requests served by Anthropic's Messages API.

Requests and responses are translated by ``backends.anthropic_wire``; streams event by event, by
``backends.anthropic_stream``. Text completions are served as a one-message chat. A /v1/messages
request (``anthropic_body``) goes as the client sent it, with its ``anthropic-version`` and
``anthropic-beta`` headers (``forward_client_headers``), once the betas, server tools and Files API
references it opts into are allowed by the deployment (``backends.anthropic_opt_ins``).
Plumbing (timeouts, status -> typed error; 529 "overloaded" -> Unavailable) is
``backends.http_upstream``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import msgspec
from msgspec import UNSET

from backends.anthropic_functions import as_function_call, function_call_delta, uses_functions
from backends.anthropic_json import as_json_answer, json_delta, json_format
from backends.anthropic_opt_ins import check_opt_ins
from backends.anthropic_stream import Events, Shape, StreamTranslator
from backends.anthropic_wire import (
    from_messages_response,
    meter_billing,
    to_messages_request,
)
from backends.base import (
    BadRequest,
    ChunkStream,
    Completed,
    Meter,
    UpstreamError,
)
from backends.call import NO_CONTEXT, CallContext
from backends.config import DeploymentConfig
from backends.embeddings_wire import EmbeddingList, EmbeddingRequest
from backends.estimate import estimate_chat_prompt, estimate_text, generated_text
from backends.http_upstream import HTTPBackend, answered, streamed
from backends.openai_wire import (
    ANTHROPIC_MESSAGE,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    CompletionChoice,
    CompletionRequest,
    SamplingFields,
    TextCompletion,
    Usage,
    anthropic_body,
    extra_params,
    set_extra_params,
)

DEFAULT_API_BASE = "https://api.anthropic.com/v1"
API_VERSION = "2023-06-01"
# A /v1/messages client's headers that go upstream as sent (the version it speaks, the betas it opts into).
FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta")
_CLIENT_HEADERS = "_anthropic_client_headers"  # on a chat request: those of FORWARDED_HEADERS the client sent
# Fields of a /v1/messages body that the gateway sets itself upstream, and count_tokens does not take.
_GENERATION_ONLY = frozenset({"max_tokens", "stream"})
# A text completion's own fields, and the values that ask for nothing.
_TEXT_ONLY: dict[str, tuple[Any, ...]] = {"echo": (UNSET, None, False), "suffix": (UNSET, None, ""),
                                          "best_of": (UNSET, None, 1), "logprobs": (UNSET, None)}


def forward_client_headers(request: ChatCompletionRequest, headers: Mapping[str, str]) -> None:
    """Have ``request`` (one from /v1/messages) carry the client's ``FORWARDED_HEADERS`` upstream
    (a value that could not be a header line is left out: it would fail as the upstream's fault)."""
    request.__dict__[_CLIENT_HEADERS] = {name: value for name in FORWARDED_HEADERS
                                         if (value := headers.get(name)) is not None
                                         and not any(c in value for c in "\r\n\0")}


def _upstream_headers(request: ChatCompletionRequest) -> dict[str, str]:
    sent: dict[str, str] = request.__dict__.get(_CLIENT_HEADERS) or {}
    return {"anthropic-version": API_VERSION} | sent


class AnthropicBackend(HTTPBackend):
    provider = "anthropic"
    default_api_base = DEFAULT_API_BASE

    def __init__(self, config: DeploymentConfig) -> None:
        headers = {}  # anthropic-version goes with each request: a /v1/messages client's own, if it sent one
        if config.api_key:
            headers["x-api-key"] = config.api_key
        super().__init__(config, headers)
        self._max_tokens = int(config.options.get("max_tokens", 4096))

    def serves_messages(self) -> bool:
        """A /v1/messages request comes as the client sent it (gateway.dialects.anthropic_request)."""
        return True

    def _request(self, request: ChatCompletionRequest, ctx: CallContext, stream: bool) -> dict[str, Any]:
        """The upstream body for ``request``, once what it opts into is allowed (a 400 else)."""
        body = self._body(request, ctx, stream)
        check_opt_ins(self.config, body, _upstream_headers(request))
        return body

    def _body(self, request: ChatCompletionRequest, ctx: CallContext, stream: bool) -> dict[str, Any]:
        max_tokens = ctx.output_limit(request.output_limit()) or self._max_tokens
        drop, rename = self.config.drop_params, self.config.rename_params
        if (original := anthropic_body(request)) is not None:  # a /v1/messages request: sent as it came
            body = {k: v for k, v in original.items() if k not in drop and k != "stream"}
            body |= {"model": self.upstream_model, "max_tokens": max_tokens} | ({"stream": True} if stream else {})
            return body
        if drop or rename:  # the deployment's adjustments apply to the client's fields before mapping
            extra = {rename.get(k, k): v for k, v in extra_params(request).items() if k not in drop}
            request = msgspec.structs.replace(request)
            set_extra_params(request, extra)
        body = to_messages_request(request, self.upstream_model, stream=stream, max_tokens=max_tokens,
                                   dropped=drop, answer_room=ctx.output_limit(request.output_limit()) is None)
        for name in drop:
            body.pop(name, None)
        return body

    # ------------------------------------------------------------ chat

    async def chat(self, request: ChatCompletionRequest, ctx: CallContext = NO_CONTEXT) -> Completed[ChatCompletion]:
        body = self._request(request, ctx, stream=False)
        data, head = await self._unary(body, "/messages", _upstream_headers(request))
        response = from_messages_response(data, request.model)
        response.__dict__[ANTHROPIC_MESSAGE] = data  # /v1/messages relays it as it came
        if uses_functions(request):
            as_function_call(response)
        elif json_format(request, self.config.drop_params) is not None:  # answered through its forced tool
            as_json_answer(response)
        usage = response.usage if isinstance(response.usage, Usage) else Usage()
        meter = Meter(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                      first_token_at=time.perf_counter())
        meter_billing(meter, reported := data.get("usage"))
        if isinstance(usage.prompt_tokens_details, msgspec.Struct):
            meter.cached_tokens = usage.prompt_tokens_details.cached_tokens
        has_prompt, has_completion = (isinstance(reported, dict) and type(reported.get(name)) is int
                                      for name in ("input_tokens", "output_tokens"))
        if not (has_prompt and has_completion):  # a count it left out: estimated, and the answer shows it
            if not has_prompt:
                meter.prompt_tokens = estimate_chat_prompt(request)
            if not has_completion:
                meter.completion_tokens = estimate_text(generated_text(response.choices[0].message))
            meter.exact = False
            usage.prompt_tokens, usage.completion_tokens = meter.prompt_tokens, meter.completion_tokens
            usage.total_tokens = meter.total_tokens
            response.usage = usage
        return answered(response, meter, head)

    async def chat_stream(
        self, request: ChatCompletionRequest, ctx: CallContext = NO_CONTEXT
    ) -> ChunkStream[ChatCompletionChunk]:
        body = self._request(request, ctx, stream=True)
        meter = Meter(prompt_tokens=estimate_chat_prompt(request), exact=False)
        events = await self._open(body, _upstream_headers(request))
        relay = StreamTranslator(self, events, request.model, request.include_usage, meter,
                                  keep_events=anthropic_body(request) is not None, shape=self._shape(request))
        try:
            await relay.prime()
        except BaseException:
            await relay.aclose()
            raise
        return streamed(relay, meter, events.response.headers)

    def _shape(self, request: ChatCompletionRequest) -> Shape | None:
        """How a streamed answer is reshaped: legacy functions', or a JSON response_format's."""
        if uses_functions(request):
            return function_call_delta
        return json_delta if json_format(request, self.config.drop_params) is not None else None

    # ------------------------------------------------------------ text completions, as chat

    @staticmethod
    def _as_chat(request: CompletionRequest) -> ChatCompletionRequest:
        """A one-message chat with every field ``request`` shares with chat (and its unmodelled ones),
        so the chat translation refuses what Anthropic cannot do; a text completion's own field that
        asks for something (``_TEXT_ONLY``), or a prompt of no text, is a 400 naming it."""
        prompts = request.prompts()
        if len(prompts) != 1 or not isinstance(prompts[0], str):
            raise BadRequest("the anthropic provider takes exactly one text prompt", param="prompt")
        if not prompts[0].strip():  # named as the client sent it, not as the chat message it becomes
            raise BadRequest("the anthropic provider takes no empty or whitespace-only prompt (Anthropic refuses "
                             "empty text)", param="prompt")
        for name, neutral in _TEXT_ONLY.items():
            if getattr(request, name) not in neutral:
                raise BadRequest(f"'{name}' is not supported by the anthropic provider", param=name)
        fields = {f.name: getattr(request, f.name) for f in msgspec.structs.fields(SamplingFields)}
        chat = ChatCompletionRequest(messages=[ChatMessage(role="user", content=prompts[0])], **fields)
        set_extra_params(chat, extra_params(request))
        return chat

    async def complete(self, request: CompletionRequest, ctx: CallContext = NO_CONTEXT) -> Completed[TextCompletion]:
        done = await self.chat(self._as_chat(request), ctx)
        chat = done.response
        choice = chat.choices[0]  # its stop_reason: the stop sequence that matched, if one did
        text = TextCompletion(id=chat.id, model=chat.model, usage=chat.usage, choices=[
            CompletionChoice(index=0, text=choice.message.content or "", finish_reason=choice.finish_reason,
                             stop_reason=choice.stop_reason)])
        return Completed(text, done.meter, done.tokens_left, done.tokens_reset)

    async def complete_stream(
        self, request: CompletionRequest, ctx: CallContext = NO_CONTEXT
    ) -> ChunkStream[TextCompletion]:
        chat = await self.chat_stream(self._as_chat(request), ctx)
        return ChunkStream(_AsText(chat), chat.meter, chat.tokens_left, chat.tokens_reset)

    async def embed(self, request: EmbeddingRequest, ctx: CallContext = NO_CONTEXT) -> Completed[EmbeddingList]:
        raise BadRequest("the anthropic provider serves no embeddings", param="model")

    async def count_chat_tokens(self, request: ChatCompletionRequest) -> int:
        """The upstream's own count (``POST /messages/count_tokens``; backends.base.TokenCounting): of
        a /v1/messages body as the client sent it, else of the chat request's translation."""
        if (original := anthropic_body(request)) is not None:
            drop = self.config.drop_params
            counted = {k: v for k, v in original.items() if k not in drop and k not in _GENERATION_ONLY}
            counted["model"] = self.upstream_model
            check_opt_ins(self.config, counted, _upstream_headers(request))
        else:
            body = self._request(request, NO_CONTEXT, stream=False)
            counted = {k: v for k, v in body.items() if k in ("model", "messages", "system", "tools", "tool_choice")}
        data, _ = await self._unary(counted, "/messages/count_tokens", _upstream_headers(request))
        tokens = data.get("input_tokens")
        if not isinstance(tokens, int):
            raise UpstreamError("the upstream sent no input_tokens")
        return tokens

    # ------------------------------------------------------------ internals

    async def _unary(self, body: dict[str, Any], path: str,
                     headers: Mapping[str, str]) -> tuple[dict[str, Any], Mapping[str, str]]:
        """The answer's object, and its head."""
        answer = await self.http.post(path, msgspec.json.encode(body), headers)
        try:
            data = json.loads(answer.body)
        except (ValueError, RecursionError):
            raise UpstreamError("the upstream sent invalid JSON") from None
        if not isinstance(data, dict) or data.get("type") == "error":
            raise UpstreamError("the upstream sent an unusable answer")
        return data, answer.headers

    async def _open(self, body: dict[str, Any], headers: Mapping[str, str]) -> Events:
        response, first_deadline, deadline = await self.http.open_stream("/messages", msgspec.json.encode(body),
                                                                         headers)
        return Events(response, first_deadline, deadline, self.http.timeouts.idle)


class _AsText:
    """A chat chunk stream seen as text-completion chunks; closing it closes the chat stream."""

    def __init__(self, chat: ChunkStream[ChatCompletionChunk]) -> None:
        self._chat = chat

    def __aiter__(self) -> _AsText:
        return self

    async def __anext__(self) -> TextCompletion:
        chunk = await self._chat.chunks.__anext__()
        choices = [CompletionChoice(index=c.index, text=c.delta.content if isinstance(c.delta.content, str) else "",
                                    finish_reason=c.finish_reason, stop_reason=c.stop_reason) for c in chunk.choices]
        return TextCompletion(id=chunk.id, model=chunk.model, choices=choices, usage=chunk.usage)

    def interrupt(self) -> None:
        """The chat stream's ``interrupt`` (``StreamTranslator.interrupt``)."""
        self._chat.chunks.interrupt()  # type: ignore[attr-defined]  # the anthropic chat stream's

    async def aclose(self) -> None:
        await self._chat.aclose()
