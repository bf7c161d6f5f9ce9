"""What the HTTP providers share: one pooled client per deployment, deadlines, error mapping.

Timeouts come from ``DeploymentConfig.timeouts``: ``connect`` for the TCP/TLS handshake,
``first_byte`` until a stream's headers and first event arrive, ``total`` for the whole request
(a non-streaming answer usually arrives only when generation is done, so it is bounded by
``total`` alone). Upstream statuses and transport failures become typed ``BackendError``s.
"""

from __future__ import annotations

import asyncio
import email.utils
import time

import anyio
import httpx
import msgspec

from backends.base import (
    AuthFailed,
    BackendError,
    BadRequest,
    ContextTooLong,
    RateLimited,
    Timeout,
    Unavailable,
    UpstreamError,
)
from backends.config import DeploymentConfig

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


def parse_error(body: bytes) -> ErrorDetail:
    try:
        envelope = msgspec.json.decode(body, type=ErrorEnvelope)
    except (msgspec.MsgspecError, RecursionError):
        return ErrorDetail(message=body.decode("utf-8", "replace").strip()[:500])
    return ErrorDetail(message=envelope.error) if isinstance(envelope.error, str) else envelope.error


def retry_after(headers: httpx.Headers) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date)."""
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
    detail = parse_error(body)
    message = detail.message or f"upstream answered HTTP {status}"
    code = str(detail.code) if detail.code is not None else ""
    if status == 429:
        return RateLimited(message, retry_after=retry_after(headers), status=status)
    if status in (401, 403):
        return AuthFailed(message, status=status)
    if status in (400, 413, 422):
        if code == "context_length_exceeded" or any(h in message.lower() for h in _CONTEXT_HINTS):
            return ContextTooLong(message, param=detail.param, status=status)
        return BadRequest(message, param=detail.param, status=status)
    if status == 408:
        return Timeout(message, status=status)
    if status >= 500:  # includes Anthropic's 529 "overloaded"
        return Unavailable(message, status=status)
    return UpstreamError(f"upstream answered HTTP {status}: {message}", status=status)


class HTTPUpstream:
    """A deployment's pooled ``httpx.AsyncClient`` and its in-flight count."""

    def __init__(self, config: DeploymentConfig, default_base: str, headers: dict[str, str]) -> None:
        self.deployment_id = config.id
        self.timeouts = t = config.timeouts
        limit = config.max_concurrency or 256
        self.client = httpx.AsyncClient(
            base_url=(config.api_base or default_base).rstrip("/"),
            headers=headers,
            # Per-read and pool waits are bounded by the overall deadlines enforced here.
            timeout=httpx.Timeout(connect=t.connect, read=t.total, write=t.total, pool=t.first_byte),
            limits=httpx.Limits(max_connections=limit, max_keepalive_connections=min(limit, 64)),
        )
        self.in_flight = 0

    async def send(self, path: str, payload: bytes, timeout: float) -> httpx.Response:
        """POST and wait (at most ``timeout``) for the response headers; non-2xx -> typed error."""
        request = self.client.build_request("POST", path, content=payload,
                                            headers={"content-type": "application/json"})
        try:
            async with asyncio.timeout(timeout):
                response = await self.client.send(request, stream=True)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise Timeout(f"upstream {self.deployment_id} did not answer in time ({type(exc).__name__})") from None
        except httpx.HTTPError as exc:
            raise Unavailable(f"upstream {self.deployment_id} unreachable: {type(exc).__name__}") from None
        if response.status_code >= 300:
            try:
                async with asyncio.timeout(self.timeouts.connect):
                    body = await response.aread()
            except (TimeoutError, httpx.HTTPError):
                body = b""
            finally:
                await response.aclose()
            raise status_error(response.status_code, response.headers, body)
        return response

    async def post(self, path: str, payload: bytes) -> bytes:
        """A whole (non-streaming) answer's body, within the total timeout."""
        self.in_flight += 1
        try:
            deadline = asyncio.get_running_loop().time() + self.timeouts.total
            response = await self.send(path, payload, self.timeouts.total)
            try:
                async with asyncio.timeout_at(deadline):
                    return await response.aread()
            except (TimeoutError, httpx.TimeoutException):
                raise Timeout(f"upstream {self.deployment_id} exceeded the total timeout") from None
            except httpx.HTTPError as exc:
                raise Unavailable(f"upstream {self.deployment_id} failed mid-response: {type(exc).__name__}") from None
            finally:
                await response.aclose()
        finally:
            self.in_flight -= 1

    async def open_stream(self, path: str, payload: bytes) -> tuple[httpx.Response, float, float]:
        """(response, first-event deadline, total deadline); the caller must ``close_stream`` it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeouts.total
        first_deadline = min(deadline, loop.time() + self.timeouts.first_byte)
        self.in_flight += 1
        try:
            return await self.send(path, payload, first_deadline - loop.time()), first_deadline, deadline
        except BaseException:
            self.in_flight -= 1
            raise

    async def close_stream(self, response: httpx.Response) -> None:
        """Release a stream from ``open_stream``. Shielded: this often runs while the request is
        being cancelled (client gone), and the provider must still see the connection close."""
        self.in_flight -= 1
        with anyio.CancelScope(shield=True):
            await response.aclose()

    async def ready(self) -> bool:
        """Reachable: ``GET /models`` gets any answer below 500 within the connect timeout."""
        try:
            response = await self.client.get("/models", timeout=self.timeouts.connect)
        except httpx.HTTPError:
            return False
        return response.status_code < 500

    async def aclose(self) -> None:
        await self.client.aclose()


class SSELines:
    """The ``data:`` payloads of a server-sent-events body, one at a time, within deadlines."""

    def __init__(self, response: httpx.Response, deployment: str) -> None:
        self._lines = response.aiter_lines()
        self._deployment = deployment

    async def next(self, deadline: float) -> str | None:
        """The next event's data, or None at ``[DONE]`` / the end of the body."""
        try:
            async with asyncio.timeout_at(deadline):
                async for line in self._lines:
                    if line.startswith("data:"):  # skip event names, comments, keep-alives, blanks
                        data = line[5:].strip()
                        return None if data == "[DONE]" else data
                return None
        except (TimeoutError, httpx.TimeoutException):
            raise Timeout(f"upstream {self._deployment} stream timed out") from None
        except httpx.HTTPError as exc:
            raise Unavailable(f"upstream {self._deployment} stream broke: {type(exc).__name__}") from None
