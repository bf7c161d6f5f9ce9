"""W3C trace context on upstream requests: the current OpenTelemetry span (the gateway's attempt
span, when tracing is on) as ``traceparent`` / ``tracestate``, so a provider that traces continues
the gateway's trace. With no span current (tracing off) the headers go unchanged."""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import get_current
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_W3C = TraceContextTextMapPropagator()


def with_trace_context(headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """``headers`` plus the current span's trace context, when there is one."""
    context = get_current()
    if not context or not trace.get_current_span(context).get_span_context().is_valid:  # empty: tracing off
        return headers
    carrier = dict(headers or {})
    _W3C.inject(carrier, context)
    return carrier
