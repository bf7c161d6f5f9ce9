"""The Backend protocol: the one seam between the gateway and every provider.

A backend serves one *deployment* (provider + upstream model + endpoint). It takes a validated
wire request (``backends.openai_wire``) plus the call's ``CallContext`` (tenant, the gateway's output
cap: ``backends.call``) and returns a whole response or a ``ChunkStream``. Every result
carries a ``Meter``: token counts, exact when the provider reported them, estimated otherwise.
Failures are raised as the typed ``BackendError`` subclasses below, so the router can decide
retry vs fallback vs fail without parsing strings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from backends.call import NO_CONTEXT, CallContext
from backends.embeddings_wire import EmbeddingList, EmbeddingRequest
from backends.openai_wire import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    CompletionRequest,
    TextCompletion,
)
from backends.redaction import redact
from backends.responses_wire import RelayedResponse, ResponsesEvent

# ---------------------------------------------------------------- errors


class BackendError(Exception):
    """A provider failure. ``retryable`` says whether another attempt (or deployment) may help;
    ``blames_deployment`` whether it counts against the deployment's circuit breaker."""

    retryable: bool = False
    blames_deployment: bool = True
    kind: str = "upstream_error"
    upstream_request_id: str | None = None  # the provider's own id of the error answer, when its head named one

    def __init__(self, message: str, *, param: str | None = None, status: int | None = None) -> None:
        message = redact(message)  # an upstream's words may echo the gateway's key for it
        super().__init__(message)
        self.message = message
        self.param = redact(param) if param else param  # relayed to the client as the error's ``param``
        self.status = status  # the upstream HTTP status, when there was one


class Interrupted(Exception):
    """What a stream's pending read raises when its reader gave it up (``interrupt()`` on the
    chunks of a ``ChunkStream`` that has it): not a provider failure."""


