"""The request path: authenticate -> model allow-list -> admit -> route -> call -> relay -> settle.

Controllers decode and validate the body, then hand it here. Every outcome (success, provider
failure, client gone mid-stream) is settled with the admission service and recorded once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Response
from litestar.background_tasks import BackgroundTask
from litestar.response import Stream

from backends.base import (
    Backend,
    BackendError,
    BadRequest,
    ChunkStream,
    Completed,
    ContextTooLong,
    Meter,
    Unavailable,
)
from backends.estimate import estimate_chat_prompt, estimate_completion_prompt
from backends.output_cap import capped_output
from backends.tenant import for_tenant, forwarded_tenant
from backends.types import ChatCompletionRequest, CompletionRequest
from gateway.contracts import Principal, QuotaExceeded, QuotaState, QuotaUnavailable, Ticket, UsageRecord
from gateway.errors import ApiError, from_backend_error, retry_after_header
from gateway.router import Deployment, ModelGroup
from gateway.routing.plan import RoutePlan
from gateway.services import Services
from gateway.settings import Settings
from gateway.streaming import OpenAIEvents, Outcome, SSERelay, StreamEncoder
from gateway.telemetry import Telemetry, hooks
from gateway.telemetry.context import request_id

log = logging.getLogger("switchyard.pipeline")

DEFAULT_OUTPUT_RESERVE = 1024  # output tokens reserved per sequence when nothing sets a limit
_encoder = msgspec.json.Encoder()

Call = Callable[[Backend], Awaitable[Any]]


@dataclass(frozen=True)
class Dialect:
    """How answers are written: OpenAI's shapes by default; ``/v1/messages`` speaks Anthropic's."""

    unary: Callable[[Any], bytes] = _encoder.encode
    stream: Callable[[], StreamEncoder] = OpenAIEvents


OPENAI = Dialect()


@dataclass
class _Context:
    """What one request accumulates on its way through."""

    request_id: str
    endpoint: str
    model: str  # as the client named it
    principal: Principal
    group: ModelGroup
    ticket: Ticket
    stream: bool
    started_at: float
    t0: float
    prompt_tokens: int = 0  # estimated, for context-window routing
    deployment: Deployment | None = None
    attempt_span: Any = None  # the trace span of the attempt that answered (tracing on)


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The key from ``Authorization: Bearer <key>`` (or ``x-api-key``, as Anthropic clients send it)."""
    value = headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get("x-api-key", "").strip() or None


