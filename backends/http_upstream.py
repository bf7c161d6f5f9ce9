"""What the HTTP providers share: one pooled client per deployment, deadlines, error mapping.

Timeouts come from ``DeploymentConfig.timeouts``: ``connect`` for the TCP/TLS handshake,
``first_byte`` until a stream's headers and first event arrive, ``idle`` for a stream's silences
after that, ``total`` for the whole request (a non-streaming answer usually arrives only when
generation is done, so it is bounded by ``total`` alone). Upstream statuses and transport
failures become typed ``BackendError``s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import anyio
import msgspec
import yarl

from backends.base import (
    AuthFailed,
    BackendError,
    BackendStats,
    BadRequest,
    ChunkStream,
    ChunkT,
    Completed,
    Conflict,
    ContextTooLong,
    Meter,
    ModelNotFound,
    RateLimited,
    RequestFailed,
    ResultT,
    Timeout,
    Unavailable,
    UpstreamError,
)
from backends.config import DeploymentConfig
from backends.raw_http import OversizedBody, RawAnswer, RawHTTP, decoded_body
from backends.raw_stream import RawStream
from backends.redaction import register, register_headers
from backends.trace_context import with_trace_context
from backends.upstream_limits import REMAINING, limit_exhausted, limits_left, retry_after, tokens_left, used_up_reset

# Idle pooled connections are dropped before common servers drop them (uvicorn and Node: 5 s), so a
# request is rarely sent on a connection the upstream is closing; one that is (its close still on
# the way) ends before any byte of the answer and goes again, once, on a new one (``backends.raw_http``).
_IDLE_SECONDS = 4.0
BOM = b"\xef\xbb\xbf"  # U+FEFF, a byte order mark, in UTF-8: some servers lead JSON (or events) with one
_CONTEXT_HINTS = ("context length", "context_length", "maximum context", "context window", "too many tokens",
                  "prompt is too long")


class ErrorDetail(msgspec.Struct):
    message: str = ""
    param: str | None = None
    code: str | int | None = None
    type: str | None = None


class ErrorEnvelope(msgspec.Struct):
    """``{"error": {...}}`` (OpenAI) or ``{"type": "error", "error": {...}}`` (Anthropic)."""

    error: ErrorDetail | str


class ObjectError(ErrorDetail):
    """vLLM's and SGLang's error object, not under an ``error`` field: ``{"object": "error", "message": ...}``."""

    object: str = ""


class FastAPIError(msgspec.Struct):
    """FastAPI's ``{"detail": "..."}``, or for a 422 the list of what failed validation and where."""

    detail: str | list[dict[str, Any]]


def parse_error(body: bytes) -> ErrorDetail:
    """An error answer's error object: its ``error``, else the object itself when it has a message
    (vLLM's and SGLang's ``{"object": "error", "message": ...}``), else FastAPI's ``detail``, else
    the body as text, but for a web page (a proxy's or web server's ``404 Not Found`` for a wrong
    ``api_base``), whose words are no message for a client and may name the upstream's host and paths."""
    try:
        envelope = msgspec.json.decode(body, type=ErrorEnvelope)
    except (msgspec.MsgspecError, RecursionError):
        try:
            detail = msgspec.json.decode(body, type=ErrorDetail)
        except (msgspec.MsgspecError, RecursionError):
            detail = ErrorDetail()
        if detail.message:
            return detail
        if (fastapi := _fastapi_error(body)) is not None:
            return fastapi
        text = body.decode("utf-8", "replace").strip()
        return ErrorDetail() if text.startswith("<") else ErrorDetail(message=text[:500])
    return ErrorDetail(message=envelope.error) if isinstance(envelope.error, str) else envelope.error


def _fastapi_error(body: bytes) -> ErrorDetail | None:
    """FastAPI's error as one: a validation error's items as ``where: what``, the first one's body
    field as the ``param`` (its ``loc`` after ``"body"``: ``messages.0.content`` -> ``messages[0].content``)."""
    try:
        detail = msgspec.json.decode(body, type=FastAPIError).detail
    except (msgspec.MsgspecError, RecursionError):
        return None
    if isinstance(detail, str):
        return ErrorDetail(message=detail) if detail else None
    places = [_field(item.get("loc")) for item in detail]
    said = [f"{where}: {item.get('msg')}" if where else str(item.get("msg")) for where, item in zip(places, detail)]
    return ErrorDetail(message="; ".join(said)[:500], param=places[0] if places else None) if said else None


