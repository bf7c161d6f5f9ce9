"""Errors in OpenAI's shape, and the exception handlers that guarantee every failure uses it.

Every error leaves the gateway as ``{"error": {"message", "type", "param", "code"}}`` with the
status the openai SDK maps to its typed exceptions. Nothing returns a traceback or a 422.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from sqlalchemy.exc import SQLAlchemyError

from backends.base import (
    AuthFailed,
    BackendError,
    BadRequest,
    Conflict,
    ContextTooLong,
    ModelNotFound,
    RateLimited,
    RequestFailed,
    Timeout,
    Unavailable,
)
from backends.openai_wire import ErrorBody, ErrorDetail
from gateway.db.errors import is_unavailable
from gateway.json_response import JSONResponse
from gateway.telemetry.context import RequestInfo, client_host, new_request_id
from gateway.telemetry.logs import log_access
from gateway.telemetry.middleware import TRACED_PREFIXES

log = logging.getLogger("switchyard.errors")

# The ``type`` OpenAI uses for each status we produce.
_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout",
}


class ApiError(Exception):
    """An error the gateway answers with; raise it anywhere on the request path."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPE_BY_STATUS.get(status, "invalid_request_error")
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        self.kind: str | None = None  # a provider failure's kind (BackendError.kind): the usage row's error_type
        self.cause: BackendError | None = None  # the provider failure it answers, if any

    def body(self) -> ErrorBody:
        return ErrorBody(error=ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code))

    def to_response(self) -> Response[bytes]:
        return JSONResponse(msgspec.json.encode(self.body()), status_code=self.status, headers=self.headers)


class ParameterError(ValueError):
    """A bad query or body parameter found below the HTTP layer (a date, a range); carries its name,
    so the API maps it to a 400 without reading the message."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def retry_after_header(seconds: float | None) -> dict[str, str]:
    if seconds is None:
        return {}
    return {"retry-after": str(max(1, round(seconds + 0.499)))}


def from_backend_error(exc: BackendError) -> ApiError:
    """The client-facing error for a provider failure (the router has given up on it); its ``kind``
    is the failure's, as a request that failed before its answer began records it."""
    error = _client_error(exc)
    error.kind, error.cause = exc.kind, exc
    return error


def _client_error(exc: BackendError) -> ApiError:
    if isinstance(exc, ModelNotFound):  # the gateway serves the model; its deployment's upstream does not
        return ApiError(502, exc.message, code="upstream_model_not_found")
    if isinstance(exc, RequestFailed):
        return ApiError(500, exc.message, code="request_failed")
    if isinstance(exc, ContextTooLong):
        return ApiError(400, exc.message, param=exc.param or "messages", code="context_length_exceeded")
    if isinstance(exc, BadRequest):
        return ApiError(400, exc.message, param=exc.param, code=exc.code or exc.kind)
    if isinstance(exc, RateLimited):
        return ApiError(
            429, exc.message, code="upstream_rate_limited", headers=retry_after_header(exc.retry_after)
        )
    if isinstance(exc, Conflict):  # passed on as a 409, which the openai SDK retries
        return ApiError(409, exc.message, code="upstream_conflict")
    if isinstance(exc, Timeout):
        return ApiError(504, exc.message, code="upstream_timeout")
    if isinstance(exc, Unavailable):
        return ApiError(503, exc.message, code="upstream_unavailable", headers=retry_after_header(exc.retry_after))
    if isinstance(exc, AuthFailed):
        return ApiError(502, "the upstream provider rejected the gateway's credentials", code="upstream_auth")
    return ApiError(502, exc.message, code="bad_upstream_response")


# ---------------------------------------------------------------- exception handlers


def _api_error(_: Request, exc: ApiError) -> Response[bytes]:
    return exc.to_response()


def _backend_error(_: Request, exc: BackendError) -> Response[bytes]:
    return from_backend_error(exc).to_response()


def _validation_error(_: Request, exc: ValidationException) -> Response[bytes]:
    # Raised by Litestar only when a body is absent (we decode bodies ourselves) or a path/query
    # parameter fails; never surface its 400-with-extra shape.
    extra = exc.extra if isinstance(exc.extra, list) else []
    keys = [e.get("key") for e in extra if isinstance(e, dict)]
    if "data" in keys:
        return ApiError(400, "the request body must be a JSON object", code="invalid_body").to_response()
    param = next((k for k in keys if isinstance(k, str)), None)
    return ApiError(400, f"invalid parameter: {param or exc.detail}", param=param).to_response()


def _http_error(request: Request, exc: HTTPException) -> Response[bytes]:
    status = exc.status_code
    if status == 404:
        message, code = f"Invalid URL ({request.method} {request.url.path})", "unknown_url"
    elif status == 405:
        message, code = f"Method {request.method} is not allowed on {request.url.path}", "method_not_allowed"
    elif status == 413:
        limit = request.route_handler.resolve_request_max_body_size() if _has_handler(request) else None
        suffix = f" (limit {limit} bytes)" if limit else ""
        message, code = f"request body too large{suffix}", "request_too_large"
    elif status >= 500:
        log.error("HTTP %s on %s %s: %s", status, request.method, request.url.path, exc.detail)
        message, code = "internal error", None
    else:
        message, code = str(exc.detail), None
    headers = {k: v for k, v in (exc.headers or {}).items() if k.lower() == "allow"}
    if status in (404, 405) and not _has_handler(request):
        headers |= _unrouted_request(request, status)
    return ApiError(status, message, code=code, headers=headers).to_response()


def _unrouted_request(request: Request, status: int) -> dict[str, str]:
    """The id and access line of an API request that no route took (an unknown URL, a method not
    allowed): the telemetry middleware, which runs once a route is found, never saw it."""
    path = request.scope["path"]
    if not path.startswith(TRACED_PREFIXES):
        return {}
    info = RequestInfo(new_request_id(), request.method, path, status=status, client=client_host(request.scope))
    log_access(info, time.perf_counter())
    return {"x-request-id": info.request_id}


def _has_handler(request: Request) -> bool:
    try:
        return request.route_handler is not None
    except Exception:  # no route matched
        return False


def _internal_error(request: Request, exc: Exception) -> Response[bytes]:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return ApiError(500, "internal error", code="internal_error").to_response()


def _database_error(request: Request, exc: Exception) -> Response[bytes]:
    if not is_unavailable(exc):
        return _internal_error(request, exc)
    log.warning("database unavailable on %s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
    return ApiError(503, "the database is temporarily unavailable", code="database_unavailable").to_response()


# For routers whose handlers talk to the database (admin API, dashboards): an outage is a 503, as
# on the API path, not an internal error. (OSError: a refused connection or a connect timeout.)
database_exception_handlers = {
    SQLAlchemyError: _database_error,
    OSError: _database_error,
}

exception_handlers = {
    ApiError: _api_error,
    BackendError: _backend_error,
    ValidationException: _validation_error,
    HTTPException: _http_error,
    Exception: _internal_error,
}
