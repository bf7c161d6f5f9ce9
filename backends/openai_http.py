"""The ``openai`` provider: any OpenAI-compatible HTTP upstream (OpenAI, vLLM, SGLang, Ollama, ...).

Plumbing (pooled client, timeouts, status -> typed error) is ``backends.http_upstream``. Streams
are relayed chunk by chunk, never buffered; usage is always requested upstream
(``stream_options.include_usage``) and stripped again when the client did not ask for it (a
client that asked for vLLM's ``continuous_usage_stats`` with ``include_usage``, as vLLM needs it,
keeps each chunk's usage as sent); when
the upstream reports none, the meter holds an estimate (``exact=False``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

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
from backends.http_upstream import (
    ErrorDetail,
    ErrorEnvelope,
    HTTPBackend,
    HTTPUpstream,
    answered,
    raise_if_error,
    streamed,
)
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
    relayed,
    set_relayed,
)
from backends.raw_http import RawStream
from backends.redaction import redact_json
from backends.responses_http import RelayedResponse, ResponsesEvent, respond, respond_stream, upstream_body
from backends.sse import WAIT, SSELines

DEFAULT_API_BASE = "https://api.openai.com/v1"

C = TypeVar("C", ChatCompletionChunk, TextCompletion)
R = TypeVar("R", ChatCompletion, TextCompletion, EmbeddingList)


def _chat_text(chunk: ChatCompletionChunk) -> str:
    choices = chunk.choices
    if len(choices) == 1 and (content := choices[0].delta.content):  # nearly every chunk: no generator for it
        return content
    return " ".join(generated_text(c.delta) for c in choices)


def _completion_text(chunk: TextCompletion) -> str:
    return "".join(c.text for c in chunk.choices)


def _tier_field(obj: Any) -> msgspec.Raw | None:
    """An upstream answer's (or chunk's) ``service_tier`` field as it came, None when it has none."""
    raw = relayed(obj)
    return raw.get("service_tier") if raw is not None else None


def _served_tier(sent: msgspec.Raw | None) -> str | None:
    """The service tier a ``service_tier`` field says the request was served at (``"priority"``), None
    when it names none."""
    if sent is None:
        return None
    try:
        tier = msgspec.json.decode(sent)
    except msgspec.DecodeError:
        return None
    return tier if isinstance(tier, str) and tier else None


_raw_object = msgspec.json.Decoder(dict[str, msgspec.Raw])


_encoder = msgspec.json.Encoder()
_TRUE = msgspec.Raw(b"true")
_NULL = msgspec.Raw(b"null")
_INCLUDE_USAGE = msgspec.Raw(b'{"include_usage":true}')


def _keep_relayed(obj: Any, data: bytes) -> None:
    """Keep an answer's or chunk's ``data`` on ``obj`` to relay as it came; one that carries an
    error (OpenRouter's failure, whole or mid-stream) with every provider secret masked in it."""
    raw = _raw_object.decode(data)
    if (error := raw.get("error")) is not None and error != _NULL:  # a dict lookup: no scan of the chunk
        raw = _raw_object.decode(data := redact_json(data))
    set_relayed(obj, raw, data)


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
        meter = Meter(first_token_at=time.perf_counter(), service_tier=_served_tier(_tier_field(response)),
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
                _keep_relayed(response, body)
            return response, answer.headers
        except (msgspec.MsgspecError, RecursionError) as exc:
            raise_if_error(body)  # a 2xx whose body is an error object fails as what it names
            raise UpstreamError(f"upstream {self.deployment_id} sent an invalid response: {exc}") from None

    async def _open_stream(self, path: str, payload: bytes, type_: type[C],
                           request: ChatCompletionRequest | CompletionRequest, prompt_estimate: int,
                           text_of: Callable[[C], str], ctx: CallContext) -> ChunkStream[C]:
        """Open the stream and read its first chunk, so failures before the first byte raise here;
        usage is relayed as ``request`` asked for it."""
        response, first_deadline, deadline = await self.http.open_stream(path, payload, self._headers(ctx))
        reader = _ChunkReader(response, type_, self.deployment_id, self.http.timeouts.idle)
        try:
            first = await reader.next(first_deadline)
            if first is None:
                kind = response.headers.get("content-type", "").split(";")[0].strip()
                if kind != "text/event-stream":  # e.g. a whole JSON answer: the upstream does not stream
                    raise UpstreamError(f"upstream {self.deployment_id} answered a stream request with "
                                        f"{kind or 'no content-type'}, not an event stream")
                # as a dropped connection: nothing reached the client, so another deployment may serve it
                raise Unavailable(f"upstream {self.deployment_id} ended the stream without a chunk")
        except BaseException:
            reader.close()
            await self.http.close_stream(response)
            raise
        meter = Meter(prompt_tokens=prompt_estimate, exact=False)
        usage = _UsageWanted(request.include_usage, request.continuous_usage)
        relay = _Relay(self.http, response, reader, first, deadline, meter, usage, text_of)
        return streamed(relay, meter, response.headers)


class _ChunkReader:
    """Decodes each ``data:`` event into a chunk Struct; an ``{"error": ...}`` event raises."""

    def __init__(self, response: RawStream, type_: type[Any], deployment: str, idle: float) -> None:
        self._lines = SSELines(response, deployment, idle)
        self._decoder = msgspec.json.Decoder(type_)
        self._deployment = deployment

    async def next(self, deadline: float) -> Any:
        data = await self._lines.next(deadline)
        return None if data is None else self._decode(data)

    def poll(self) -> Any:
        """``next`` without waiting: a chunk if a whole one has arrived, None at the end, else WAIT."""
        data = self._lines.poll()
        return data if data is None or data is WAIT else self._decode(data)  # type: ignore[arg-type]

    @property
    def lines(self) -> SSELines:
        return self._lines

    def _decode(self, data: bytes) -> Any:
        try:
            chunk = self._decoder.decode(data)
        except (msgspec.MsgspecError, RecursionError) as exc:
            chunk = self._decode_failed(data, exc)
        _keep_relayed(chunk, data)
        return chunk

    def _decode_failed(self, data: bytes, exc: Exception) -> Any:
        """A chunk that did not decode: one whose usage holds a count sent as null (left out),
        decoded without it; else the failure it names (or its invalidity) raised."""
        try:
            return self._decoder.decode(without_null_counts(data))
        except (msgspec.MsgspecError, RecursionError):
            try:
                envelope = msgspec.json.decode(data, type=ErrorEnvelope)
            except (msgspec.MsgspecError, RecursionError):
                raise UpstreamError(f"upstream {self._deployment} sent an invalid chunk: {exc}") from None
            error = envelope.error if isinstance(envelope.error, ErrorDetail) else ErrorDetail(envelope.error)
            raise UpstreamError(f"upstream {self._deployment} failed mid-stream: {error.message}") from None

    def close(self) -> None:
        self._lines.close()


@dataclass(frozen=True)
class _UsageWanted:
    """The usage a client asked for in a stream: the closing usage chunk (``include_usage``), the
    usage each chunk carries (vLLM's ``continuous_usage_stats``)."""

    final: bool
    per_chunk: bool


class _Relay(Generic[C]):
    """Relays upstream chunks, keeping the meter current and usage chunks as the client asked:
    pulled (``__anext__``) or pushed as they arrive (``push``).

    ``aclose()`` (also before the first ``__anext__``) closes the upstream response.
    """

    def __init__(self, http: HTTPUpstream, response: RawStream, reader: _ChunkReader, first: C,
                 deadline: float, meter: Meter, usage: _UsageWanted, text_of: Callable[[C], str]) -> None:
        self._http, self._response, self._reader = http, response, reader
        self._pending: C | None = first
        self._last: C = first
        self._unfinished: set[int] = set()  # indices of the choices seen whose finish_reason has not come
        self._began = False  # a chunk with a choice came (not only Azure's first, its prompt filter results)
        self._deadline, self._meter, self._usage = deadline, meter, usage
        self._text_of: Callable[[C], str] = text_of
        self._saw_usage = False
        self._estimating = True  # the completion counted from the text, until a usage holds its count
        # chunks still read for the service tier until one names it: the first two (Azure's first,
        # its prompt filter results, names none), then only the usage chunk (a per-chunk cost saved)
        self._tier_reads = 2
        self._closed = False
        self._failure: BaseException | None = None  # met while pushing: raised by the next __anext__
        self._note_tier(first)

    def __aiter__(self) -> _Relay[C]:
        return self

    async def __anext__(self) -> C:
        if self._closed:
            raise StopAsyncIteration
        try:
            if (failure := self._failure) is not None:
                self._failure = None
                raise failure
            while True:
                chunk = self._pending if self._pending is not None else await self._reader.next(self._deadline)
                self._pending = None
                if chunk is None:
                    self._check_finished()
                    break
                if (out := self._account(chunk)) is not None:
                    return out
        except BaseException:
            await self.aclose()
            raise
        await self.aclose()
        if self._usage.final and not self._saw_usage:
            return self._estimated_usage_chunk()
        raise StopAsyncIteration

    async def push(self, sink: Callable[[C], bool]) -> None:
        """Hand each chunk to ``sink`` as soon as it arrives, inside the upstream connection's
        callback (no task switch per chunk), until ``sink`` returns False, the stream ends or fails,
        or this task is cancelled; then return, and ``__anext__`` goes on from there (an end or a
        failure met here is met again, or raised, by the next ``__anext__``)."""
        if self._closed or self._pending is not None or self._failure is not None:
            return
        reader = self._reader
        reader.lines.arm(self._deadline)

        def relay_arrived() -> bool:
            try:
                while (chunk := reader.poll()) is not WAIT:
                    if chunk is None:
                        return False
                    if (out := self._account(chunk)) is not None and not sink(out):
                        return False
                return True
            except Exception as exc:  # raised by the next __anext__, in the task
                self._failure = exc
                return False

        if relay_arrived():
            await reader.lines.content.wait(relay_arrived)

    @property
    def unfinished(self) -> set[int]:
        """The indices of the choices relayed whose ``finish_reason`` has not come (for a stream cut short)."""
        return self._unfinished

    def _check_finished(self) -> None:
        """At the end of the body: a stream that ended without ``[DONE]`` while a choice it had
        begun had no ``finish_reason`` yet, or before any choice began, was cut short, not completed."""
        if not self._reader.lines.saw_done and (self._unfinished or not self._began):
            raise Unavailable(f"upstream {self._http.deployment_id} ended the stream before it finished")

    def _account(self, chunk: C) -> C | None:
        """Update the meter from one chunk; the chunk to relay, or None to drop it."""
        meter = self._meter
        self._last = chunk
        if chunk.choices:
            self._began = True
        for choice in chunk.choices:
            if choice.finish_reason is None:
                self._unfinished.add(choice.index)
            else:
                self._unfinished.discard(choice.index)
        if self._tier_reads and meter.service_tier is None:
            self._tier_reads -= 1
            self._note_tier(chunk)
        if text := self._text_of(chunk):
            if meter.first_token_at is None:
                meter.first_token_at = time.perf_counter()
            if self._estimating:
                meter.completion_tokens += estimate_text(text)
        usage = chunk.usage
        if isinstance(usage, Usage):
            self._saw_usage = True
            self._estimating = not meter_from_usage(meter, usage, chunk)[1]
            if meter.service_tier is None:
                self._note_tier(chunk)
        if usage is not UNSET and not self._usage.final:  # a usage field sent, even null, is not relayed
            if not chunk.choices and usage is not None:  # the closing usage chunk (not Azure's first, usage null)
                return None
            if not self._usage.per_chunk:
                chunk.usage = UNSET
        return chunk

    def _note_tier(self, chunk: C) -> None:
        """The service tier a chunk names, onto the meter (a stream may end without a usage chunk)."""
        self._meter.service_tier = _served_tier(_tier_field(chunk)) or self._meter.service_tier

    def _estimated_usage_chunk(self) -> C:
        """The upstream reported no usage but the client asked for it: send our estimate."""
        m = self._meter
        usage = Usage(prompt_tokens=m.prompt_tokens, completion_tokens=m.completion_tokens, total_tokens=m.total_tokens)
        return msgspec.structs.replace(self._last, choices=[], usage=usage)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._reader.close()
            await self._http.close_stream(self._response)