def _field(loc: Any) -> str | None:
    """A FastAPI ``loc`` (``["body", "messages", 0, "content"]``) as a request field, None outside the body."""
    if not isinstance(loc, list) or len(loc) < 2 or loc[0] != "body":
        return None
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc[1:]).lstrip(".") or None


# The provider's own id of an answer, which its support asks for: OpenAI's and OpenAI-compatible servers'
# (vLLM's), Azure's (which sends apim-request-id too), Anthropic's
_REQUEST_ID_HEADERS = ("x-request-id", "apim-request-id", "request-id")
MAX_REQUEST_ID = 128  # the characters of it kept (usage_records.upstream_request_id)


def upstream_request_id(headers: Mapping[str, str]) -> str | None:
    """The provider's id of an answer: the first of ``_REQUEST_ID_HEADERS`` its head holds (three dict
    lookups at most, no parsing); None when it names none."""
    for name in _REQUEST_ID_HEADERS:
        if value := headers.get(name):
            return value[:MAX_REQUEST_ID]
    return None


def answered(response: ResultT, meter: Meter, headers: Mapping[str, str]) -> Completed[ResultT]:
    """A whole answer with what its head says: the provider's request id (onto ``meter``) and what
    is left of its limits."""
    meter.upstream_request_id = upstream_request_id(headers)
    return Completed(response, meter, *limits_left(headers))


def streamed(chunks: AsyncIterator[ChunkT], meter: Meter, headers: Mapping[str, str]) -> ChunkStream[ChunkT]:
    """``answered`` for a stream, from its response's head."""
    meter.upstream_request_id = upstream_request_id(headers)
    return ChunkStream(chunks, meter, *limits_left(headers))


def status_error(status: int, headers: Mapping[str, str], body: bytes) -> BackendError:
    """The typed error for an upstream answer with a non-2xx status."""
    exhausted = status != 429 or limit_exhausted(headers)
    wait = retry_after(headers)  # else, of a 429, when its used-up limit resets (OpenAI's may say only that)
    error = detail_error(status, parse_error(body), used_up_reset(headers) if wait is None and status == 429
                         else wait, exhausted)
    if isinstance(error, RateLimited):  # what it says of the upstream's limits
        error.reported = error.reported or any(name in headers for name in REMAINING)
        error.tokens_left, error.tokens_reset = tokens_left(headers)
    error.upstream_request_id = upstream_request_id(headers)
    return error


def detail_error(status: int, detail: ErrorDetail, wait: float | None = None, exhausted: bool = True) -> BackendError:
    """The typed error for an upstream failure with HTTP ``status`` and error object ``detail``
    (``wait``: the seconds its ``Retry-After`` asked for; ``exhausted``: see ``RateLimited``)."""
    message = detail.message or f"upstream answered HTTP {status}"
    code = str(detail.code) if detail.code is not None else ""
    if status == 429:  # out of credit (OpenAI's insufficient_quota) closes the upstream whatever is left
        out_of_credit = code == "insufficient_quota" or detail.type == "insufficient_quota"
        return RateLimited(message, retry_after=wait, exhausted=exhausted or out_of_credit, reported=out_of_credit,
                           status=status)
    if status in (401, 403):
        return AuthFailed(message, status=status)
    if status in (400, 413, 422):
        if code == "context_length_exceeded" or any(h in message.lower() for h in _CONTEXT_HINTS):
            return ContextTooLong(message, param=detail.param, status=status)
        named = detail.code if isinstance(detail.code, str) and not detail.code.isdigit() else None  # not vLLM's 400
        return BadRequest(message, param=detail.param, status=status, code=named)
    if status == 404 and (code == "model_not_found" or "model" in message.lower()):
        return ModelNotFound(message, param="model", status=status)
    if status == 408:
        return Timeout(message, status=status)
    if status == 409:
        return Conflict(message, status=status)
    if status == 500 and code == RequestFailed.kind:  # an engine node failed this one request alone
        return RequestFailed(message, status=status)
    if status >= 500:  # includes Anthropic's 529 "overloaded"
        return Unavailable(message, status=status, retry_after=wait)
    return UpstreamError(f"upstream answered HTTP {status}: {message}" if detail.message else message, status=status)


