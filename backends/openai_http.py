"""The ``openai`` provider: any OpenAI-compatible HTTP upstream (OpenAI, vLLM, SGLang, Ollama, ...).

Plumbing (pooled client, timeouts, status -> typed error) is ``backends.http_upstream``. Streams
are relayed chunk by chunk, never buffered; usage is always requested upstream
(``stream_options.include_usage``) and stripped again when the client did not ask for it (a
client that asked for vLLM's ``continuous_usage_stats`` with ``include_usage``, as vLLM needs it,
keeps each chunk's usage as sent; ``backends.openai_relay``); when the upstream reports none, the
meter holds an estimate (``exact=False``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import quote

import msgspec
from msgspec import UNSET

from backends.base import ChunkStream, Completed, Meter, Unavailable, UpstreamError
from backends.call import NO_CONTEXT, CallContext
from backends.config import DeploymentConfig
from backends.embeddings_wire import EmbeddingList, EmbeddingRequest
from backends.estimate import (
    estimate_chat_prompt,
    estimate_completion_prompt,
    estimate_embedding_input,
    estimate_text,
    generated_text,
)
from backends.http_upstream import HTTPBackend, answered, raise_if_error, streamed
from backends.openai_relay import ChunkReader, ChunkRelay, UsageWanted, keep_relayed, served_tier, tier_field
from backends.openai_usage import meter_from_usage, without_null_counts
from backends.openai_wire import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    CompletionRequest,
    StreamOptions,
    TextCompletion,
    Usage,
    encode_with_extra,
    extra_params,
    raw_fields,
)
from backends.responses_http import (
    RelayedResponse,
    ResponsesEvent,
    compact,
    count_input_tokens,
    held_response,
    held_stream,
    respond,
    respond_stream,
    upstream_body,
)

DEFAULT_API_BASE = "https://api.openai.com/v1"

C = TypeVar("C", ChatCompletionChunk, TextCompletion)
R = TypeVar("R", ChatCompletion, TextCompletion, EmbeddingList)


def _chat_text(chunk: ChatCompletionChunk) -> str:
    choices = chunk.choices
    if len(choices) == 1 and (content := choices[0].delta.content):  # nearly every chunk: no generator for it
        return content
    return " ".join(text for c in choices if (text := generated_text(c.delta)))  # an empty delta adds no " "


def _completion_text(chunk: TextCompletion) -> str:
    """The choices' texts, apart (run together, one's last word and the next's first were one word;
    an empty one, as in a finish chunk, adds nothing)."""
    return " ".join(c.text for c in chunk.choices if c.text)


_raw_object = msgspec.json.Decoder(dict[str, msgspec.Raw])
_encoder = msgspec.json.Encoder()
_TRUE = msgspec.Raw(b"true")
_INCLUDE_USAGE = msgspec.Raw(b'{"include_usage":true}')


def adjust_params(payload: bytes, config: DeploymentConfig) -> bytes:
    """``payload`` without the deployment's ``drop_params`` and with its ``rename_params`` applied."""
    fields = _raw_object.decode(payload)
    _adjust(fields, config)
    return _encoder.encode(fields)


def _adjust(fields: dict[str, msgspec.Raw], config: DeploymentConfig) -> None:
    for name in config.drop_params:
        fields.pop(name, None)
    for old, new in config.rename_params.items():
        if old in fields:
            fields[new] = fields.pop(old)


def _stream_options(sent: msgspec.Raw | None) -> msgspec.Raw:
    """The client's ``stream_options`` (vLLM's ``continuous_usage_stats`` and the like kept) with
    usage asked for: the gateway meters every stream."""
    options = msgspec.json.decode(sent) if sent is not None else None
    if not isinstance(options, dict) or not options:
        return _INCLUDE_USAGE
    return msgspec.Raw(_encoder.encode(options | {"include_usage": True}))


def _limit_field(request: ChatCompletionRequest | CompletionRequest) -> str:
    """Where the request's output limit goes: chat's ``max_completion_tokens``, completions' ``max_tokens``."""
    return "max_completion_tokens" if isinstance(request, ChatCompletionRequest) else "max_tokens"


