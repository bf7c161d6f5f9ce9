"""OpenTelemetry spans for the request path, named and attributed per the GenAI semantic conventions.

Off by default, and with nowhere to send spans: then ``Tracing.off()`` hands out one shared no-op
context manager and the request path pays an attribute check. On, spans go to an OTLP/HTTP
exporter (``telemetry.otlp_endpoint``) or to exporters given in code (tests use an in-memory one).
The provider is this app's own, not the process-global one, so several apps (and tests) can trace
independently.

The tree: ``POST /v1/chat/completions`` (renamed ``chat <model>`` once the model is known) with
children ``auth``, ``admission``, one ``upstream <deployment>`` per attempt, and under the attempt
that answered, the engine's ``engine.queue`` / ``engine.prefill`` / ``engine.decode`` phases. A
client's W3C ``traceparent`` makes the request span its span's child (the trace continues); an HTTP
upstream is sent the attempt span's (``backends.trace_context``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.settings import TelemetryConfig

_NOOP: AbstractContextManager[None] = nullcontext()
_W3C = TraceContextTextMapPropagator()
_TRACE_HEADERS = (b"traceparent", b"tracestate")  # W3C trace context (ASGI header names are lower-case)
CLIENT_GONE = "client_disconnected"  # the usage rows' error type for it, and the spans' event
OPERATIONS = {"chat.completions": "chat", "messages": "chat", "completions": "text_completion",
              "embeddings": "embeddings"}


class Tracing:
    def __init__(self, provider: TracerProvider | None) -> None:
        self.provider = provider
        self.enabled = provider is not None
        self.tracer = provider.get_tracer("switchyard.gateway") if provider is not None else None

    @classmethod
    def off(cls) -> Tracing:
        return cls(None)

    @classmethod
    def from_config(cls, cfg: TelemetryConfig, exporters: Sequence[SpanExporter] = ()) -> Tracing:
        if not cfg.tracing or not (cfg.otlp_endpoint or exporters):  # no one would read the spans
            return cls.off()
        provider = TracerProvider(resource=Resource.create({"service.name": cfg.service_name}))
        if cfg.otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=cfg.otlp_endpoint)))
        for exporter in exporters:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        return cls(provider)

    def start_request(self, method: str, path: str, route: str,
                      headers: Iterable[tuple[bytes, bytes]] = ()) -> Span | None:
        """The request's span, named by its route (``GET /v1/models/{model_id}``), never by a
        path a client makes up; the child of the client's span when ``headers`` (the ASGI
        scope's) carry a W3C ``traceparent``."""
        if self.tracer is None:
            return None
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k in _TRACE_HEADERS}
        parent = _W3C.extract(carrier) if carrier else None
        return self.tracer.start_span(f"{method} {route}", kind=SpanKind.SERVER, context=parent, attributes={
            "http.request.method": method, "url.path": path, "http.route": route})

    def span(self, name: str, attributes: dict[str, Any] | None = None) -> AbstractContextManager[Any]:
        """A child of the current span (a no-op when tracing is off)."""
        if self.tracer is None:
            return _NOOP
        return self._span(name, attributes)

    @contextmanager
    def _span(self, name: str, attributes: dict[str, Any] | None) -> Iterator[Span]:
        assert self.tracer is not None
        with self.tracer.start_as_current_span(name, kind=SpanKind.INTERNAL, attributes=attributes) as span:
            yield span

    def phases(self, parent: Span | None, phases: Sequence[tuple[str, float, float]]) -> None:
        """Spans after the fact, from ``(name, start, end)`` in unix seconds (the engine's timings)."""
        if self.tracer is None or parent is None:
            return
        ctx = trace.set_span_in_context(parent)
        for name, start, end in phases:
            span = self.tracer.start_span(name, context=ctx, start_time=int(start * 1e9))
            span.end(end_time=int(end * 1e9))

    async def aclose(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


def mark_error(span: Span | None, error_type: str) -> None:
    """A failure the span's own side owns: a SERVER span's 5xx, a CLIENT span's 4xx or 5xx."""
    if span is not None:
        span.set_attribute("error.type", error_type)
        span.set_status(Status(StatusCode.ERROR, error_type))


def mark_refused(span: Span | None, error_type: str) -> None:
    """A SERVER span's 4xx: the client's error, so (OpenTelemetry's HTTP conventions) its status stays unset."""
    if span is not None:
        span.set_attribute("error.type", error_type)


def mark_client_gone(span: Span | None) -> None:
    """The client went away: no failure of this span's own, so its status stays unset; an event says so."""
    if span is not None:
        span.set_attribute("error.type", CLIENT_GONE)
        span.add_event(CLIENT_GONE)
