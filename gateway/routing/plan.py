"""The attempts for one request: strategy order, retries with backoff, then fallback groups.

``RoutePlan.first()`` gives the first attempt; after a failure, ``after(error)`` gives the next one
or None (give up and answer with ``error``). Only failures *before the first byte* reach the plan:
once a stream has started it is never retried. Retryable errors (connect, 429, 5xx, timeouts)
move to the next deployment of the group in strategy order (round again when there are fewer
deployments than retries), waiting a jittered exponential backoff (at least a 429's or 503's
``Retry-After`` when it is the same deployment again, at most ``MAX_BACKOFF``); when the group's
retries are spent, the group's ``fallbacks`` are tried in turn. A prompt too long for the deployment
(``ContextTooLong`` from the provider, or an estimate above its configured ``context_window``)
goes to ``context_window_fallbacks`` instead. Fallbacks chain, depth-first: a fallback group is
tried as a request for it would be, its own fallbacks (of either kind) before the next one of the
group that fell back to it; no group is entered twice, so a cycle ends (``_Fallbacks``). A
deployment whose upstream does not know its model (``ModelNotFound``) or refuses its credentials
(``AuthFailed``: its 401 / 403) is misconfigured: it is not tried again for the request, and the
next deployment (else the fallbacks) is tried at once, without spending a retry. A 429 whose
``Retry-After`` is longer than ``MAX_BACKOFF`` is never waited out: the deployment is held off
for that long, at most ``MAX_HOLD_OFF`` (``DeploymentHealth.hold_off``, by the caller), and the
plan moves on without it. A shorter one holds the deployment off too, so that other requests do
not spend a round trip on it meanwhile: the plan takes the group's other deployments, and only
when none of them takes a request now does it wait out the shortest such hold on its deployment
(an attempt with that ``delay``; the caller skips it, with ``after``, if its circuit, its
``max_concurrency`` or its ``tokens_per_minute`` no longer admit the request when the wait is over).
A 429 that refused this request alone (``RateLimited.exhausted``
false: its upstream has some of every limit left) holds nothing off; with a ``Retry-After`` over
``MAX_BACKOFF`` the request is not sent to that deployment again. A 429 that does not say which
limit is used up holds the deployment off for the request's tenant (see ``DeploymentHealth``). A
deployment whose upstream said fewer tokens are left than the request needs (``tokens``: its prompt
estimate and output reserve), in a 429 or in a successful answer's rate-limit headers, is tried
after the others, and after waiting out a short hold. A config reload that removes or changes a
deployment of the group the plan is in sends its next attempts to the group's new table. With a
``deadline`` (the ``timeout`` of the group the client named, inherited by its fallbacks: see
``gateway.routing.deadline``) no wait that would end after it is planned: a backoff or hold-off that
would passes over the group's deployments that need it to the fallbacks, and ``out_of_time`` says so
when no attempt is left (the caller then answers with the deadline's timeout); once it has passed,
no attempt is.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from backends.base import AuthFailed, BackendError, ContextTooLong, ModelNotFound, RateLimited, Unavailable
from gateway.routing.deadline import Deadline
from gateway.routing.deployment import Deployment
from gateway.routing.router import ModelGroup

MAX_BACKOFF = 5.0  # the longest wait before a retry, and the longest hold-off a request waits out
MAX_HOLD_OFF = 60.0  # the longest a deployment is held off: a longer Retry-After is probed again after this


def holds_off(error: BackendError) -> float | None:
    """The seconds ``error`` asks its deployment to take no request for (the ``Retry-After`` of a
    429 with a limit used up), at most ``MAX_HOLD_OFF``; else None."""
    if isinstance(error, RateLimited) and error.exhausted and error.retry_after is not None \
            and error.retry_after > 0:
        return min(error.retry_after, MAX_HOLD_OFF)
    return None


def bound_wait(error: BackendError) -> None:
    """Cap the wait ``error`` tells the client (its ``Retry-After``) at ``MAX_HOLD_OFF``: the router
    tries its deployment again after that, whatever the upstream asked (``1e300``)."""
    if isinstance(error, (RateLimited, Unavailable)) and error.retry_after is not None:
        error.retry_after = min(error.retry_after, MAX_HOLD_OFF)


def tokens_left(error: BackendError) -> tuple[float, float] | None:
    """What a 429 says is left of its deployment's tokens per minute, and for how many seconds
    (until the limit resets, else its ``Retry-After``; at most ``MAX_HOLD_OFF``); else None."""
    if not isinstance(error, RateLimited) or error.tokens_left is None:
        return None
    wait = error.tokens_reset if error.tokens_reset is not None else error.retry_after
    return None if wait is None or wait <= 0 else (error.tokens_left, min(wait, MAX_HOLD_OFF))


@dataclass
class Attempt:
    group: ModelGroup
    deployment: Deployment
    delay: float = 0.0  # seconds to wait before sending
    number: int = 1


class RoutePlan:
    def __init__(self, group: ModelGroup, resolve: Callable[[str], ModelGroup | None],
                 rng: random.Random | None = None, prompt_tokens: int = 0, routing_key: str | None = None,
                 tenant: str | None = None, tokens: int = 0, deadline: Deadline | None = None) -> None:
        self._resolve = resolve
        self._deadline = deadline or Deadline(None)  # no wait that would end after it is planned
        self.out_of_time = False  # the last ``first`` / ``after`` passed over a wait the deadline leaves no time for
        self._tenant = tenant  # whose request: a deployment may be held off for this tenant alone
        self._tokens = tokens  # what the request may spend of a deployment's tokens per minute
        self._routing_key = routing_key  # the prompt's opening, for strategy cache_aware
        self._prompt_tokens = prompt_tokens  # estimated; deployments with a smaller context_window are skipped
        self.too_long = False  # some deployment was skipped because the prompt exceeds its context window
        self.tenant_refused = 0.0  # the seconds left of the tenant's own open circuit on a deployment skipped
        self._rng = rng or group.rng
        self._tried_groups = {group.name}
        self._fallbacks = _Fallbacks()  # each group entered pushes its own
        self._context_fallbacks = _Fallbacks()
        self._count = 0
        self._entered: list[ModelGroup] = []
        # not sent this request again: their upstream does not know their model, or refused this request alone
        self._not_again: set[Deployment] = set()
        self._current: Deployment | None = None  # the deployment of the last attempt
        self._enter(group)

    def _enter(self, group: ModelGroup) -> None:
        self._group = group
        self._entered.append(group)
        self._tried_groups.add(group.name)
        self._fallbacks.push(group.config.fallbacks)
        self._context_fallbacks.push(group.config.context_window_fallbacks)
        self._order = group.ordered(self._routing_key)
        self._pos = -1
        self._retries_left = group.config.max_retries
        self._retry = 0

    def first(self) -> Attempt | None:
        self.out_of_time = False
        attempt = self._next_in_group(0.0)
        if attempt is None and self.too_long:
            attempt = self._next_group(self._context_fallbacks)
        return attempt or self._next_group(self._fallbacks)

    def after(self, error: BackendError) -> Attempt | None:
        self.out_of_time = False
        if isinstance(error, ContextTooLong):
            return self._next_group(self._context_fallbacks)
        if isinstance(error, (ModelNotFound, AuthFailed)) and self._current is not None:
            self._not_again.add(self._current)
            return self._next_in_group(0.0) or self._next_group(self._fallbacks)
        if not error.retryable:
            return None
        if isinstance(error, RateLimited) and not error.exhausted and error.retry_after is not None \
                and error.retry_after > MAX_BACKOFF and self._current is not None:
            self._not_again.add(self._current)  # not before its wait: the others and fallbacks may take it
        if self._retries_left > 0:
            self._retries_left -= 1
            self._retry += 1
            if attempt := self._next_in_group(self._backoff(error)):
                return attempt
        return self._next_group(self._fallbacks)

    def held_off(self) -> float | None:
        """The shortest wait left of the deployments held off in the groups tried that the prompt
        fits (see ``holds_off``), or None when none is: why no attempt was left, if it was that."""
        waits = [w for group in self._entered for d in group.deployments
                 if self._fits(d) and (w := d.health.held_for(self._tenant)) > 0]
        return min(waits, default=None)

    def circuits_open(self) -> float | None:
        """The shortest wait until a circuit half-opens when every deployment of the groups tried that
        the prompt fits has its circuit open (why no attempt was left, if it was that), else None."""
        waits = [d.health.cooling_for() for group in self._entered for d in group.deployments if self._fits(d)]
        return min(waits) if waits and min(waits) > 0 else None

    def nothing_to_try(self, model: str, prompt_tokens: int) -> BackendError:
        """Why the plan had no first attempt: the upstreams asked to wait (a 429 with the shortest wait
        left), the tenant's own circuits are open, those of the deployments the prompt fits are, the prompt
        fits no deployment tried (after those: not a 400 for a fallback's smaller window), or capacity."""
        if (wait := self.held_off()) is not None:
            return RateLimited(f"the upstreams of '{model}' asked for no requests for {math.ceil(wait)} s",
                               retry_after=wait)
        if self.tenant_refused > 0:
            return Unavailable(f"the deployments of '{model}' are refusing this tenant's requests for "
                               f"{math.ceil(self.tenant_refused)} s after repeated failures",
                               retry_after=self.tenant_refused)
        if (wait := self.circuits_open()) is not None:
            return Unavailable(f"every deployment of '{model}' failed repeatedly; the next is tried in "
                               f"{math.ceil(wait)} s", retry_after=wait)
        if self.too_long:
            return ContextTooLong(f"the prompt (about {prompt_tokens} tokens) exceeds the context window of "
                                  f"every deployment of '{model}'", param="messages")
        return Unavailable(f"no deployment of '{model}' is available (circuits open or at capacity)")

    # ------------------------------------------------------------ internals

    def _backoff(self, error: BackendError) -> float:
        delay = self._group.config.retry_backoff * 2 ** (self._retry - 1) * self._rng.uniform(0.5, 1.5)
        asked = error.retry_after if isinstance(error, (RateLimited, Unavailable)) else None
        if asked is not None and len(self._order) <= 1:
            delay = max(delay, asked)  # the same deployment asked us to wait (a 429's or a 503's Retry-After)
        return min(delay, MAX_BACKOFF)

    def _next_in_group(self, delay: float) -> Attempt | None:
        """The next deployment in order whose circuit still admits a request and whose upstream has
        the tokens it needs left, else the one held off for the shortest wait the plan waits out,
        else the first that admits it though short of tokens."""
        self._follow_reload()
        if not self._deadline.allows(delay):
            self.out_of_time = True
            return None
        tenant = self._tenant
        for _ in range(len(self._order)):
            self._pos = (self._pos + 1) % len(self._order)
            deployment = self._order[self._pos]
            if self._may_try(deployment) and deployment.accepts(tenant=tenant) \
                    and not deployment.health.short_of(self._tokens):
                return self._attempt(deployment, delay)
        held = [(wait, d) for d in self._group.deployments if 0 < (wait := d.health.held_for(tenant)) <= MAX_BACKOFF
                and self._may_try(d) and d.accepts(after_hold=True)]
        if held:
            wait, deployment = min(held, key=lambda h: h[0])
            if self._deadline.allows(wait):
                return self._attempt(deployment, max(delay, wait))
            self.out_of_time = True
        short = next((d for d in self._order if self._may_try(d) and d.accepts(tenant=tenant)), None)
        return None if short is None else self._attempt(short, delay)

    def _follow_reload(self) -> None:
        """A reload removed or changed some of the group's deployments since the plan entered it: go
        on in the group's new table (a changed deployment as it is now), the one just tried last."""
        if not any(d.retired for d in self._group.deployments):
            return
        current = self._resolve(self._group.name)
        if current is None or current.name != self._group.name:
            return  # the group itself was removed: its deployments left are passed over
        self._entered[self._entered.index(self._group)] = current
        self._group = current
        order = current.ordered(self._routing_key)
        if self._current in order:
            i = order.index(self._current)
            order = order[i + 1:] + order[:i + 1]
        self._order, self._pos = order, -1

    def _may_try(self, deployment: Deployment) -> bool:
        """Whether this request may go to ``deployment``: its prompt fits, it was not ruled out, and
        its tenant's own circuit there is closed, and no reload removed it."""
        if deployment.retired:
            return False
        if not self._fits(deployment):
            self.too_long = True
            return False
        if not deployment.health.admits(self._tenant):
            self.tenant_refused = max(self.tenant_refused, deployment.health.tenant_retry_after(self._tenant))
            return False
        return deployment not in self._not_again

    def _fits(self, deployment: Deployment) -> bool:
        window = deployment.config.context_window
        return window is None or self._prompt_tokens <= window

    def _attempt(self, deployment: Deployment, delay: float) -> Attempt:
        self._current = deployment
        self._count += 1
        return Attempt(self._group, deployment, delay, self._count)

    def _next_group(self, fallbacks: _Fallbacks) -> Attempt | None:
        """The first attempt in the next fallback group not entered yet that has a deployment to
        try (one without goes on to its own fallbacks, as one that failed does)."""
        while (name := fallbacks.pop()) is not None:
            group = self._resolve(name)
            if group is None or group.name in self._tried_groups:
                continue
            self._enter(group)
            if attempt := self._next_in_group(0.0):
                return attempt
        return None


class _Fallbacks:
    """The fallback groups (of one kind) still to try, depth-first: a stack of the lists of the
    groups entered, the last entered's on top, each taken in its listed order."""

    def __init__(self) -> None:
        self._lists: list[list[str]] = []

    def push(self, names: list[str]) -> None:
        self._lists.append(list(names))

    def pop(self) -> str | None:
        """The next name to try, or None when none is left."""
        while self._lists:
            if names := self._lists[-1]:
                return names.pop(0)
            self._lists.pop()
        return None