class OpenAIHTTPBackend(HTTPBackend):
    """One deployment on an OpenAI-compatible HTTP upstream."""

    provider = "openai"
    default_api_base = DEFAULT_API_BASE

    def __init__(self, config: DeploymentConfig) -> None:
        super().__init__(config, {"authorization": f"Bearer {config.api_key}"} if config.api_key else {})
        # An engine node (switchyard engine serve) schedules fairly across the gateway's tenants.
        self.forward_tenant = bool(config.options.get("forward_tenant", False))

    # ------------------------------------------------------------ Backend protocol

    async def chat(self, request: ChatCompletionRequest, ctx: CallContext = NO_CONTEXT) -> Completed[ChatCompletion]:
        response, head = await self._unary("/chat/completions", self._payload(request, False, ctx), ChatCompletion,
                                           ctx)
        meter = self._unary_meter(response, lambda: estimate_chat_prompt(request),
                                  lambda: " ".join(generated_text(c.message) for c in response.choices))
        return answered(response, meter, head)

    async def complete(self, request: CompletionRequest, ctx: CallContext = NO_CONTEXT) -> Completed[TextCompletion]:
        response, head = await self._unary("/completions", self._payload(request, False, ctx), TextCompletion, ctx)
        meter = self._unary_meter(response, lambda: estimate_completion_prompt(request),
                                  lambda: _completion_text(response))
        return answered(response, meter, head)

    async def chat_stream(
        self, request: ChatCompletionRequest, ctx: CallContext = NO_CONTEXT
    ) -> ChunkStream[ChatCompletionChunk]:
        return await self._open_stream("/chat/completions", self._payload(request, True, ctx), ChatCompletionChunk,
                                       request, estimate_chat_prompt(request), _chat_text, ctx)

    async def complete_stream(
        self, request: CompletionRequest, ctx: CallContext = NO_CONTEXT
    ) -> ChunkStream[TextCompletion]:
        return await self._open_stream("/completions", self._payload(request, True, ctx), TextCompletion,
                                       request, estimate_completion_prompt(request), _completion_text, ctx)

    async def embed(self, request: EmbeddingRequest, ctx: CallContext = NO_CONTEXT) -> Completed[EmbeddingList]:
        if (sent := raw_fields(request)) is not None:  # as the client sent it, every field: only the model is ours
            fields = dict(sent)
            fields["model"] = msgspec.Raw(_encoder.encode(self.upstream_model))
            _adjust(fields, self.config)
            payload = _encoder.encode(fields)
        else:
            payload = msgspec.json.encode(msgspec.structs.replace(request, model=self.upstream_model))
        response, head = await self._unary("/embeddings", payload, EmbeddingList, ctx)
        reported = response.usage.prompt_tokens if response.usage is not None else 0
        meter = Meter(prompt_tokens=reported, first_token_at=time.perf_counter())
        if reported <= 0:  # an upstream that reports no usage (or a negative count): our estimate
            meter.prompt_tokens, meter.exact = estimate_embedding_input(request), False
        return answered(response, meter, head)

    # ------------------------------------------------------------ Responses API (ServesResponses)

    def serves_responses(self) -> bool:
        return self.config.responses_api

    async def respond(self, body: dict[str, Any], ctx: CallContext = NO_CONTEXT) -> Completed[RelayedResponse]:
        payload = upstream_body(body, self.config, False, ctx.output_cap)
        return await respond(self.http, payload, estimate_text(msgspec.json.encode(body.get("input")).decode()),
                             self._headers(ctx))

    async def respond_stream(self, body: dict[str, Any], ctx: CallContext = NO_CONTEXT) -> ChunkStream[ResponsesEvent]:
        payload = upstream_body(body, self.config, True, ctx.output_cap)
        return await respond_stream(self.http, payload,
                                    estimate_text(msgspec.json.encode(body.get("input")).decode()),
                                    self._headers(ctx))

    async def held_response(self, method: str, response_id: str, action: str = "", query: str = "") -> dict[str, Any]:
        return await held_response(self.http, method, _held_path(response_id, action, query))

    async def held_stream(self, response_id: str, query: str) -> ChunkStream[ResponsesEvent]:
        return await held_stream(self.http, _held_path(response_id, "", query))

    async def count_input_tokens(self, body: dict[str, Any]) -> dict[str, Any]:
        return await count_input_tokens(self.http, upstream_body(body, self.config, False, None))

    async def compact(self, body: dict[str, Any], ctx: CallContext = NO_CONTEXT) -> Completed[RelayedResponse]:
        # no output cap added: compaction takes no max_output_tokens
        return await compact(self.http, upstream_body(body, self.config, False, None),
                             estimate_text(msgspec.json.encode(body.get("input")).decode()), self._headers(ctx))

    # ------------------------------------------------------------ internals

    def _headers(self, ctx: CallContext) -> dict[str, str] | None:
        return ctx.tenant_headers() if self.forward_tenant else None

    def _payload(self, request: ChatCompletionRequest | CompletionRequest, stream: bool, ctx: CallContext) -> bytes:
        """The request as the client sent it (fields the gateway does not model included, at any
        depth), with the upstream's model name, usage always requested when streaming, the gateway's
        output cap where the client set none, and the deployment's ``drop_params`` /
        ``rename_params`` applied."""
        cap = ctx.output_cap if request.output_limit() is None else None  # the reservation, as the upstream's limit
        if (sent := raw_fields(request)) is None:  # built by the gateway: encoded from its fields
            return self._encoded_payload(request, stream, cap)
        fields = dict(sent)  # the client's own top-level fields: only those the gateway owns are replaced
        fields["model"] = msgspec.Raw(_encoder.encode(self.upstream_model))
        if stream:
            fields["stream"], fields["stream_options"] = _TRUE, _stream_options(fields.get("stream_options"))
        else:
            fields.pop("stream", None)
            fields.pop("stream_options", None)
        if cap is not None:
            fields[_limit_field(request)] = msgspec.Raw(_encoder.encode(cap))
        if self.config.drop_params or self.config.rename_params:
            _adjust(fields, self.config)
        return _encoder.encode(fields)

    def _encoded_payload(self, request: ChatCompletionRequest | CompletionRequest, stream: bool,
                         cap: int | None) -> bytes:
        """``_payload`` for a request the gateway built (a translation, a copy): from its fields."""
        extra = extra_params(request)
        if cap is not None:
            request = msgspec.structs.replace(request, **{_limit_field(request): cap})
        if stream:
            options = StreamOptions(include_usage=True, continuous_usage_stats=request.continuous_usage or UNSET)
            upstream = msgspec.structs.replace(request, model=self.upstream_model, stream=True, stream_options=options)
        else:
            upstream = msgspec.structs.replace(request, model=self.upstream_model, stream=UNSET, stream_options=UNSET)
        payload = encode_with_extra(upstream, extra)
        return adjust_params(payload, self.config) if self.config.drop_params or self.config.rename_params \
            else payload

    @staticmethod
    def _unary_meter(response: ChatCompletion | TextCompletion, prompt: Callable[[], int],
                     text: Callable[[], str]) -> Meter:
        """The answer's usage; what it does not hold (all, or one count) is estimated, inexact."""
        meter = Meter(first_token_at=time.perf_counter(), service_tier=served_tier(tier_field(response)),
                      exact=False)
        usage = response.usage
        has_prompt, has_completion = meter_from_usage(meter, usage, response) if isinstance(usage, Usage) \
            else (False, False)
        if not has_prompt:
            meter.prompt_tokens = prompt()
        if not has_completion:
            meter.completion_tokens = estimate_text(text())
        return meter

    async def _unary(self, path: str, payload: bytes, type_: type[R],
                     ctx: CallContext) -> tuple[R, Mapping[str, str]]:
        """The decoded answer, and its head."""
        answer = await self.http.post(path, payload, self._headers(ctx))
        body = answer.body
        try:
            try:
                response = msgspec.json.decode(body, type=type_)
            except msgspec.ValidationError:  # a usage count sent as null (left out): decoded without it
                response = msgspec.json.decode(without_null_counts(body), type=type_)
            if hasattr(response, "__dict__"):  # relayed as it came, but for the fields the gateway owns
                keep_relayed(response, body)
            return response, answer.headers
        except (msgspec.MsgspecError, RecursionError) as exc:
            raise_if_error(body)  # a 2xx whose body is an error object fails as what it names
            raise UpstreamError(f"the upstream sent an invalid response: {exc}") from None

    async def _open_stream(self, path: str, payload: bytes, type_: type[C],
                           request: ChatCompletionRequest | CompletionRequest, prompt_estimate: int,
                           text_of: Callable[[C], str], ctx: CallContext) -> ChunkStream[C]:
        """Open the stream and read its first chunk, so failures before the first byte raise here;
        usage is relayed as ``request`` asked for it."""
        response, first_deadline, deadline = await self.http.open_stream(path, payload, self._headers(ctx))
        reader = ChunkReader(response, type_, self.http.timeouts.idle)
        try:
            first = await reader.next(first_deadline)
            if first is None:
                kind = response.headers.get("content-type", "").split(";")[0].strip()
                if kind != "text/event-stream":  # e.g. a whole JSON answer: the upstream does not stream
                    raise UpstreamError(f"the upstream answered a stream request with "
                                        f"{kind or 'no content-type'}, not an event stream")
                # as a dropped connection: nothing reached the client, so another deployment may serve it
                raise Unavailable("the upstream ended the stream without a chunk")
        except BaseException:
            reader.close()
            await self.http.close_stream(response)
            raise
        meter = Meter(prompt_tokens=prompt_estimate, exact=False)
        usage = UsageWanted(request.include_usage, request.continuous_usage)
        relay = ChunkRelay(self.http, response, reader, first, deadline, meter, usage, text_of)
        return streamed(relay, meter, response.headers)


def _held_path(response_id: str, action: str, query: str) -> str:
    """The path of a response the upstream holds (``action`` after it), with the client's ``query``."""
    return f"/responses/{quote(response_id, safe='')}{action}" + (f"?{query}" if query else "")