class BadRequest(BackendError):
    blames_deployment = False  # the request's own fault
    kind = "invalid_request_error"

    def __init__(self, message: str, *, code: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        # the upstream's own error code (OpenAI's "unsupported_parameter", ...), for the client
        self.code = redact(code) if code else code


class ContextTooLong(BadRequest):
    """The prompt (plus the requested output) exceeds the deployment's context window."""

    kind = "context_length_exceeded"


class ModelNotFound(BackendError):
    """The provider does not know the deployment's model (an upstream 404): the deployment is
    misconfigured, not the request, so the router moves on to the next deployment or fallback."""

    kind = "model_not_found"


class RateLimited(BackendError):
    """A 429. ``exhausted``: the upstream's limit is used up for every request (else it refused a
    request as large as this one only, and stays open to the rest: no verdict on the deployment).
    ``reported``: the upstream said which of its limits are used up (rate-limit headers, or out of
    credit); a bare 429 may be about one tenant's or key's own quota upstream, or one request.
    ``tokens_left``: what it said is left of its tokens per minute, for ``tokens_reset`` seconds."""

    retryable = True
    kind = "rate_limited"

    def __init__(self, message: str, *, retry_after: float | None = None, exhausted: bool = True,
                 reported: bool = False, tokens_left: float | None = None, tokens_reset: float | None = None,
                 **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after
        self.exhausted = exhausted
        self.blames_deployment = exhausted
        self.reported = reported
        self.tokens_left = tokens_left
        self.tokens_reset = tokens_reset


class Conflict(BackendError):
    """A 409: the upstream could not serve the request just now because of a concurrent change (OpenAI's
    lock timeouts and conflicting updates, which its SDK retries): another attempt may succeed, and the
    deployment is not at fault."""

    retryable = True
    blames_deployment = False
    kind = "conflict"


class Timeout(BackendError):
    retryable = True
    kind = "timeout"


class Unavailable(BackendError):
    """Connection refused/reset, 5xx, engine overloaded or shutting down. ``retry_after``: the seconds
    a 5xx's ``Retry-After`` asked for, passed on to the client."""

    retryable = True
    kind = "unavailable"

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class UpstreamError(BackendError):
    """The provider answered with something we cannot use (bad body, unexpected status)."""

    kind = "upstream_error"


class RelayedFailure(UpstreamError):
    """The upstream's stream ended right after its own ``error`` event, which was relayed as it came:
    a failure to settle, with nothing more to tell the client."""


class RequestFailed(BackendError):
    """The provider failed this one request while serving others (the in-process engine's
    per-request failure, e.g. sampling its row raised): nothing learnt of the deployment."""

    blames_deployment = False
    kind = "request_failed"


class UntranslatableAnswer(UpstreamError):
    """An answer the client's API cannot express (``gateway.dialects``: a /v1/messages tool call whose
    arguments are not a JSON object): a 502 for this request, with the upstream's usage recorded; no
    verdict on the deployment, whose answer is fine in its own dialect."""

    blames_deployment = False
    kind = "untranslatable_answer"


class AuthFailed(BackendError):
    """The provider refused our credentials: a configuration problem, not the client's."""

    kind = "upstream_auth"


# ---------------------------------------------------------------- metering


@dataclass
class Meter:
    """Token counts for one request, updated as output passes; read after completion or abort."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    exact: bool = True
    first_token_at: float | None = None  # time.perf_counter() of the first output token
    # prompt tokens the provider wrote to its prompt cache (billed above plain input), and of those
    # the ones kept an hour (Anthropic's 1-hour cache, billed higher still)
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    # calls of tools the provider runs and bills per call, as it reports them, by tool: {"web_search": 2}
    tool_calls: dict[str, int] = field(default_factory=dict)
    # the service tier the provider says it served the request at (OpenAI's "priority", "flex",
    # "default"; Anthropic's "priority", "standard"), priced by the model's service_tiers; None: not said
    service_tier: str | None = None
    # the provider's own id of its answer (its x-request-id, apim-request-id or request-id header), what
    # its support asks for; None: an answer without one, or the in-process engine's
    upstream_request_id: str | None = None
    phases: list[tuple[str, float, float]] = field(default_factory=list)  # (name, start, end) in unix time,
    # e.g. the engine's queue / prefill / decode; the gateway turns them into trace spans

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


ChunkT = TypeVar("ChunkT", ChatCompletionChunk, TextCompletion, ResponsesEvent)
ResultT = TypeVar("ResultT", ChatCompletion, TextCompletion, EmbeddingList, RelayedResponse)


@dataclass
class Completed(Generic[ResultT]):
    response: ResultT
    meter: Meter
    # what the answer's rate-limit headers said is left of the upstream's tokens per minute (0: no
    # request is left), for ``tokens_reset`` seconds, as a 429 tells it (``RateLimited``); None: not said
    tokens_left: float | None = None
    tokens_reset: float | None = None


@dataclass
class ChunkStream(Generic[ChunkT]):
    """An async stream of wire chunks plus the meter the producer keeps up to date.

    ``aclose()`` (client gone) closes the producer: an HTTP upstream stream is closed, an engine
    sequence is aborted. After iteration ends or ``aclose()`` returns, ``meter`` holds the final
    counts (for an abort: the tokens actually produced). Chunks with an ``interrupt()`` method can
    have a read that waits give up from a callback: it raises ``Interrupted``.
    """

    chunks: AsyncIterator[ChunkT]
    meter: Meter = field(default_factory=Meter)
    tokens_left: float | None = None  # what the answer's head said of the upstream's limits (see ``Completed``)
    tokens_reset: float | None = None

    def __aiter__(self) -> AsyncIterator[ChunkT]:
        return self.chunks

    async def aclose(self) -> None:
        close = getattr(self.chunks, "aclose", None)
        if close is not None:
            await close()


class ClosingChunks:
    """The chunk iterator of a ``ChunkStream`` over a producer's async generator, with
    ``on_close`` run when the stream is closed or fails, even when iteration never started (an
    unstarted async generator would skip its ``finally``): e.g. abort an engine request. With
    ``on_interrupt`` (the producer's: a read of it that waits raises ``Interrupted``), it has
    ``interrupt()``; the read that fails so closes the stream, as any failure does."""

    interrupt: Callable[[], None]  # only with ``on_interrupt``

    def __init__(self, chunks: AsyncIterator[Any], on_close: Callable[[], Awaitable[None]],
                 on_interrupt: Callable[[], None] | None = None) -> None:
        self._chunks, self._on_close = chunks, on_close
        if on_interrupt is not None:
            self.interrupt = on_interrupt

    def __aiter__(self) -> ClosingChunks:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._chunks.__anext__()
        except BaseException:
            await self._on_close()
            raise

    async def aclose(self) -> None:
        try:
            await self._chunks.aclose()  # type: ignore[attr-defined]
        finally:
            await self._on_close()


# ---------------------------------------------------------------- protocol


@dataclass
class BackendStats:
    """Load figures the router may use (least-busy strategies).

    ``in_flight`` counts every request the backend has accepted and not yet finished, queued ones
    included (an engine counts sequences): it is what ``max_concurrency`` caps, what retiring a
    deployment waits on and what the least-busy strategies compare.
    ``queue_depth`` is the part of ``in_flight`` still waiting to be served (not added to it).
    """

    in_flight: int = 0  # accepted, not finished (queued included)
    queue_depth: int = 0  # of those, waiting for a slot
    kv_cache_usage: float | None = None


@runtime_checkable
class Backend(Protocol):
    """One deployment of one model on one provider."""

    provider: str  # a name registered in backends.providers: "openai", "anthropic", "local", "transformers"
    upstream_model: str

    async def chat(
        self, request: ChatCompletionRequest, ctx: CallContext = NO_CONTEXT
    ) -> Completed[ChatCompletion]: ...

    async def chat_stream(
        self, request: ChatCompletionRequest, ctx: CallContext = NO_CONTEXT
    ) -> ChunkStream[ChatCompletionChunk]:
        """Start a stream. Errors before the first chunk are raised here, not from iteration."""
        ...

    async def complete(
        self, request: CompletionRequest, ctx: CallContext = NO_CONTEXT
    ) -> Completed[TextCompletion]: ...

    async def complete_stream(
        self, request: CompletionRequest, ctx: CallContext = NO_CONTEXT
    ) -> ChunkStream[TextCompletion]: ...

    async def embed(self, request: EmbeddingRequest, ctx: CallContext = NO_CONTEXT) -> Completed[EmbeddingList]:
        """Embeddings (``/v1/embeddings``); a provider or model without them raises BadRequest on ``model``."""
        ...

    def stats(self) -> BackendStats: ...

    async def ready(self) -> bool:
        """Whether the provider is reachable / loaded (used by /readyz)."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class EngineBacked(Protocol):
    """A backend over an in-process engine (``backends.local``): what the gateway may read of it
    beyond ``Backend`` (the ``vllm:*`` metrics, per-tenant figures, an engine node's ``/stats``)."""

    def engine_metrics(self) -> Any:
        """The engine's ``engine.MetricsSnapshot`` (running, waiting, KV usage, prefix hits, tenants)."""
        ...

    def prefix_cache_summary(self, max_roots: int = 64) -> Any:
        """The engine's ``engine.block_manager.PrefixCacheSummary``."""
        ...


@runtime_checkable
class Tokenizing(Protocol):
    """A backend that knows its model's tokenizer and context (the in-process engine): what
    ``/tokenize``, ``/detokenize`` and an exact ``/v1/messages/count_tokens`` need."""

    max_model_len: int

    def tokenize_text(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def tokenize_chat(self, request: ChatCompletionRequest, add_generation_prompt: bool = True,
                      add_special_tokens: bool = False) -> list[int]:
        """The chat template's token ids (with the tokenizer's special tokens added to them when
        ``add_special_tokens``); BadRequest names what the template refused."""
        ...

    def detokenize(self, ids: list[int]) -> str:
        """The text of ``ids``; BadRequest on ``tokens`` for an id outside the vocabulary."""
        ...

    def token_strings(self, ids: list[int]) -> list[str]:
        """Each token's vocabulary entry, as vLLM's ``token_strs`` (``Ġhe``, not its decoded text)."""
        ...


@runtime_checkable
class ServesResponses(Protocol):
    """A provider whose upstream serves OpenAI's Responses API itself (``serves_responses()``), so
    ``/v1/responses`` is passed through as the client sent it instead of translated via chat."""

    def serves_responses(self) -> bool: ...

    async def respond(self, body: dict[str, Any], ctx: CallContext) -> Completed[Any]: ...

    async def respond_stream(self, body: dict[str, Any], ctx: CallContext) -> ChunkStream[Any]: ...

    async def held_response(self, method: str, response_id: str, action: str = "", query: str = "") -> dict[str, Any]:
        """The upstream's answer to ``method`` on a response it holds (``GET``, ``DELETE``, or ``POST``
        with ``action`` ``/cancel``; ``query``: the client's, as it sent it): the object as it came (a
        failure's message redacted)."""
        ...

    async def held_stream(self, response_id: str, query: str) -> ChunkStream[Any]:
        """The event stream of a response it holds (``GET`` with the client's ``query``, which asks
        for ``stream``), opened: failures before its first event raise here."""
        ...

    async def count_input_tokens(self, body: dict[str, Any]) -> dict[str, Any]:
        """The upstream's ``response.input_tokens`` object for ``body`` (``POST /responses/input_tokens``)."""
        ...

    async def compact(self, body: dict[str, Any], ctx: CallContext) -> Completed[Any]:
        """The upstream's compaction of ``body`` (``POST /responses/compact``), metered from its usage."""
        ...


@runtime_checkable
class TokenCounting(Protocol):
    """A provider that counts a conversation's input tokens itself (Anthropic's ``count_tokens``)."""

    async def count_chat_tokens(self, request: ChatCompletionRequest) -> int: ...