# The HTTP status an error object's ``code`` or ``type`` stands for (OpenAI's, Anthropic's, vLLM's names).
_STATUS_BY_NAME = {
    "rate_limit_exceeded": 429, "rate_limit_error": 429, "rate_limited": 429, "insufficient_quota": 429,
    "overloaded": 529, "overloaded_error": 529, "server_error": 500, "internal_error": 500, "api_error": 500,
    "service_unavailable": 503, "server_is_overloaded": 503, "timeout": 408, "timeout_error": 408,
    "context_length_exceeded": 400, "invalid_request_error": 400, "bad_request": 400, "badrequesterror": 400,
    "model_not_found": 404, "not_found_error": 404, "authentication_error": 401, "invalid_api_key": 401,
    "permission_error": 403, "internalservererror": 500, "conflict_error": 409, "conflict": 409,
}


def event_error(detail: ErrorDetail) -> BackendError:
    """The typed error for an ``{"error": {...}}`` event (or body) sent instead of an answer,
    by the status its ``code`` (a number, as vLLM sends) or its ``code`` / ``type`` name stands
    for; an error object naming none of them is an ``UpstreamError``."""
    status = _status_of(detail)
    if status is None:
        return UpstreamError(f"upstream failed the request: {detail.message or 'an error object'}")
    return detail_error(status, detail)


def raise_if_error(data: bytes) -> None:
    """Raise the typed error for ``data`` (an event, or a 2xx answer's body) when it is an
    ``{"error": ...}`` object, or vLLM's ``{"object": "error", ...}``."""
    if b'"error"' not in data:  # the usual event: no decoding
        return
    try:
        envelope = msgspec.json.decode(data, type=ErrorEnvelope)
    except (msgspec.MsgspecError, RecursionError):
        try:
            detail = msgspec.json.decode(data, type=ObjectError)
        except (msgspec.MsgspecError, RecursionError):
            return
        if detail.object == "error":
            raise event_error(detail) from None
        return
    error = envelope.error
    raise event_error(error if isinstance(error, ErrorDetail) else ErrorDetail(message=error))


def _status_of(detail: ErrorDetail) -> int | None:
    code = detail.code
    if (isinstance(code, int) or (isinstance(code, str) and code.isdigit())) and 400 <= int(code) < 600:
        return int(code)
    for name in (detail.code, detail.type):
        if isinstance(name, str) and (status := _STATUS_BY_NAME.get(name.lower())) is not None:
            return status
    return None


def with_basic_auth(base: yarl.URL, headers: dict[str, str]) -> tuple[yarl.URL, dict[str, str]]:
    """``base`` without its user info (``https://user:pass@host/v1``), and ``headers`` with that user
    info as HTTP basic auth, for every request as for the readiness probes, unless they carry an
    ``authorization`` of their own (the deployment's key)."""
    if base.user is None and base.password is None:
        return base, headers
    if not any(name.lower() == "authorization" for name in headers):
        credentials = aiohttp.BasicAuth(base.user or "", base.password or "").encode()
        headers = headers | {"authorization": credentials}
    return base.with_user(None), headers


