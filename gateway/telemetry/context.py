"""What one HTTP request has learnt about itself, for its log line and its span: a mutable record in
a context variable, set by the telemetry middleware and filled in by the pipeline."""

from __future__ import annotations

import os
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


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
    span: Any = None  # the request's OpenTelemetry span, when tracing is on


_ID_BYTES = 16
_POOL_BYTES = _ID_BYTES * 256  # ids read from the OS per system call (one per request cost ~3% of it)
_pool = b""
_taken = 0


def new_request_id() -> str:
    """32 hex digits from the OS's CSPRNG, as ``secrets.token_hex(16)``, read ahead in batches."""
    global _pool, _taken
    if _taken >= len(_pool):
        _pool, _taken = os.urandom(_POOL_BYTES), 0
    _taken += _ID_BYTES
    return _pool[_taken - _ID_BYTES : _taken].hex()


def _forget_pool() -> None:
    """A forked child must not hand out its parent's ids."""
    global _pool, _taken
    _pool, _taken = b"", 0


os.register_at_fork(after_in_child=_forget_pool)

current: ContextVar[RequestInfo | None] = ContextVar("switchyard_request", default=None)


def request_info() -> RequestInfo | None:
    return current.get()


def request_id() -> str:
    """This request's id (the middleware's, so header, logs, spans and usage row agree)."""
    info = current.get()
    return info.request_id if info is not None else new_request_id()
