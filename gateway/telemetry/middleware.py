"""An ASGI middleware that gives each API request its id, its request span and its access log line.

The id is returned as ``x-request-id`` on every answer (errors included) and is the one the
pipeline writes to the usage row; under ``/v1/messages`` also as ``request-id``, Anthropic's name,
where the anthropic SDK reads it (``message._request_id``, an error's ``request_id``). The span and
the log line close when the app returns: after the last body byte and the background settlement of
a stream, so a streamed answer is measured to its end with its token counts.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from gateway.event_stream import CLIENT_LEFT
from gateway.telemetry import Telemetry
from gateway.telemetry.context import RequestInfo, client_host, current, new_request_id
from gateway.telemetry.logs import log_access
from gateway.telemetry.tracing import CLIENT_GONE, mark_client_gone, mark_error

# the API's paths; after "/admin/", vLLM's without /v1 (the tokenizer's are only there)
TRACED_PREFIXES = ("/v1/", "/admin/", "/chat/completions", "/completions", "/tokenize", "/detokenize")
_HEADER = b"x-request-id"
_ANTHROPIC_HEADER = b"request-id"
_MESSAGES_PATH = "/v1/messages"  # Anthropic's Messages API (``gateway.dialects.anthropic``)
CLIENT_CLOSED = 499  # nginx's "client closed request"


class TelemetryMiddleware:
    def __init__(self, app: Any, telemetry: Telemetry) -> None:
        self.app = app
        self.tracing = telemetry.tracing
        self.metrics = telemetry.metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(TRACED_PREFIXES):
            await self.app(scope, receive, send)
            return
        info = RequestInfo(new_request_id(), scope.get("method", "GET"), path, client=client_host(scope))
        started = time.perf_counter()
        # named by its route: Litestar has routed the request (its template); the fast routes' paths are fixed
        span = (self.tracing.start_request(info.method, path, scope.get("path_template") or path,
                                           scope.get("headers", ()))
                if self.tracing.enabled else None)
        info.span = span
        token = current.set(info)
        otel_token = otel_context.attach(trace.set_span_in_context(span)) if span is not None else None

        async def send_wrapper(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                info.status = message["status"]
                message["headers"] = with_request_id(message.setdefault("headers", []), info.request_id, path)
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except BaseException:
            # the client left before an answer began (499, as its usage row): not the gateway failing
            info.status = info.status or (CLIENT_CLOSED if scope.get(CLIENT_LEFT) else 500)
            raise
        finally:
            self._finish(info, started)
            if otel_token is not None:
                otel_context.detach(otel_token)
            current.reset(token)

    def _finish(self, info: RequestInfo, started: float) -> None:
        span = info.span
        if span is not None:
            if info.status is not None:
                span.set_attribute("http.response.status_code", info.status)
            if info.status is not None and info.status >= 500:
                mark_error(span, info.error_type or str(info.status))
            elif info.status == CLIENT_CLOSED and info.error_type != CLIENT_GONE:  # not settled: left before that
                mark_client_gone(span)
            span.end()
        if not info.metered and self.metrics is not None and info.status is not None:
            self.metrics.refused(info.method, info.path, info.status)  # 401, 400, an unknown model, ...
        log_access(info, started)


def with_request_id(headers: list[tuple[bytes, bytes]], request_id: str, path: str) -> list[tuple[bytes, bytes]]:
    """``headers`` with the request's id as ``x-request-id`` (unless set), and on a Messages API
    path as ``request-id`` too (the same value)."""
    names = {k.lower(): v for k, v in headers}
    value = names.get(_HEADER, request_id.encode())
    added = [(_HEADER, value)] if _HEADER not in names else []
    if (path == _MESSAGES_PATH or path.startswith(_MESSAGES_PATH + "/")) and _ANTHROPIC_HEADER not in names:
        added.append((_ANTHROPIC_HEADER, value))
    return [*headers, *added] if added else headers