class HTTPUpstream:
    """A deployment's pooled HTTP client and its in-flight count: answers and streams through
    ``backends.raw_http`` (a third of aiohttp's CPU per request); aiohttp only for readiness
    probes (``GET /models``). Both are created on first use, inside the running event loop."""

    def __init__(self, config: DeploymentConfig, default_base: str, headers: dict[str, str]) -> None:
        self.deployment_id = config.id
        self.timeouts = config.timeouts
        base = yarl.URL((config.api_base or default_base).rstrip("/"))
        # what it sends that an upstream's error words may echo: its key (whatever header carries it),
        # and the password of an api_base's user info
        register(config.api_key)
        register(base.password)
        self.base_url, self.headers = with_basic_auth(base, headers)
        self.base = str(self.base_url)
        register_headers(self.headers)
        self.limit = config.max_concurrency or 256
        self._session: aiohttp.ClientSession | None = None
        self._raw: RawHTTP | None = None
        self._urls: dict[str, yarl.URL] = {}
        self.in_flight = 0

    @property
    def session(self) -> aiohttp.ClientSession:
        """The readiness probes' client."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=8, keepalive_timeout=_IDLE_SECONDS, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(
                connector=connector, headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeouts.connect),
            )
        return self._session

    @property
    def raw(self) -> RawHTTP:
        """The client of whole answers (``post``); streams use ``session``."""
        if self._raw is None:
            self._raw = RawHTTP(self.base, self.headers, connect_timeout=self.timeouts.connect,
                                idle_seconds=_IDLE_SECONDS, limit=self.limit)
        return self._raw

    def url(self, path: str) -> yarl.URL:
        url = self._urls.get(path)
        if url is None:  # a query of the api_base (Azure's api-version) kept after the path
            url = self._urls[path] = self.base_url.with_path(self.base_url.path.rstrip("/") + path,
                                                             keep_query=True)
        return url

    async def post(self, path: str, payload: bytes, headers: Mapping[str, str] | None = None,
                   method: str = "POST") -> RawAnswer:
        """A whole (non-streaming) answer, within the total timeout; non-2xx -> typed error. ``method``:
        another than POST (``GET`` or ``DELETE`` of a Responses upstream's response, an empty payload)."""
        self.in_flight += 1
        try:
            raw = self.raw
            deadline = raw.clock() + self.timeouts.total
            answer = await raw.post(path, payload, with_trace_context(headers), deadline=deadline, method=method)
        except TimeoutError:
            raise Timeout("the upstream did not answer within the total timeout") from None
        except OversizedBody as exc:  # not a failure another try would fix
            raise UpstreamError(f"the upstream sent {exc}") from None
        except (OSError, ValueError) as exc:  # refused, reset, unreadable, a bad base URL or header
            raise Unavailable(f"the upstream is unreachable: {type(exc).__name__}") from None
        finally:
            self.in_flight -= 1
        if answer.body.startswith(BOM):  # RFC 8259 lets a JSON parser ignore it, and the SDKs do
            answer.body = answer.body[len(BOM):]
        if answer.status >= 300:
            raise status_error(answer.status, answer.headers, answer.body)
        return answer

    async def open_stream(self, path: str, payload: bytes, headers: Mapping[str, str] | None = None,
                          method: str = "POST") -> tuple[RawStream, float, float]:
        """(stream, first-event deadline, total deadline) once the answer's headers are in (within
        the first-event deadline); non-2xx -> typed error. The caller must ``close_stream`` it.
        ``method``: as ``post``'s (``GET`` of a Responses upstream's response stream)."""
        raw = self.raw
        now = raw.clock()
        deadline = now + self.timeouts.total
        first_deadline = min(deadline, now + self.timeouts.first_byte)
        self.in_flight += 1
        try:
            try:
                stream = await raw.open_stream(path, payload, with_trace_context(headers), deadline=first_deadline,
                                               method=method)
            except TimeoutError:
                raise Timeout("the upstream did not answer in time") from None
            except (OSError, ValueError) as exc:
                raise Unavailable(f"the upstream is unreachable: {type(exc).__name__}") from None
            if stream.status >= 300:
                try:
                    async with asyncio.timeout(self.timeouts.connect):
                        body = decoded_body(stream.headers, await stream.read()).removeprefix(BOM)
                except (TimeoutError, OSError, ValueError):
                    body = b""
                finally:
                    stream.close()
                raise status_error(stream.status, stream.headers, body)
            return stream, first_deadline, deadline
        except BaseException:
            self.in_flight -= 1
            raise

    async def close_stream(self, stream: RawStream) -> None:
        """Release a stream from ``open_stream``: a finished body's connection goes back to the
        pool; an unfinished one is closed, so the provider sees the client go. Shielded: this often
        runs while the request is being cancelled (client gone), and the socket must still close."""
        self.in_flight -= 1
        finished = stream.at_eof()
        stream.close()
        if not finished:
            with anyio.CancelScope(shield=True):
                await asyncio.sleep(0)  # let the transport finish closing the socket now

    async def ready(self) -> bool:
        """Reachable: ``GET /models`` gets any answer below 500 within the connect timeout."""
        try:
            async with asyncio.timeout(self.timeouts.connect):
                async with self.session.get(self.url("/models")) as response:
                    return response.status < 500
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            return False

    async def aclose(self) -> None:
        if self._raw is not None:
            self._raw.close()
        if self._session is not None:
            await self._session.close()


class HTTPBackend:
    """What every HTTP provider's ``Backend`` shares: its deployment, its pooled ``HTTPUpstream``,
    and the protocol's ``stats`` / ``ready`` / ``aclose`` over them."""

    provider: str
    default_api_base: str

    def __init__(self, config: DeploymentConfig, headers: dict[str, str]) -> None:
        self.config = config
        self.upstream_model = config.model
        self.deployment_id = config.id
        self.http = HTTPUpstream(config, self.default_api_base, headers)

    def stats(self) -> BackendStats:
        return BackendStats(in_flight=self.http.in_flight)

    async def ready(self) -> bool:
        return await self.http.ready()

    async def aclose(self) -> None:
        await self.http.aclose()
