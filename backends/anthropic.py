"""The ``anthropic`` provider: OpenAI chat requests served by Anthropic's Messages API.

Requests and responses are translated by ``backends.anthropic_wire``; streams are translated
event by event (``message_start`` -> role chunk, ``content_block_delta`` -> content / tool-call
deltas, ``message_delta`` -> finish reason and output usage), so nothing is buffered; a stream
that ends without ``message_stop`` was cut short and fails (Unavailable); the events a /v1/messages
client is relayed that came before a failure reach it first. Text completions are
served as a one-message chat. A /v1/messages request (``anthropic_body``) goes as the client sent
it, with its ``anthropic-version`` and ``anthropic-beta`` headers (``forward_client_headers``), once
the betas, server tools and Files API references it opts into are allowed by the deployment
(``backends.anthropic_opt_ins``).
Plumbing (timeouts, status -> typed error; 529 "overloaded" -> Unavailable) is
``backends.http_upstream``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from msgspec import UNSET

from backends.anthropic_functions import as_function_call, function_call_delta, uses_functions
from backends.anthropic_json import as_json_answer, json_delta, json_format
from backends.anthropic_opt_ins import check_opt_ins
from backends.anthropic_thinking import redacted_delta, thinking_delta
from backends.anthropic_wire import (
    STOP_REASONS,
    from_messages_response,
    meter_billing,
    to_messages_request,
    usage_of,
)
from backends.base import (
    BackendError,
    BadRequest,
    ChunkStream,
    Completed,
    Meter,
    RateLimited,
    Unavailable,
    UpstreamError,
)
from backends.call import NO_CONTEXT, CallContext
from backends.config import DeploymentConfig
from backends.embeddings_wire import EmbeddingList, EmbeddingRequest
from backends.estimate import estimate_chat_prompt, estimate_text, generated_text
from backends.http_upstream import HTTPBackend, answered, streamed
from backends.openai_wire import (
    ANTHROPIC_EVENTS,
    ANTHROPIC_MESSAGE,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatMessage,
    CompletionChoice,
    CompletionRequest,
    PromptTokensDetails,
    SamplingFields,
    TextCompletion,
    ToolCallDelta,
    Usage,
    anthropic_body,
    extra_params,
    set_extra_params,
)
from backends.raw_http import RawStream
from backends.sse import SSELines

DEFAULT_API_BASE = "https://api.anthropic.com/v1"
API_VERSION = "2023-06-01"
# A /v1/messages client's headers that go upstream as sent (the version it speaks, the betas it opts into).
FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta")
_Shape = Callable[[ChatDelta, str | None], tuple[ChatDelta, str | None]]  # a streamed delta and finish, reshaped
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
        relay = _StreamTranslator(self, events, request.model, request.include_usage, meter,
                                  keep_events=anthropic_body(request) is not None, shape=self._shape(request))
        try:
            await relay.prime()
        except BaseException:
            await relay.aclose()
            raise
        return streamed(relay, meter, events.response.headers)

    def _shape(self, request: ChatCompletionRequest) -> _Shape | None:
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
        text = TextCompletion(id=chat.id, model=chat.model, usage=chat.usage, choices=[
            CompletionChoice(index=0, text=chat.choices[0].message.content or "",
                             finish_reason=chat.choices[0].finish_reason)])
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
            raise UpstreamError(f"upstream {self.deployment_id} sent no input_tokens")
        return tokens

    # ------------------------------------------------------------ internals

    async def _unary(self, body: dict[str, Any], path: str,
                     headers: Mapping[str, str]) -> tuple[dict[str, Any], Mapping[str, str]]:
        """The answer's object, and its head."""
        answer = await self.http.post(path, msgspec.json.encode(body), headers)
        try:
            data = json.loads(answer.body)
        except (ValueError, RecursionError):
            raise UpstreamError(f"upstream {self.deployment_id} sent invalid JSON") from None
        if not isinstance(data, dict) or data.get("type") == "error":
            raise UpstreamError(f"upstream {self.deployment_id} sent an unusable answer")
        return data, answer.headers

    async def _open(self, body: dict[str, Any], headers: Mapping[str, str]) -> _Events:
        response, first_deadline, deadline = await self.http.open_stream("/messages", msgspec.json.encode(body),
                                                                         headers)
        return _Events(response, self.deployment_id, first_deadline, deadline, self.http.timeouts.idle)


class _AsText:
    """A chat chunk stream seen as text-completion chunks; closing it closes the chat stream."""

    def __init__(self, chat: ChunkStream[ChatCompletionChunk]) -> None:
        self._chat = chat

    def __aiter__(self) -> _AsText:
        return self

    async def __anext__(self) -> TextCompletion:
        chunk = await self._chat.chunks.__anext__()
        choices = [CompletionChoice(index=c.index, text=c.delta.content if isinstance(c.delta.content, str) else "",
                                    finish_reason=c.finish_reason) for c in chunk.choices]
        return TextCompletion(id=chunk.id, model=chunk.model, choices=choices, usage=chunk.usage)

    async def aclose(self) -> None:
        await self._chat.aclose()