class Pipeline:
    def __init__(self, services: Services, settings: Settings, telemetry: Telemetry | None = None) -> None:
        self.services = services
        self.settings = settings
        self.telemetry = telemetry or Telemetry()

    # ------------------------------------------------------------ entry points

    async def authenticate(self, headers: Mapping[str, str]) -> Principal:
        token = bearer_token(headers)
        if token is None:
            raise ApiError(401, "Missing API key: send 'Authorization: Bearer <key>'.", code="missing_api_key")
        try:
            with self.telemetry.tracing.span("auth"):
                principal = await self.services.authenticator.authenticate(token)
        except Exception:
            log.exception("authenticator failed")
            raise ApiError(503, "authentication is temporarily unavailable", code="auth_unavailable") from None
        if principal is None:
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
        if self.services.tenant_from_headers and principal.tenant_id is None and (who := forwarded_tenant(headers)):
            principal = dataclasses.replace(principal, tenant_id=who.tenant_id, tenant_weight=who.weight)
        hooks.on_principal(principal)
        return principal

    def visible_groups(self, principal: Principal) -> list[ModelGroup]:
        return [g for g in self.services.router.groups if self._may_use(principal, g)]

    def group_for(self, principal: Principal, model: str) -> ModelGroup:
        group = self.services.router.resolve(model)
        if group is None:
            raise ApiError(404, f"The model '{model}' does not exist.", param="model", code="model_not_found")
        if not self._may_use(principal, group):
            raise ApiError(403, f"This key may not use the model '{model}'.", param="model", code="model_not_allowed")
        return group

    async def chat(self, principal: Principal, body: ChatCompletionRequest, dialect: Dialect = OPENAI) -> Response[Any]:
        if body.stream_options not in (None, msgspec.UNSET) and not body.is_stream:
            raise ApiError(400, "'stream_options' is only allowed when 'stream' is true.", param="stream_options")
        if isinstance(body.top_logprobs, int) and not body.logprobs:
            raise ApiError(400, "'top_logprobs' requires 'logprobs' to be true.", param="top_logprobs")
        call: Call = (lambda b: b.chat_stream(body)) if body.is_stream else (lambda b: b.chat(body))
        prompt = estimate_chat_prompt(body)
        endpoint = "chat.completions" if dialect is OPENAI else "messages"
        return await self._serve(principal, body.model, endpoint, body.is_stream, prompt, body.output_limit(),
                                 body.sequences(), call, dialect)

    async def complete(self, principal: Principal, body: CompletionRequest) -> Response[Any]:
        try:
            body.prompts()
        except ValueError as exc:
            raise ApiError(400, str(exc), param="prompt") from None
        if body.stream_options not in (None, msgspec.UNSET) and not body.is_stream:
            raise ApiError(400, "'stream_options' is only allowed when 'stream' is true.", param="stream_options")
        call: Call = (lambda b: b.complete_stream(body)) if body.is_stream else (lambda b: b.complete(body))
        prompt = estimate_completion_prompt(body)
        return await self._serve(principal, body.model, "completions", body.is_stream, prompt, body.output_limit(),
                                 body.sequences(), call)

    # ------------------------------------------------------------ the path

    async def _serve(
        self, principal: Principal, model: str, endpoint: str, stream: bool, prompt_tokens: int,
        output_limit: int | None, sequences: int, call: Call, dialect: Dialect = OPENAI,
    ) -> Response[Any]:
        hooks.on_request(endpoint, model, stream, output_limit)
        group = self.group_for(principal, model)
        # The output of every sequence generated (n choices, several prompts) is reserved up front.
        cap = self.settings.quotas.default_max_tokens  # what backends hold a request without a limit to
        per_sequence = output_limit if output_limit is not None else cap if cap is not None else DEFAULT_OUTPUT_RESERVE
        reserve = prompt_tokens + per_sequence * sequences
        rid = request_id()
        try:
            ticket = await self._admit(principal, group, reserve)
        except ApiError as exc:  # refused by quotas: still one usage row (no tokens) for this request
            self.services.usage.record(UsageRecord(
                request_id=rid, key_id=principal.key_id, tenant_id=principal.tenant_id,
                model=group.name, deployment=None, provider=None, endpoint=endpoint, started_at=time.time(),
                status=exc.status, error_type=exc.code, stream=stream,
            ))
            raise
        ctx = _Context(
            request_id=rid, endpoint=endpoint, model=model, principal=principal, group=group,
            ticket=ticket, stream=stream, started_at=time.time(), t0=time.perf_counter(), prompt_tokens=prompt_tokens,
        )
        try:
            with for_tenant(principal.tenant_id, principal.tenant_weight), capped_output(cap):
                result = await self._call(ctx, call)  # (the engine schedules fairly by the tenant)
        except BackendError as exc:
            error = from_backend_error(exc)
            await self._settle(ctx, Meter(exact=False), error.status, exc.kind)
            error.headers.update(self._headers(ctx))
            raise error from None
        except asyncio.CancelledError:  # the client went away before the answer was ready
            await asyncio.shield(self._settle(ctx, Meter(exact=False), 499, "client_disconnected"))
            raise
        except BaseException:
            await self._settle(ctx, Meter(exact=False), 500, "internal_error")
            raise
        if isinstance(result, ChunkStream):
            return self._stream_response(ctx, result, dialect)
        return await self._unary_response(ctx, result, dialect)

    async def _call(self, ctx: _Context, call: Call) -> Completed[Any] | ChunkStream[Any]:
        """Follow the route plan until an attempt succeeds; the last failure is raised."""
        plan = RoutePlan(ctx.group, self.services.router.resolve, prompt_tokens=ctx.prompt_tokens)
        attempt = plan.first()
        if attempt is None and plan.too_long:
            raise ContextTooLong(f"the prompt (about {ctx.prompt_tokens} tokens) exceeds the context window of "
                                 f"every deployment of '{ctx.model}'", param="messages")
        if attempt is None:
            raise Unavailable(f"no deployment of '{ctx.model}' is available (circuits open or at capacity)")
        while True:
            health = attempt.deployment.health
            if attempt.delay:
                await asyncio.sleep(attempt.delay)
                if not health.available():  # e.g. another request took its half-open trial meanwhile
                    skipped = Unavailable(f"deployment {attempt.deployment.id} is no longer available")
                    if (following := plan.after(skipped)) is None:
                        raise skipped
                    attempt = following
                    continue
            ctx.deployment = attempt.deployment
            health.on_attempt()
            t0 = time.perf_counter()
            span = hooks.start_attempt(self.telemetry, attempt.deployment)
            try:
                result = await call(attempt.deployment.backend)
            except asyncio.CancelledError:
                health.on_abandoned()
                hooks.end_attempt(span, "client_disconnected")
                raise
            except BackendError as exc:
                hooks.end_attempt(span, exc.kind)
                self.telemetry.upstream_error(attempt.deployment.id, exc.kind)
                if isinstance(exc, BadRequest):
                    health.on_success(None)  # the deployment answered; the request was at fault
                else:
                    health.on_failure()
                following = plan.after(exc)
                if following is None:
                    raise
                log.info("request %s: %s on %s, next %s", ctx.request_id, exc.kind, attempt.deployment.id,
                         following.deployment.id)
                attempt = following
                continue
            except Exception:  # a bug in a backend: counts against the deployment, and frees its trial slot
                health.on_failure()
                hooks.end_attempt(span, "internal_error")
                raise
            health.on_success(time.perf_counter() - t0)  # to the answer, or a stream's first chunk
            ctx.attempt_span = span  # ended at settlement, so it covers a stream to its end
            return result

    async def _admit(self, principal: Principal, group: ModelGroup, reserve: int) -> Ticket:
        try:
            with self.telemetry.tracing.span("admission"):
                return await self.services.admission.admit(principal, group.name, reserve)
        except QuotaExceeded as exc:
            headers = retry_after_header(exc.retry_after)
            if exc.ticket is not None:
                headers.update(_ratelimit_headers(exc.ticket))
            raise ApiError(429, exc.message, code="rate_limit_exceeded", headers=headers) from None
        except QuotaUnavailable:
            raise ApiError(503, "the quota service is unavailable", code="quota_unavailable") from None

    async def _unary_response(self, ctx: _Context, result: Completed[Any], dialect: Dialect) -> Response[Any]:
        result.response.model = ctx.model
        await self._settle(ctx, result.meter, 200, None)
        return Response(
            content=dialect.unary(result.response), media_type="application/json", headers=self._headers(ctx)
        )

    def _stream_response(self, ctx: _Context, stream: ChunkStream[Any], dialect: Dialect) -> Stream:
        async def on_end(meter: Meter, outcome: Outcome, error: ApiError | None) -> None:
            error_type = error.type if error else (None if outcome is Outcome.COMPLETED else outcome.value)
            if outcome is Outcome.FAILED and ctx.deployment is not None and error and error.status >= 500:
                ctx.deployment.health.on_failure()  # the provider broke the stream after it started
            await self._settle(ctx, meter, 200, error_type, outcome=outcome.value)

        relay = SSERelay(stream, ctx.model, on_end, dialect.stream())
        headers = self._headers(ctx) | {"cache-control": "no-cache", "x-accel-buffering": "no"}
        return Stream(relay.events(), media_type="text/event-stream", headers=headers,
                      background=BackgroundTask(relay.finish))

    # ------------------------------------------------------------ settlement

    async def _settle(
        self, ctx: _Context, meter: Meter, status: int, error_type: str | None, outcome: str | None = None
    ) -> None:
        cost = self._cost(ctx, meter)
        if ctx.deployment is not None:
            ctx.deployment.health.record_tokens(meter.total_tokens)  # for the deployment's tokens_per_minute
        try:
            await self.services.admission.settle(ctx.ticket, meter.total_tokens, cost)
        except Exception:
            log.exception("settling request %s failed", ctx.request_id)
        now = time.perf_counter()
        deployment = ctx.deployment
        record = UsageRecord(
            request_id=ctx.request_id, key_id=ctx.principal.key_id, tenant_id=ctx.principal.tenant_id,
            model=ctx.group.name, deployment=deployment.id if deployment else None,
            provider=deployment.config.provider if deployment else None, endpoint=ctx.endpoint,
            started_at=ctx.started_at, status=status, prompt_tokens=meter.prompt_tokens,
            completion_tokens=meter.completion_tokens, cached_tokens=meter.cached_tokens, exact=meter.exact,
            cost=cost, error_type=error_type, latency_ms=(now - ctx.t0) * 1000,
            ttft_ms=(meter.first_token_at - ctx.t0) * 1000 if meter.first_token_at else None,
            stream=ctx.stream, extra={"outcome": outcome} if outcome else {},
        )
        try:
            self.services.usage.record(record)
        except Exception:
            log.exception("recording usage for %s failed", ctx.request_id)
        hooks.on_settle(self.telemetry, record, meter.phases, ctx.attempt_span)

    def _cost(self, ctx: _Context, meter: Meter) -> float:
        names = [ctx.deployment.id] if ctx.deployment else []
        price = next((self.settings.prices[n] for n in (*names, ctx.group.name) if n in self.settings.prices), None)
        if price is None:
            return 0.0
        cached = min(meter.cached_tokens, meter.prompt_tokens)
        cached_rate = price.cached_input_per_million if price.cached_input_per_million is not None \
            else price.input_per_million
        return (
            (meter.prompt_tokens - cached) * price.input_per_million
            + cached * cached_rate
            + meter.completion_tokens * price.output_per_million
        ) / 1_000_000

    def _headers(self, ctx: _Context) -> dict[str, str]:
        return {"x-request-id": ctx.request_id} | _ratelimit_headers(ctx.ticket)

    @staticmethod
    def _may_use(principal: Principal, group: ModelGroup) -> bool:
        return any(principal.may_use(name) for name in group.names)


def _ratelimit_headers(ticket: Ticket) -> dict[str, str]:
    headers: dict[str, str] = {}
    for kind, state in (("requests", ticket.requests), ("tokens", ticket.tokens)):
        if isinstance(state, QuotaState):
            headers[f"x-ratelimit-limit-{kind}"] = str(state.limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, state.remaining))
            headers[f"x-ratelimit-reset-{kind}"] = f"{max(0.0, state.reset_seconds):.3f}s"
    return headers
