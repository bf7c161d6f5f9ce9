"""The ``openai`` provider: any OpenAI-compatible HTTP upstream (OpenAI, vLLM, SGLang, Ollama, ...).

One pooled ``httpx.AsyncClient`` per deployment. Timeouts from ``DeploymentConfig.timeouts``:
``connect`` for the TCP/TLS handshake, ``first_byte`` until a stream's headers *and* first chunk
arrive (a non-streaming answer only arrives when generation is done, so it is bounded by
``total`` alone), ``total`` for the whole request. Streams are relayed chunk by chunk; usage is
always requested upstream and stripped again when the client did not ask for it.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio
import httpx
import msgspec
from msgspec import UNSET

from backends.base import (
    AuthFailed,
    BackendError,
    BackendStats,
    BadRequest,
    ChunkStream,
    Completed,
    ContextTooLong,
    Meter,
    RateLimited,
    Timeout,
    Unavailable,
    UpstreamError,
)
from backends.estimate import estimate_chat_prompt, estimate_completion_prompt, estimate_text
from backends.types import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    CompletionRequest,
    StreamOptions,
    TextCompletion,
    Usage,
)
from gateway.settings import DeploymentConfig

DEFAULT_API_BASE = "https://api.openai.com/v1"
_CONTEXT_HINTS = ("context length", "context_length", "maximum context", "context window", "too many tokens",
                  "prompt is too long")

C = TypeVar("C", ChatCompletionChunk, TextCompletion)
R = TypeVar("R", ChatCompletion, TextCompletion)


class _ErrorDetail(msgspec.Struct):
    message: str = ""
    param: str | None = None
    code: str | int | None = None
    type: str | None = None


class _ErrorEnvelope(msgspec.Struct):
    error: _ErrorDetail | str


def _parse_error(body: bytes) -> _ErrorDetail:
    try:
        envelope = msgspec.json.decode(body, type=_ErrorEnvelope)
    except msgspec.MsgspecError:
        text = body.decode("utf-8", "replace").strip()
        return _ErrorDetail(message=text[:500])
    if isinstance(envelope.error, str):
        return _ErrorDetail(message=envelope.error)
    return envelope.error


def _retry_after(headers: httpx.Headers) -> float | None:
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())


def status_error(status: int, headers: httpx.Headers, body: bytes) -> BackendError:
    """The typed error for an upstream answer with a non-2xx status."""
    detail = _parse_error(body)
    message = detail.message or f"upstream answered HTTP {status}"
    code = str(detail.code) if detail.code is not None else ""
    if status == 429:
        return RateLimited(message, retry_after=_retry_after(headers), status=status)
    if status in (401, 403):
        return AuthFailed(message, status=status)
    if status in (400, 413, 422):
        if code == "context_length_exceeded" or any(h in message.lower() for h in _CONTEXT_HINTS):
            return ContextTooLong(message, param=detail.param, status=status)
        return BadRequest(message, param=detail.param, status=status)
    if status == 408:
        return Timeout(message, status=status)
    if status >= 500:
        return Unavailable(message, status=status)
    return UpstreamError(f"upstream answered HTTP {status}: {message}", status=status)


def _chat_text(chunk: ChatCompletionChunk) -> str:
    return "".join(c.delta.content for c in chunk.choices if isinstance(c.delta.content, str))


def _completion_text(chunk: TextCompletion) -> str:
    return "".join(c.text for c in chunk.choices)


def _chat_response_text(response: ChatCompletion) -> str:
    return "".join(c.message.content or "" for c in response.choices)


def _meter_from_usage(meter: Meter, usage: Usage) -> None:
    meter.prompt_tokens = usage.prompt_tokens
    meter.completion_tokens = usage.completion_tokens
    details = usage.prompt_tokens_details
    meter.cached_tokens = details.cached_tokens if details is not UNSET and details is not None else 0
    meter.exact = True


class OpenAIHTTPBackend:
    """One deployment on an OpenAI-compatible HTTP upstream."""

    provider = "openai"

    def __init__(self, config: DeploymentConfig, *, client: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self.upstream_model = config.model
        self.deployment_id = config.id
        self._timeouts = config.timeouts
        limit = config.max_concurrency or 256
        headers = {"authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        t = config.timeouts
        self._client = client or httpx.AsyncClient(
            base_url=(config.api_base or DEFAULT_API_BASE).rstrip("/"),
            headers=headers,
            # Per-read and pool waits are bounded by the overall deadlines enforced below.
            timeout=httpx.Timeout(connect=t.connect, read=t.total, write=t.total, pool=t.first_byte),
            limits=httpx.Limits(max_connections=limit, max_keepalive_connections=min(limit, 64)),
        )
        self._in_flight = 0

    # ------------------------------------------------------------ Backend protocol

    async def chat(self, request: ChatCompletionRequest) -> Completed[ChatCompletion]:
        response = await self._unary("/chat/completions", self._payload(request, False), ChatCompletion)
        return Completed(response, self._unary_meter(response.usage, lambda: estimate_chat_prompt(request),
                                                     lambda: _chat_response_text(response)))

    async def complete(self, request: CompletionRequest) -> Completed[TextCompletion]:
        response = await self._unary("/completions", self._payload(request, False), TextCompletion)
        return Completed(response, self._unary_meter(response.usage, lambda: estimate_completion_prompt(request),
                                                     lambda: "".join(c.text for c in response.choices)))

    async def chat_stream(self, request: ChatCompletionRequest) -> ChunkStream[ChatCompletionChunk]:
        return await self._open_stream(
            "/chat/completions", self._payload(request, True), ChatCompletionChunk,
            want_usage=request.include_usage, prompt_estimate=estimate_chat_prompt(request), text_of=_chat_text,
        )

    async def complete_stream(self, request: CompletionRequest) -> ChunkStream[TextCompletion]:
        return await self._open_stream(
            "/completions", self._payload(request, True), TextCompletion,
            want_usage=request.include_usage, prompt_estimate=estimate_completion_prompt(request),
            text_of=_completion_text,
        )

    def stats(self) -> BackendStats:
        return BackendStats(in_flight=self._in_flight)

    async def ready(self) -> bool:
        """Reachable: ``GET /models`` gets any answer below 500 within the connect timeout."""
        try:
            response = await self._client.get("/models", timeout=self._timeouts.connect)
        except httpx.HTTPError:
            return False
        return response.status_code < 500

    async def aclose(self) -> None:
        await self._client.aclose()

    # ------------------------------------------------------------ internals

    def _payload(self, request: ChatCompletionRequest | CompletionRequest, stream: bool) -> bytes:
        if stream:
            upstream = msgspec.structs.replace(
                request, model=self.upstream_model, stream=True, stream_options=StreamOptions(include_usage=True)
            )
        else:
            upstream = msgspec.structs.replace(request, model=self.upstream_model, stream=UNSET, stream_options=UNSET)
        return msgspec.json.encode(upstream)

    def _unary_meter(self, usage: Any, prompt: Callable[[], int], text: Callable[[], str]) -> Meter:
        meter = Meter(first_token_at=time.perf_counter())
        if isinstance(usage, Usage):
            _meter_from_usage(meter, usage)
        else:
            meter.prompt_tokens, meter.completion_tokens, meter.exact = prompt(), estimate_text(text()), False
        return meter

    async def _send(self, path: str, payload: bytes, timeout: float) -> httpx.Response:
        """Send and wait for the response headers; non-2xx answers become typed errors."""
        request = self._client.build_request(
            "POST", path, content=payload, headers={"content-type": "application/json"}
        )
        try:
            async with asyncio.timeout(timeout):
                response = await self._client.send(request, stream=True)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise Timeout(f"upstream {self.deployment_id} did not answer in time ({type(exc).__name__})") from None
        except httpx.HTTPError as exc:
            raise Unavailable(f"upstream {self.deployment_id} unreachable: {type(exc).__name__}") from None
        if response.status_code >= 300:
            try:
                async with asyncio.timeout(self._timeouts.connect):
                    body = await response.aread()
            except (TimeoutError, httpx.HTTPError):
                body = b""
            finally:
                await response.aclose()
            raise status_error(response.status_code, response.headers, body)
        return response

    async def _unary(self, path: str, payload: bytes, type_: type[R]) -> R:
        self._in_flight += 1
        try:
            deadline = asyncio.get_running_loop().time() + self._timeouts.total
            response = await self._send(path, payload, self._timeouts.total)
            try:
                async with asyncio.timeout_at(deadline):
                    body = await response.aread()
            except (TimeoutError, httpx.TimeoutException):
                raise Timeout(f"upstream {self.deployment_id} exceeded the total timeout") from None
            except httpx.HTTPError as exc:
                raise Unavailable(f"upstream {self.deployment_id} failed mid-response: {type(exc).__name__}") from None
            finally:
                await response.aclose()
        finally:
            self._in_flight -= 1
        try:
            return msgspec.json.decode(body, type=type_)
        except msgspec.MsgspecError as exc:
            raise UpstreamError(f"upstream {self.deployment_id} sent an invalid response: {exc}") from None

    async def _open_stream(
        self, path: str, payload: bytes, type_: type[C], *, want_usage: bool, prompt_estimate: int,
        text_of: Callable[[C], str],
    ) -> ChunkStream[C]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeouts.total
        first_deadline = min(deadline, loop.time() + self._timeouts.first_byte)
        self._in_flight += 1
        try:
            response = await self._send(path, payload, first_deadline - loop.time())
        except BaseException:
            self._in_flight -= 1
            raise
        events = _SSEReader(response, type_, self.deployment_id)
        try:
            first = await events.next(first_deadline)
            if first is None:
                raise UpstreamError(f"upstream {self.deployment_id} ended the stream without a chunk")
        except BaseException:
            await response.aclose()
            self._in_flight -= 1
            raise
        meter = Meter(prompt_tokens=prompt_estimate, exact=False)
        return ChunkStream(chunks=_Relay(self, response, events, first, deadline, meter, want_usage, text_of), meter=meter)

    def stream_closed(self) -> None:
        """Called once by each relay when its upstream response is closed."""
        self._in_flight -= 1


class _Relay(Generic[C]):
    """Relays upstream chunks, keeping the meter current and usage chunks as the client asked.

    ``aclose()`` (also before the first ``__anext__``) closes the upstream response.
    """

    def __init__(
        self, backend: OpenAIHTTPBackend, response: httpx.Response, events: _SSEReader, first: C, deadline: float,
        meter: Meter, want_usage: bool, text_of: Callable[[C], str],
    ) -> None:
        self._backend, self._response, self._events = backend, response, events
        self._pending: C | None = first
        self._last: C = first
        self._deadline, self._meter, self._want_usage, self._text_of = deadline, meter, want_usage, text_of
        self._saw_usage = False
        self._closed = False

    def __aiter__(self) -> _Relay[C]:
        return self

    async def __anext__(self) -> C:
        if self._closed:
            raise StopAsyncIteration
        try:
            while True:
                chunk = self._pending if self._pending is not None else await self._events.next(self._deadline)
                self._pending = None
                if chunk is None:
                    break
                if (out := self._account(chunk)) is not None:
                    return out
        except BaseException:
            await self.aclose()
            raise
        await self.aclose()
        if self._want_usage and not self._saw_usage:
            return self._estimated_usage_chunk()
        raise StopAsyncIteration

    def _account(self, chunk: C) -> C | None:
        """Update the meter from one chunk; the chunk to relay, or None to drop it."""
        meter = self._meter
        self._last = chunk
        if text := self._text_of(chunk):
            if meter.first_token_at is None:
                meter.first_token_at = time.perf_counter()
            if not self._saw_usage:
                meter.completion_tokens += estimate_text(text)
        usage = chunk.usage
        if isinstance(usage, Usage):
            self._saw_usage = True
            _meter_from_usage(meter, usage)
        if not self._want_usage and usage is not UNSET:
            chunk.usage = UNSET
            if not chunk.choices:
                return None
        return chunk

    def _estimated_usage_chunk(self) -> C:
        """The upstream reported no usage but the client asked for it: send our estimate."""
        m = self._meter
        usage = Usage(prompt_tokens=m.prompt_tokens, completion_tokens=m.completion_tokens, total_tokens=m.total_tokens)
        return msgspec.structs.replace(self._last, choices=[], usage=usage)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._backend.stream_closed()
        # Shielded: this often runs while the request is being cancelled (client gone), and the
        # upstream connection must still be closed so the provider stops generating.
        with anyio.CancelScope(shield=True):
            await self._response.aclose()


class _SSEReader:
    """Reads ``data:`` events from an upstream SSE body, decoding each into a chunk Struct."""

    def __init__(self, response: httpx.Response, type_: type[Any], deployment: str) -> None:
        self._lines = response.aiter_lines()
        self._type = type_
        self._deployment = deployment

    async def next(self, deadline: float) -> Any:
        """The next chunk, or None at ``[DONE]`` / end of body."""
        try:
            async with asyncio.timeout_at(deadline):
                async for line in self._lines:
                    if not line.startswith("data:"):
                        continue  # comments, event names, keep-alives, blank separators
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return None
                    return self._decode(data)
                return None
        except (TimeoutError, httpx.TimeoutException):
            raise Timeout(f"upstream {self._deployment} stream timed out") from None
        except httpx.HTTPError as exc:
            raise Unavailable(f"upstream {self._deployment} stream broke: {type(exc).__name__}") from None

    def _decode(self, data: str) -> Any:
        try:
            return msgspec.json.decode(data, type=self._type)
        except msgspec.MsgspecError as exc:
            try:
                envelope = msgspec.json.decode(data, type=_ErrorEnvelope)
            except msgspec.MsgspecError:
                raise UpstreamError(f"upstream {self._deployment} sent an invalid chunk: {exc}") from None
            detail = envelope.error if isinstance(envelope.error, _ErrorDetail) else _ErrorDetail(envelope.error)
            raise UpstreamError(f"upstream {self._deployment} failed mid-stream: {detail.message}") from None