class _Events:
    """Anthropic SSE events (``event: <type>`` / ``data: {...}``), decoded to dicts."""

    def __init__(
        self, response: RawStream, deployment: str, first_deadline: float, deadline: float, idle: float
    ) -> None:
        self.response = response
        self._lines = SSELines(response, deployment, idle)
        self._deployment = deployment
        self._deadline = first_deadline  # until the first event, then the total deadline
        self._total = deadline

    async def next(self) -> dict[str, Any] | None:
        data = await self._lines.next(self._deadline)
        self._deadline = self._total
        if data is None:
            return None
        try:
            event = json.loads(data)
        except (ValueError, RecursionError):
            raise UpstreamError(f"upstream {self._deployment} sent an invalid event") from None
        if not isinstance(event, dict):
            raise UpstreamError(f"upstream {self._deployment} sent an invalid event")
        return event

    def close(self) -> None:
        self._lines.close()


class _StreamTranslator:
    """Anthropic stream events -> OpenAI ``chat.completion.chunk``s, metering as they pass. With
    ``keep_events`` (a /v1/messages request) every event also rides on the chunks as it came
    (``ANTHROPIC_EVENTS``): on the first chunk made after it, or on a last chunk without choices."""

    def __init__(self, backend: AnthropicBackend, events: _Events, model: str, want_usage: bool, meter: Meter,
                 keep_events: bool = False, shape: _Shape | None = None) -> None:
        self._backend, self._events, self._model = backend, events, model
        self._shape = shape  # the request used legacy functions or a JSON response_format: deltas in its shape
        self._want_usage, self._meter = want_usage, meter
        self._kept: list[dict[str, Any]] | None = [] if keep_events else None
        self._id = "msg"
        self._pending: list[ChatCompletionChunk] = []
        self._tool_index: dict[int, int] = {}  # content block index -> tool call index
        self._no_arguments: set[int] = set()  # content block indexes of tool calls with no arguments yet
        self._usage: dict[str, Any] = {}
        self._closed = False
        self._primed = False  # the first chunk exists: a failure from now on is mid-stream
        self._ended = False  # message_stop came
        self._failure: BackendError | None = None  # raised once the events read before it are out

    def __aiter__(self) -> _StreamTranslator:
        return self

    async def prime(self) -> None:
        """Read until the first chunk exists, so errors before the first byte are raised here."""
        while not self._pending and not self._ended:
            await self._step()
        self._primed = True

    async def __anext__(self) -> ChatCompletionChunk:
        try:
            while not self._pending and not self._ended:
                await self._step()
        except BaseException:
            await self.aclose()
            raise
        if self._pending:
            return self._pending.pop(0)
        await self.aclose()
        raise StopAsyncIteration

    def _chunk(self, delta: ChatDelta, finish: str | None = None, stop: Any = None) -> ChatCompletionChunk:
        if self._shape is not None:
            delta, finish = self._shape(delta, finish)
        choice = ChatChunkChoice(index=0, delta=delta, finish_reason=finish)  # a STOP_REASONS value
        if isinstance(stop, str):
            choice.stop_reason = stop  # the stop sequence that matched
        return ChatCompletionChunk(id=self._id, model=self._model, choices=[choice])

    async def _step(self) -> None:
        made = len(self._pending)
        if self._failure is not None:
            raise self._failure
        try:
            event = await self._events.next()
            if event is None and not self._ended:
                raise Unavailable(f"upstream {self._backend.deployment_id} ended the stream before message_stop")
            if event is not None and self._kept is not None and event.get("type") != "error":
                self._kept.append(event)  # an error event goes out as the failure it raises
            self._translate(event)
        except BackendError as exc:
            self._fail(exc)
        if self._kept and self._ended and len(self._pending) == made:
            self._pending.append(ChatCompletionChunk(id=self._id, model=self._model, choices=[]))
        if self._kept and len(self._pending) > made:
            self._pending[made].__dict__[ANTHROPIC_EVENTS] = self._kept
            self._kept = []

    def _fail(self, exc: BackendError) -> None:
        """A failure mid-stream (an error event, the body ended before ``message_stop``, a broken
        connection): the events read but not yet relayed go out first, in order, on a chunk without
        choices; then it is raised, as any other mid-stream failure (the client gets an error event;
        the request settles as failed). Before the first chunk it is raised at once (it can be retried)."""
        if not self._primed or not self._kept:
            raise exc
        self._failure = exc
        self._pending.append(ChatCompletionChunk(id=self._id, model=self._model, choices=[]))

    def _translate(self, event: dict[str, Any] | None) -> None:
        if event is None:
            return
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self._id = str(message.get("id") or self._id)
            self._take_usage(message.get("usage"))  # the real prompt count, from the start
            self._pending.append(self._chunk(ChatDelta(role="assistant", content="")))
        elif kind == "content_block_start":
            block = event.get("content_block") or {}
            if (redacted := redacted_delta(block)) is not None:  # it comes whole
                self._pending.append(self._chunk(redacted))
            elif block.get("type") == "server_tool_use":
                self._count_call(block.get("name"))
            elif block.get("type") == "tool_use":
                index = self._tool_index.setdefault(at := int(event.get("index", 0)), len(self._tool_index))
                self._no_arguments.add(at)
                call = ToolCallDelta(index=index, id=block.get("id", ""), type="function",
                                     function={"name": block.get("name", ""), "arguments": ""})
                self._pending.append(self._chunk(ChatDelta(tool_calls=[call])))
        elif kind == "content_block_delta":
            self._delta(int(event.get("index", 0)), event.get("delta") or {})
        elif kind == "content_block_stop" and (at := int(event.get("index", 0))) in self._no_arguments:
            self._no_arguments.discard(at)  # a call of no arguments (input {}): "{}", as a whole answer has
            call = ToolCallDelta(index=self._tool_index[at], function={"arguments": "{}"})
            self._pending.append(self._chunk(ChatDelta(tool_calls=[call])))
        elif kind == "message_delta":
            self._take_usage(event.get("usage"), output=True)
            delta = event.get("delta") or {}
            reason = STOP_REASONS.get(delta.get("stop_reason") or "", "stop")
            self._pending.append(self._chunk(ChatDelta(), reason, delta.get("stop_sequence")))
        elif kind == "message_stop":
            self._finish()
        elif kind == "error":
            error = event.get("error") or {}
            message = f"upstream {self._backend.deployment_id}: {error.get('message', 'stream error')}"
            if error.get("type") == "overloaded_error":
                raise Unavailable(message)
            if error.get("type") == "rate_limit_error":
                raise RateLimited(message)
            raise UpstreamError(message)

    def _take_usage(self, usage: Any, output: bool = False) -> None:
        """A ``usage`` object of the stream's (its counts are the totals so far; a null one is no count,
        as the anthropic SDK reads it): the prompt's tokens, and what is billed apart from plain tokens
        (cache reads and writes, server tool calls), at once: a stream cut short still has them billed.
        With ``output`` (message_delta's), its output count is the answer's, kept though no
        message_stop follows; the meter is exact once both counts came (else they stay estimated)."""
        if isinstance(usage, dict):
            self._usage.update({name: value for name, value in usage.items() if value is not None})
            meter_billing(self._meter, self._usage)
            counted = usage_of(self._usage)
            has_prompt = type(self._usage.get("input_tokens")) is int
            if has_prompt:
                self._meter.prompt_tokens = counted.prompt_tokens
            details = counted.prompt_tokens_details
            self._meter.cached_tokens = details.cached_tokens if isinstance(details, msgspec.Struct) else 0
            if output and type(completion := usage.get("output_tokens")) is int:
                self._meter.completion_tokens, self._meter.exact = completion, has_prompt

    def _count_call(self, tool: Any) -> None:
        """A call of a server tool (a ``server_tool_use`` block), counted as it starts: a stream cut short
        before its usage reports the calls still has them billed (the usage's count replaces these)."""
        if isinstance(tool, str) and tool:
            self._meter.tool_calls[tool] = self._meter.tool_calls.get(tool, 0) + 1

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        if delta.get("type") == "text_delta":
            text = delta.get("text", "")
            if self._meter.first_token_at is None:
                self._meter.first_token_at = time.perf_counter()
            self._meter.completion_tokens += estimate_text(text)
            self._pending.append(self._chunk(ChatDelta(content=text)))
        elif (thinking := thinking_delta(delta)) is not None:  # reasoning_content, and thinking_blocks' pieces
            self._meter.completion_tokens += estimate_text(thinking.reasoning_content or "")
            self._pending.append(self._chunk(thinking))
        elif delta.get("type") == "input_json_delta":
            tool, arguments = self._tool_index.get(index, 0), delta.get("partial_json", "")
            if arguments:
                self._no_arguments.discard(index)
            self._meter.completion_tokens += estimate_text(arguments)
            self._pending.append(
                self._chunk(ChatDelta(tool_calls=[ToolCallDelta(index=tool, function={"arguments": arguments})]))
            )

    def _finish(self) -> None:
        if self._ended:
            return
        self._ended = True  # the meter has the usage reported (_take_usage)
        if self._want_usage:
            m = self._meter
            usage = Usage(
                prompt_tokens=m.prompt_tokens, completion_tokens=m.completion_tokens, total_tokens=m.total_tokens
            )
            if m.cached_tokens:  # as a whole answer's usage has them (usage_of)
                usage.prompt_tokens_details = PromptTokensDetails(cached_tokens=m.cached_tokens)
            self._pending.append(ChatCompletionChunk(id=self._id, model=self._model, choices=[], usage=usage))

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._events.close()
            await self._backend.http.close_stream(self._events.response)
