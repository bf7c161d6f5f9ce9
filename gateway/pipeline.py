"""The request path: authenticate -> model allow-list -> admit -> route -> call -> relay -> settle.

Controllers decode and validate the body and describe the call once (``gateway.calls``); ``serve``
takes that description the whole way. Every outcome (success, provider failure, client gone
mid-stream) is settled with the admission service and recorded once.

A request is charged for its prompt at most once, and whenever an upstream may have processed it:
the answer's meter (exact where the provider reported usage); a client gone while an attempt was
with a deployment leaves the prompt spent there, so its estimate is recorded and settled (inexact,
``client_disconnected``), or what the backend's own meter counts where it handed one over
(``CallContext.on_meter``: the engine, which charges nothing for a prompt it never started on);
gone before any attempt was sent (waiting out a hold-off), nothing. A
failed attempt is not charged, a timeout included: it cannot tell a connection never made from a
prompt processed, and charging it would bill the prompt twice when the next attempt answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from litestar import Response
from litestar.background_tasks import BackgroundTask

from backends.base import BackendError, ChunkStream, Completed, Meter, RateLimited, Timeout, Unavailable
from backends.call import CallContext, CallingTenant, forwarded_tenant
from gateway.calls import CallDescription
from gateway.contracts import (
    INCOMPLETE,
    Principal,
    QuotaExceeded,
    QuotaUnavailable,
    Ticket,
    UsageRecord,
)
from gateway.errors import ApiError, from_backend_error
from gateway.event_stream import EventStream
from gateway.json_response import JSONResponse
from gateway.keepalive import KeepAlives
from gateway.quotas.headers import openai_ratelimit_headers
from gateway.quotas.refusal import refusal_record, refused
from gateway.quotas.reservation import reserve_prompt
from gateway.routing.deadline import Deadline, DeadlineExceeded, wait_out
from gateway.routing.deployment import Deployment
from gateway.routing.health import DeploymentHealth
from gateway.routing.plan import MAX_HOLD_OFF, RoutePlan, bound_wait, holds_off, tokens_left
from gateway.routing.router import ModelGroup
from gateway.services import Services
from gateway.settings import PriceConfig, Settings
from gateway.streaming import Outcome, SSERelay
from gateway.telemetry import Telemetry, hooks
from gateway.telemetry.context import request_id
from gateway.usage.pricing import PriceTable, request_cost

log = logging.getLogger("switchyard.pipeline")

DEFAULT_OUTPUT_RESERVE = 1024  # output tokens reserved per sequence when nothing sets a limit


@dataclass(frozen=True)
class _Pricing:
    """The config's prices, and the table of each model's (for a model priced only per deployment)."""

    prices: Mapping[str, PriceConfig]
    table: PriceTable


@dataclass
class _Flight:
    """What one admitted call accumulates on its way through."""

    call: CallDescription
    request_id: str
    group: ModelGroup
    ticket: Ticket
    started_at: float
    t0: float
    pricing: _Pricing  # the prices when it was admitted: a reload meanwhile does not reprice it
    deployment: Deployment | None = None
    served_by: ModelGroup | None = None  # the group of ``deployment``: the one asked for, or a fallback
    attempt_span: Any = None  # the trace span of the attempt that answered (tracing on)
    # an attempt is with a deployment, not refused: the client leaving now leaves the prompt spent
    prompt_sent: bool = False
    meter: Meter | None = None  # the attempt's own meter, where its backend handed it over
    attempts: int = 0  # attempts the route plan made (retries and fallbacks included)
    reserved: int = 0  # prompt tokens counted against ``deployment``'s tokens_per_minute until settled
    settled: bool = False  # ``Pipeline._settle`` ran: whatever fails after it settles nothing twice

    def release(self) -> None:
        """Uncount the attempt's tokens from its deployment's tokens_per_minute (``reserve_tokens``)."""
        if self.reserved and self.deployment is not None:
            self.deployment.health.release_tokens(self.reserved)
        self.reserved = 0

    def metered(self, meter: Meter) -> None:
        self.meter = meter


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
        keepalive = settings.server.stream_keepalive_seconds
        self.keepalives = KeepAlives(keepalive) if keepalive else None  # the streams' (gateway.keepalive)

    @property
    def settings(self) -> Settings:
        return self._settings

    @settings.setter
    def settings(self, settings: Settings) -> None:  # a reload sets new ones: their prices with them
        self._settings = settings
        self._pricing = _Pricing(settings.prices, PriceTable.from_settings(settings))

    # ------------------------------------------------------------ entry points

    async def authenticate(self, headers: Mapping[str, str]) -> Principal:
        token = bearer_token(headers)
        authenticator = self.services.authenticator
        if token is None and getattr(authenticator, "needs_key", True):  # an engine node without a key needs none
            raise ApiError(401, "Missing API key: send 'Authorization: Bearer <key>'.", code="missing_api_key")
        try:
            with self.telemetry.tracing.span("auth"):
                principal = await authenticator.authenticate(token or "")
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
        return self._usable(principal, model, self.services.router.resolve(model))

    def _usable(self, principal: Principal, model: str, group: ModelGroup | None) -> ModelGroup:
        if group is None:
            raise ApiError(404, f"The model '{model}' does not exist.", param="model", code="model_not_found")
        if not self.may_serve(principal, model, group):
            raise ApiError(403, f"This key may not use the model '{model}'.", param="model", code="model_not_allowed")
        return group

    # ------------------------------------------------------------ the path

    async def serve(self, call: CallDescription) -> Response[Any]:
        found = self.services.router.resolve(call.model)
        hooks.on_request(call.endpoint, call.model, found, call.stream, call.output_limit)
        group = self._usable(call.principal, call.model, found)
        # The output of every sequence generated (n choices, several prompts) is reserved up front.
        cap = _output_cap(self.settings.quotas.default_max_tokens, call.api_default_limit)
        limit = call.output_limit
        per_sequence = limit if limit is not None else cap if cap is not None else DEFAULT_OUTPUT_RESERVE
        reserve = await reserve_prompt(call, group) + per_sequence * call.sequences
        rid = request_id()
        principal = call.principal
        try:
            ticket = await self._admit(call, group, reserve)
        except ApiError as exc:  # refused by quotas: still one usage row (no tokens) for this request
            self.services.usage.record(refusal_record(rid, principal, group.name, call.endpoint, call.stream, exc))
            raise
        flight = _Flight(call=call, request_id=rid, group=group, ticket=ticket, started_at=time.time(),
                         t0=time.perf_counter(), pricing=self._pricing)
        self.services.usage.begin(_reservation_record(flight, reserve - per_sequence * call.sequences,
                                                      per_sequence * call.sequences))
        # The engine schedules fairly by the tenant; backends hold a request without a limit to the cap.
        ctx = CallContext(tenant=CallingTenant.of(principal.tenant_id, principal.tenant_weight), output_cap=cap,
                          on_meter=flight.metered, rendered=tuple(call.rendered))
        try:
            result = await self._call(flight, ctx, call.prompt_tokens + per_sequence * call.sequences)
        except BackendError as exc:
            error = from_backend_error(exc)
            await self._settle(flight, Meter(exact=False, upstream_request_id=exc.upstream_request_id),
                               error.status, exc.kind)
            error.headers.update(self._headers(flight))
            # retried here already, or its time spent: an SDK's retries would multiply it
            if (flight.attempts > 1 or isinstance(exc, DeadlineExceeded)) and "retry-after" not in error.headers:
                error.headers["x-should-retry"] = "false"
            raise error from None
        except asyncio.CancelledError:  # the client went away before the answer was ready
            spent = flight.meter if flight.meter is not None else Meter(
                prompt_tokens=call.prompt_tokens if flight.prompt_sent else 0, exact=False)
            await asyncio.shield(self._settle(flight, spent, 499, "client_disconnected", Outcome.DISCONNECTED.value))
            raise
        except BaseException:
            await self._settle(flight, Meter(exact=False), 500, "internal_error")
            raise
        try:
            if isinstance(result, ChunkStream):
                return self._stream_response(flight, result)
            return await self._unary_response(flight, result)
        except BaseException:  # a bug between the answer and the response: settled all the same
            if isinstance(result, ChunkStream):
                await _close_quietly(result)
            await asyncio.shield(self._settle(flight, result.meter, 500, "internal_error"))
            raise

    async def _call(self, flight: _Flight, ctx: CallContext, tokens: int) -> Completed[Any] | ChunkStream[Any]:
        """Follow the route plan until an attempt succeeds; the last failure is raised (``tokens``:
        what the request may spend of an upstream's tokens per minute), or the deadline's when the
        group's ``timeout`` runs out first (``gateway.routing.deadline``). A success whose answer says
        what is left of its upstream's limits (OpenAI's, Anthropic's rate-limit headers) replaces what
        its deployment's health knew of them: short of tokens until the reset (no reset said: not short)."""
        call = flight.call
        tenant = _circuit_tenant(call.principal)
        deadline = Deadline(flight.group.config.timeout)
        plan = RoutePlan(flight.group, self.services.router.resolve, prompt_tokens=call.prompt_tokens,
                         routing_key=call.routing_key, tenant=tenant, tokens=tokens, deadline=deadline)
        attempt = plan.first()
        if attempt is None:
            raise plan.nothing_to_try(call.model, call.prompt_tokens)
        while True:
            health = attempt.deployment.health
            if deadline.expired:
                raise deadline.exceeded(call.model)
            if attempt.delay:
                await wait_out(attempt.delay, health, tenant)
                # meanwhile other requests took its half-open trial, its max_concurrency slots or its
                # tokens_per_minute, or a reload removed it: on to the next, as a pick now would
                if not attempt.deployment.accepts(tenant=tenant) or attempt.deployment.retired:
                    skipped = Unavailable(f"no deployment of '{call.model}' is available now")
                    if (following := plan.after(skipped)) is None:
                        raise deadline.exceeded(call.model) if plan.out_of_time else skipped
                    attempt = following
                    continue
            flight.deployment, flight.served_by, flight.attempts = attempt.deployment, attempt.group, attempt.number
            trial = health.on_attempt()
            flight.reserved = health.reserve_tokens(call.prompt_tokens)
            t0 = time.perf_counter()
            span = hooks.start_attempt(self.telemetry, attempt.deployment)
            flight.prompt_sent, flight.meter = True, None
            try:
                with hooks.current(span):
                    # the first attempt, sent at once, has the request's whole time: cut, it is blamed
                    result = await deadline.bound(call.invoke(attempt.deployment.backend, ctx), call.model,
                                                  whole=attempt.number == 1 and not attempt.delay)
            except asyncio.CancelledError:
                health.on_abandoned(trial)
                hooks.end_attempt(span, "client_disconnected")
                raise
            except BackendError as exc:
                flight.prompt_sent, flight.meter = False, None  # refused, or a timeout: not charged (see ``serve``)
                flight.release()
                hooks.end_attempt(span, exc.kind, exc.upstream_request_id)
                self.telemetry.upstream_error(attempt.deployment.id, exc.kind)
                _record_failure(health, exc, tenant, trial)
                # as slow as that at least, for lowest_latency (not one the deadline cut short, nor an upstream's 408)
                if isinstance(exc, Timeout) and exc.blames_deployment and exc.status is None:
                    health.note_latency(time.perf_counter() - t0)
                following = plan.after(exc)
                if following is None:
                    if plan.out_of_time:  # a wait for the next attempt would end after the deadline
                        raise deadline.exceeded(call.model) from None
                    bound_wait(exc)
                    raise
                log.info("request %s: %s on %s, next %s", flight.request_id, exc.kind, attempt.deployment.id,
                         following.deployment.id)
                attempt = following
                continue
            except Exception:  # a bug in a backend: counts against the deployment, and frees its trial slot
                health.on_failure(tenant)
                hooks.end_attempt(span, "internal_error")
                raise
            health.on_success(time.perf_counter() - t0, tenant)  # to the answer, or a stream's first chunk
            if result.tokens_left is not None:  # its upstream said what is left of its limits: until they reset
                health.note_tokens_left(result.tokens_left, min(result.tokens_reset or 0.0, MAX_HOLD_OFF))
            flight.attempt_span = span  # ended at settlement, so it covers a stream to its end
            return result

    async def _admit(self, call: CallDescription, group: ModelGroup, reserve: int) -> Ticket:
        """Admit ``call``, or refuse it with a 429 (``gateway.quotas.refusal``)."""
        try:
            with self.telemetry.tracing.span("admission"):
                return await self.services.admission.admit(call.principal, group.name, reserve, call.output_field,
                                                            call.hosted_tools)
        except QuotaExceeded as exc:
            raise refused(exc, call.dialect.ratelimit_headers) from None
        except QuotaUnavailable:
            raise ApiError(503, "the quota service is unavailable", code="quota_unavailable") from None

    async def admit_poll(self, principal: Principal, endpoint: str,
                         ratelimit_headers: Callable[[Ticket], dict[str, str]] = openai_ratelimit_headers,
                         ) -> dict[str, str]:
        """Count a request that spends nothing itself (a read or cancel of a stored response, a count
        of tokens) against requests/min alone (``Admission.admit_poll``): its rate-limit headers
        (``ratelimit_headers``: its dialect's), or the 429 (or 503) a refused ``serve`` gets, metered
        as that is (a usage row under ``endpoint``, no model)."""
        try:
            with self.telemetry.tracing.span("admission"):
                return ratelimit_headers(await self.services.admission.admit_poll(principal))
        except QuotaExceeded as exc:
            error = refused(exc, ratelimit_headers)
        except QuotaUnavailable:
            error = ApiError(503, "the quota service is unavailable", code="quota_unavailable")
        self.services.usage.record(refusal_record(request_id(), principal, "", endpoint, False, error))
        raise error

    async def _unary_response(self, flight: _Flight, result: Completed[Any]) -> Response[Any]:
        """The answer in the client's dialect, settled with its meter. One the dialect cannot express
        (a ``BackendError``: ``UntranslatableAnswer``) fails as the provider's, still charged what the
        upstream reported: it did the work, as a stream failing after its chunks is charged them."""
        hooks.on_response_model(flight.attempt_span, getattr(result.response, "model", None))
        result.response.model = flight.call.model
        try:
            body = flight.call.dialect.unary(result.response, result.meter)
        except BackendError as exc:
            error = from_backend_error(exc)
            if flight.deployment is not None:
                self.telemetry.upstream_error(flight.deployment.id, exc.kind)
            await self._settle(flight, result.meter, error.status, exc.kind)
            error.headers.update(self._headers(flight))
            raise error from None
        await self._settle(flight, result.meter, 200, None)
        return JSONResponse(body, headers=self._headers(flight))

    def _stream_response(self, flight: _Flight, stream: ChunkStream[Any]) -> EventStream:
        async def on_end(meter: Meter, outcome: Outcome, error: ApiError | None) -> None:
            # a provider failure is recorded under its kind, as one before the first chunk is
            if error is not None:
                error_type: str | None = error.kind or error.type
            else:
                error_type = None if outcome is Outcome.COMPLETED else outcome.value
            if outcome is Outcome.FAILED and flight.deployment is not None and error:
                if error.cause is not None:  # the provider failed mid-stream: an upstream error, as one before it
                    self.telemetry.upstream_error(flight.deployment.id, error.cause.kind)
                if _broke_stream(error):
                    flight.deployment.health.on_failure(_circuit_tenant(flight.call.principal))
            await self._settle(flight, meter, 200, error_type, outcome=outcome.value)

        relay = SSERelay(stream, flight.call.model, on_end, flight.call.dialect.stream(stream.meter),
                         on_first=None if flight.attempt_span is None else
                         lambda chunk: hooks.on_response_model(flight.attempt_span, getattr(chunk, "model", None)),
                         keepalives=self.keepalives)
        headers = self._headers(flight) | {"cache-control": "no-cache", "x-accel-buffering": "no"}
        return EventStream(relay, headers=headers, background=BackgroundTask(relay.finish))

    # ------------------------------------------------------------ settlement

    async def _settle(
        self, flight: _Flight, meter: Meter, status: int, error_type: str | None, outcome: str | None = None
    ) -> None:
        """Release the request's admission and record its usage row; once per flight, the first
        outcome wins."""
        if flight.settled:
            return
        flight.settled = True
        cost = self._cost(flight, meter)
        deployment, principal = flight.deployment, flight.call.principal
        flight.release()
        if deployment is not None:
            deployment.health.record_tokens(meter.total_tokens)  # for the deployment's tokens_per_minute
        try:  # sent now, acknowledged after the reply: the reply does not wait for Redis
            self.services.admission.settle(flight.ticket, meter.total_tokens, cost)
        except Exception:
            log.exception("settling request %s failed", flight.request_id)
        now = time.perf_counter()
        record = UsageRecord(
            request_id=flight.request_id, key_id=principal.key_id, tenant_id=principal.tenant_id,
            model=flight.group.name, deployment=deployment.id if deployment else None,
            provider=deployment.config.provider if deployment else None, endpoint=flight.call.endpoint,
            started_at=flight.started_at, status=status, prompt_tokens=meter.prompt_tokens,
            completion_tokens=meter.completion_tokens, cached_tokens=meter.cached_tokens, exact=meter.exact,
            cost=cost, error_type=error_type, latency_ms=(now - flight.t0) * 1000,
            ttft_ms=(meter.first_token_at - flight.t0) * 1000 if meter.first_token_at else None,
            stream=flight.call.stream, service_tier=meter.service_tier,
            upstream_request_id=meter.upstream_request_id,
            extra={"outcome": outcome} if outcome else {},
        )
        try:
            self.services.usage.record(record)
            await self.services.usage.sync()  # durable before the response's last byte
        except Exception:
            log.exception("recording usage for %s failed", flight.request_id)
        finally:  # a cancelled wait for the fsync still counts the request
            hooks.on_settle(self.telemetry, record, meter.phases, flight.attempt_span)

    def _cost(self, flight: _Flight, meter: Meter) -> float:
        """At the price of the deployment that answered, else of its model (a fallback's own; one
        priced only per deployment at the highest of theirs, as it reserves); nothing where neither
        has a price; at the prices when the request was admitted, so that a stream a reload catches
        (its deployment removed or repriced) costs what it would have. The quota's spend and the
        usage row get this same figure."""
        group = flight.served_by or flight.group
        return _priced(flight.pricing, flight.deployment.id if flight.deployment else None, group.name, meter)

    def cost(self, deployment: str | None, model: str, meter: Meter) -> float:
        """What ``meter`` costs at the current prices of ``deployment``, else of ``model`` (a group's name)."""
        return _priced(self._pricing, deployment, model, meter)

    def _headers(self, flight: _Flight) -> dict[str, str]:
        return {"x-request-id": flight.request_id} | flight.call.dialect.ratelimit_headers(flight.ticket)

    @staticmethod
    def _may_use(principal: Principal, group: ModelGroup) -> bool:
        return any(principal.may_use(name) for name in group.names)

    @classmethod
    def may_serve(cls, principal: Principal, model: str, group: ModelGroup) -> bool:
        """Whether ``principal`` may use ``group`` asked for as ``model``: its allow-list names the
        model as asked for (a name that a wildcard alias such as ``gpt-*`` matches) or one of the
        group's own names."""
        return principal.may_use(model) or cls._may_use(principal, group)


def _priced(pricing: _Pricing, deployment: str | None, model: str, meter: Meter) -> float:
    price = next((pricing.prices[n] for n in (deployment, model) if n is not None and n in pricing.prices), None)
    if price is None:
        return pricing.table.cost(model, meter.prompt_tokens, meter.completion_tokens, meter.cached_tokens)
    return request_cost(price, meter)


def _reservation_record(flight: _Flight, prompt: int, output: int) -> UsageRecord:
    """The record that settles ``flight`` from its reservation if the process dies before it ends."""
    principal = flight.call.principal
    return UsageRecord(
        request_id=flight.request_id, key_id=principal.key_id, tenant_id=principal.tenant_id,
        model=flight.group.name, deployment=None, provider=None, endpoint=flight.call.endpoint,
        started_at=flight.started_at, status=500, prompt_tokens=prompt, completion_tokens=output, exact=False,
        error_type=INCOMPLETE, stream=flight.call.stream, extra={"outcome": INCOMPLETE},
    )


def _output_cap(configured: int | None, api_default: int | None) -> int | None:
    """What backends hold a request without a limit to: the gateway's ``default_max_tokens``, or the
    API's own default where that is lower (a text completion's 16 tokens)."""
    if api_default is None:
        return configured
    return api_default if configured is None else min(configured, api_default)


def _record_failure(health: DeploymentHealth, exc: BackendError, tenant: str, trial: int) -> None:
    """Tell the deployment's health of a failed attempt: counted against it only when the
    deployment is at fault (not the request's own 4xx, nor the provider failing this one request);
    a 429 with a limit used up holds it off for its ``Retry-After`` (for ``tenant`` alone when it did
    not say which limit), and one saying how many tokens are left marks it short of tokens."""
    if (left := tokens_left(exc)) is not None:
        health.note_tokens_left(*left)
    if not exc.blames_deployment:
        health.on_refused(trial)
        return
    health.on_failure(tenant)
    if (seconds := holds_off(exc)) is not None:
        said = isinstance(exc, RateLimited) and exc.reported
        health.hold_off(seconds, None if said else tenant)


async def _close_quietly(stream: ChunkStream[Any]) -> None:
    """Close an upstream stream no relay will read; a failure to is logged, not raised."""
    try:
        await stream.aclose()
    except Exception:
        log.exception("closing an unrelayed upstream stream failed")


def _broke_stream(error: ApiError) -> bool:
    """A failure after a stream began that counts against its deployment: a 5xx, unless the
    provider failed this one request alone."""
    return error.status >= 500 and (error.cause is None or error.cause.blames_deployment)


def _circuit_tenant(principal: Principal) -> str:
    """Whom a deployment's failures are charged to (``DeploymentHealth``): the tenant, else the key."""
    return principal.tenant_id or principal.key_id
