"""Per-deployment health: a circuit breaker, a latency EWMA and error counts.

States: ``closed`` (normal) -> ``open`` after ``failures`` failures within ``window`` seconds ->
after ``cooldown`` seconds one trial request is let through (``half_open``); its success closes
the circuit, its failure opens it again for another cooldown.

Only failures of the deployment count, and each is charged to the tenant whose request met it. A
request's own 4xx, or a failure of that request alone (``on_refused``), says nothing either way: it
neither counts as a failure nor clears the failures in the window (a client sending bad requests
would otherwise keep a failing deployment's circuit closed); as a half-open trial it ends without a
verdict. When ``failures`` failures in the window all come from one tenant while another tenant was
served well by the deployment in that window, the tenant's requests are the likely cause: a circuit
opens for that tenant alone (``admits(tenant)`` refuses it for ``cooldown`` seconds) and the others
are served. Otherwise (several tenants failing, or nobody else served) the deployment's circuit opens.

Apart from the circuit, an upstream may ask for no requests for a while (a 429's ``Retry-After``
when a limit of the deployment's is used up: ``hold_off``): the deployment takes none until then.
A 429 that does not say which limit is used up (no rate-limit headers: it may be about one
tenant's or key's own quota upstream, or one request) holds the deployment off for its tenant
alone, and for everyone once a second tenant meets one with no request served there in between.
A 429 saying how many tokens are left of its limit marks the deployment short of tokens until the
limit resets (``short_of``): the plan prefers other deployments for the requests that need more. So
does a successful answer saying so (OpenAI, Azure and Anthropic send their rate-limit headers with
every answer; none left of the requests: short of every token), before any 429; the next answer
that says what is left replaces it (one with plenty left ends it).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gateway.settings import CircuitConfig

EWMA_ALPHA = 0.3

Clock = Callable[[], float]


@dataclass
class HealthView:
    """A snapshot for the admin endpoint and metrics."""

    state: str  # "healthy" | "open" | "cooling" (half-open, trial in progress or allowed) | "held" (``hold_off``)
    latency_ewma_ms: float | None
    requests: int
    errors: int
    error_rate: float
    consecutive_failures: int
    held_for_seconds: float  # until the upstream takes requests again (``hold_off``; 0: it does now)


class DeploymentHealth:
    def __init__(
        self, config: CircuitConfig, clock: Clock = time.monotonic, tokens_per_minute: int | None = None
    ) -> None:
        self.config = config
        self._clock = clock
        self.tokens_per_minute = tokens_per_minute
        self._tokens: deque[tuple[float, int]] = deque()  # (time, tokens) of the last minute
        self._pending = 0  # tokens of the attempts in flight, not metered yet (``reserve_tokens``)
        self._failures: deque[tuple[float, str | None]] = deque()  # (time, tenant) within the window
        self._tenants = _TenantCircuits(config, clock)
        self._served: dict[str | None, float] = {}  # tenant -> its last success here in the window, oldest first
        self._last_served = -math.inf  # the last success here
        self._opened_at: float | None = None
        self._trial = 0  # the number of the half-open trial in flight (0: none)
        self._trials = 0  # trials sent so far, to number them
        self._held_until = 0.0  # no request before this time (``hold_off``)
        self._tenant_holds: dict[str, tuple[float, float]] = {}  # tenant -> (since, until) of its own hold
        self._tokens_left = math.inf  # what the upstream said is left of its tokens per minute ...
        self._tokens_left_until = 0.0  # ... until this time (``note_tokens_left``)
        self.latency_ewma: float | None = None  # seconds to first token
        self.requests = 0
        self.errors = 0
        self.consecutive_failures = 0

    def reconfigure(self, config: CircuitConfig, tokens_per_minute: int | None) -> None:
        """New settings for the same upstream (a config reload): what was learnt of it stays."""
        self.config = self._tenants.config = config
        self.tokens_per_minute = tokens_per_minute

    # ------------------------------------------------------------ circuit

    @property
    def state(self) -> str:
        if self._opened_at is None:
            return "closed"
        if self._clock() - self._opened_at >= self.config.cooldown:
            return "half_open"
        return "open"

    def cooling_for(self) -> float:
        """Seconds left until the open circuit lets a trial through (0: it is not open)."""
        return 0.0 if self._opened_at is None else max(0.0, self._opened_at + self.config.cooldown - self._clock())

    def available(self, after_hold: bool = False, tenant: str | None = None) -> bool:
        """Whether a request (of ``tenant``) may be sent now (a half-open circuit admits one trial at
        a time, and none is sent while the upstream asked to wait; ``after_hold``: once that wait is over)."""
        if not after_hold and (self._held_until or self._tenant_holds) and self.held_for(tenant) > 0:
            return False
        state = self.state
        return state == "closed" or (state == "half_open" and not self._trial)

    def hold_off(self, seconds: float, tenant: str | None = None) -> None:
        """The upstream asked for no request for ``seconds`` (its ``Retry-After``); with ``tenant``
        (its 429 said nothing of the deployment's limits) from that tenant, and from everyone once
        another tenant is held off too since the last request served here."""
        now = self._clock()
        until = now + seconds
        if tenant is not None:
            served = self._last_served
            holds = {t: hold for t, hold in self._tenant_holds.items() if hold[1] > now}
            held = holds.get(tenant, (now, until))[1]
            holds[tenant] = (now, max(held, until))
            self._tenant_holds = holds
            if not any(t != tenant and since > served for t, (since, _) in holds.items()):
                return
        self._held_until = max(self._held_until, until)

    def held_for(self, tenant: str | None = None) -> float:
        """Seconds left until the upstream takes requests (of ``tenant``) again (0: it does now)."""
        until = self._held_until
        if tenant is not None and (own := self._tenant_holds.get(tenant)) is not None:
            until = max(until, own[1])
        return max(0.0, until - self._clock())

    def note_tokens_left(self, tokens: float, seconds: float) -> None:
        """The upstream said only ``tokens`` are left of its tokens per minute, for ``seconds``
        (replacing what it said before)."""
        self._tokens_left, self._tokens_left_until = tokens, self._clock() + seconds

    def short_of(self, tokens: int) -> bool:
        """Whether the upstream said fewer than ``tokens`` are left now (``note_tokens_left``)."""
        if tokens <= self._tokens_left:
            return False
        if self._clock() < self._tokens_left_until:
            return True
        self._tokens_left = math.inf  # its limit has reset
        return False

    def record_tokens(self, tokens: int) -> None:
        if self.tokens_per_minute is not None and tokens > 0:
            self._tokens.append((self._clock(), tokens))

    def tokens_last_minute(self) -> int:
        cutoff = self._clock() - 60.0
        while self._tokens and self._tokens[0][0] < cutoff:
            self._tokens.popleft()
        return sum(n for _, n in self._tokens)

    def reserve_tokens(self, tokens: int) -> int:
        """Count ``tokens`` of an attempt sent now against ``tokens_per_minute`` until its
        ``release_tokens`` (its meter recorded, or its failure): concurrent requests do not all
        pass before the first is metered. What was counted (0: the deployment has no limit)."""
        if self.tokens_per_minute is None or tokens <= 0:
            return 0
        self._pending += tokens
        return tokens

    def release_tokens(self, tokens: int) -> None:
        self._pending = max(0, self._pending - tokens)

    def within_tpm(self) -> bool:
        return self.tokens_per_minute is None or self.tokens_last_minute() + self._pending < self.tokens_per_minute

    def on_attempt(self) -> int:
        """An attempt is sent; its trial number if it is the half-open trial, else 0 (for
        ``on_abandoned`` and ``on_refused``: only the trial's own end without a verdict frees its slot,
        not that of a request sent before the circuit opened)."""
        self.requests += 1
        if self.state != "half_open":
            return 0
        self._trials += 1
        self._trial = self._trials
        return self._trial

    def on_abandoned(self, trial: int) -> None:
        """The attempt ended without a verdict (the client went away): free its trial slot."""
        self._end_trial(trial)

    def _end_trial(self, trial: int) -> None:
        if trial and trial == self._trial:
            self._trial = 0

    def admits(self, tenant: str | None) -> bool:
        """Whether this tenant's own circuit on the deployment is closed."""
        return self._tenants.admits(tenant)

    def tenant_retry_after(self, tenant: str | None) -> float:
        return self._tenants.retry_after(tenant)

    def on_refused(self, trial: int) -> None:
        """The request failed for a reason of its own (its 4xx, or the provider failing this one
        request while serving others): no verdict on the deployment (``trial``: from ``on_attempt``)."""
        self._end_trial(trial)

    def on_success(self, latency: float | None, tenant: str | None = None) -> None:
        self._tenants.on_success(tenant)
        now = self._clock()
        self._served.pop(tenant, None)
        self._served[tenant] = self._last_served = now  # at the end: the map stays in the order of its times
        self._forget_served(now)
        self._opened_at = None
        self._trial = 0
        self._failures.clear()
        self.consecutive_failures = 0
        if latency is not None:
            self.note_latency(latency)

    def note_latency(self, latency: float) -> None:
        """One more time to first token (or to a timeout: at least that long) into the EWMA."""
        self.latency_ewma = (
            latency if self.latency_ewma is None else (EWMA_ALPHA * latency + (1 - EWMA_ALPHA) * self.latency_ewma)
        )

    def on_failure(self, tenant: str | None = None) -> None:
        now = self._clock()
        self.errors += 1
        self.consecutive_failures += 1
        if self._opened_at is not None:  # the half-open trial failed (or a straggler): reopen
            self._opened_at, self._trial = now, 0
            return
        self._failures.append((now, tenant))
        while self._failures and now - self._failures[0][0] > self.config.window:
            self._failures.popleft()
        if len(self._failures) < self.config.failures:
            return
        self._forget_served(now)
        others_served = len(self._served) > (1 if tenant in self._served else 0)
        if others_served and all(t == tenant for _, t in self._failures):
            self._tenants.open(tenant, now)  # one tenant's requests fail where others' succeed
        else:
            self._opened_at = now
        self._failures.clear()

    def _forget_served(self, now: float) -> None:
        """Drop the tenants last served before the window."""
        while self._served and now - next(iter(self._served.values())) > self.config.window:
            del self._served[next(iter(self._served))]

    def view(self) -> HealthView:
        """The circuit's state, unless the upstream asked to wait ("held": no request, not even a
        half-open trial, is sent until then; an open circuit shows as open)."""
        held_for, circuit = self.held_for(), self.state
        state = "held" if held_for > 0 and circuit != "open" else {
            "closed": "healthy", "open": "open", "half_open": "cooling"}[circuit]
        return HealthView(
            state=state,
            latency_ewma_ms=None if self.latency_ewma is None else self.latency_ewma * 1000,
            requests=self.requests,
            errors=self.errors,
            error_rate=self.errors / self.requests if self.requests else 0.0,
            consecutive_failures=self.consecutive_failures,
            held_for_seconds=held_for,
        )


class _TenantCircuits:
    """Circuits of single tenants on one deployment, opened by ``DeploymentHealth.on_failure``."""

    def __init__(self, config: CircuitConfig, clock: Clock) -> None:
        self.config = config
        self._clock = clock
        self._opened: dict[str | None, float] = {}  # tenant -> when its circuit opened, oldest first

    def open(self, tenant: str | None, now: float) -> None:
        self._opened.pop(tenant, None)
        self._opened[tenant] = now
        while self._opened and now - next(iter(self._opened.values())) >= self.config.cooldown:  # cooled down
            del self._opened[next(iter(self._opened))]

    def admits(self, tenant: str | None) -> bool:
        return not self._opened or self.retry_after(tenant) <= 0

    def retry_after(self, tenant: str | None) -> float:
        opened = self._opened.get(tenant)
        return 0.0 if opened is None else opened + self.config.cooldown - self._clock()

    def on_success(self, tenant: str | None) -> None:
        self._opened.pop(tenant, None)
