"""The few calls the pipeline makes into telemetry, each a no-op (or nearly) when tracing is off."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span

from gateway.contracts import Principal, UsageRecord
from gateway.routing.router import ModelGroup
from gateway.telemetry import Telemetry
from gateway.telemetry.context import request_info
from gateway.telemetry.tracing import CLIENT_GONE, OPERATIONS, mark_client_gone, mark_error, mark_refused

UPSTREAM_REQUEST_ID = "switchyard.upstream_request_id"  # an attempt span's: the provider's id of its answer
_NOOP: AbstractContextManager[None] = nullcontext()
_BROKEN_STREAM = ("failed", "drained")  # a stream's outcomes (``gateway.streaming.Outcome``) that failed it


def on_principal(principal: Principal) -> None:
    info = request_info()
    if info is not None:
        info.tenant_id, info.key_id = principal.tenant_id, principal.key_id


def on_request(endpoint: str, model: str, group: ModelGroup | None, stream: bool, max_tokens: int | None) -> None:
    """Name the request span per the GenAI conventions (``chat <model>``) by the model ``group`` the
    requested name resolved to: a name a client made up (none, or one a wildcard matched) never
    names a span (span names must be few); it is the ``gen_ai.request.model`` attribute."""
    info = request_info()
    if info is None:
        return
    info.model = model
    span = info.span
    if span is not None:
        operation = OPERATIONS.get(endpoint, endpoint)
        if group is not None:
            span.update_name(f"{operation} {group.name}")
        span.set_attribute("gen_ai.operation.name", operation)
        span.set_attribute("gen_ai.request.model", model)
        span.set_attribute("gen_ai.request.stream", stream)
        if max_tokens is not None:
            span.set_attribute("gen_ai.request.max_tokens", max_tokens)


def start_attempt(telemetry: Telemetry, deployment: Any) -> Span | None:
    tracer = telemetry.tracing.tracer
    if tracer is None:
        return None
    from opentelemetry.trace import SpanKind

    config = deployment.config
    return tracer.start_span(f"upstream {deployment.id}", kind=SpanKind.CLIENT, attributes={
        "gen_ai.provider.name": config.provider, "gen_ai.system": config.provider,
        "gen_ai.request.model": config.model, "switchyard.deployment": deployment.id,
    })  # fmt: skip


def current(span: Span | None) -> AbstractContextManager[Any]:
    """``span`` (an attempt's) as the current span while its request is sent: an HTTP upstream is
    sent its trace context (``backends.trace_context``). Ending it, and its status, stay the caller's."""
    if span is None:
        return _NOOP
    return trace.use_span(span, record_exception=False, set_status_on_exception=False)


def end_attempt(span: Span | None, error_type: str | None = None, upstream_request_id: str | None = None) -> None:
    """End an attempt's span, marked with the error it failed with (a CLIENT span: the upstream's 4xx
    and 5xx are errors; the gateway giving it up because its own client left is not) and the
    provider's id of its answer."""
    if span is not None:
        if upstream_request_id is not None:
            span.set_attribute(UPSTREAM_REQUEST_ID, upstream_request_id)
        if error_type == CLIENT_GONE:
            mark_client_gone(span)
        elif error_type is not None:
            mark_error(span, error_type)
        span.end()


def on_response_model(attempt: Span | None, model: Any) -> None:
    """The model the provider says answered (``gen_ai.response.model``: a dated version, say), on the
    request's span and the attempt's, before the public name replaces it in the answer."""
    if attempt is None or not isinstance(model, str) or not model:
        return
    attempt.set_attribute("gen_ai.response.model", model)
    info = request_info()
    if info is not None and info.span is not None:
        info.span.set_attribute("gen_ai.response.model", model)


def on_settle(telemetry: Telemetry, record: UsageRecord, phases: list[tuple[str, float, float]],
              attempt: Span | None) -> None:
    """Usage onto the request span and the log line; engine phases under the answering attempt."""
    info = request_info()
    if info is not None:
        info.deployment, info.error_type = record.deployment, record.error_type
        info.prompt_tokens, info.completion_tokens = record.prompt_tokens, record.completion_tokens
        info.upstream_request_id = record.upstream_request_id
        span = info.span
        if span is not None:
            span.set_attribute("gen_ai.usage.input_tokens", record.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", record.completion_tokens)
            span.set_attribute("switchyard.request_id", record.request_id)
            _mark_request(span, record)
    if attempt is not None:
        attempt.set_attribute("gen_ai.usage.input_tokens", record.prompt_tokens)
        attempt.set_attribute("gen_ai.usage.output_tokens", record.completion_tokens)
        telemetry.tracing.phases(attempt, phases)
        failed = record.status >= 500 or record.extra.get("outcome") == "failed"  # a stream that broke is a 200
        gone = record.error_type == CLIENT_GONE
        end_attempt(attempt, record.error_type if failed or gone else None, record.upstream_request_id)


def _mark_request(span: Span, record: UsageRecord) -> None:
    """The request's (SERVER) span, per OpenTelemetry's HTTP conventions: ERROR for a 5xx or a stream
    (a 200) that broke or was cut; a 4xx is the client's error and a client that left is no error
    of the server's, so their status stays unset, with ``error.type`` (and an event) saying why."""
    if not record.error_type:
        return
    if record.error_type == CLIENT_GONE:
        mark_client_gone(span)
    elif record.status >= 500 or record.extra.get("outcome") in _BROKEN_STREAM:
        mark_error(span, record.error_type)
    else:
        mark_refused(span, record.error_type)
