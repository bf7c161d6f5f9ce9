"""What one HTTP request has learnt about itself, for its log line and its span: a mutable record in
a context variable, set by the telemetry middleware and filled in by the pipeline."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from gateway.ids import random_id


@dataclass
class RequestInfo:
    request_id: str
    method: str
    path: str
    tenant_id: str | None = None
    key_id: str | None = None
    model: str | None = None
    deployment: str | None = None
    status: int | None = None
    error_type: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    upstream_request_id: str | None = None  # the provider's own id of its answer (for the operator's log)
    client: str | None = None  # the client's address (a trusted proxy's X-Forwarded-For: gateway.trusted_proxies)
    span: Any = None  # the request's OpenTelemetry span, when tracing is on
    metered: bool = False  # its usage record was counted into the metrics


def client_host(scope: Any) -> str | None:
    """The client's address in an ASGI ``scope``, as uvicorn's proxy headers middleware left it."""
    client = scope.get("client")
    return str(client[0]) if client else None


def new_request_id() -> str:
    return random_id()


current: ContextVar[RequestInfo | None] = ContextVar("switchyard_request", default=None)


def request_info() -> RequestInfo | None:
    return current.get()


def request_id() -> str:
    """This request's id (the middleware's, so header, logs, spans and usage row agree)."""
    info = current.get()
    return info.request_id if info is not None else new_request_id()
