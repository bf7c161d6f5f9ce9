"""The gateway's internal seams: who is calling, may they, and what it cost.

The request path (controllers) depends only on these protocols. The embedded default and the
production services (SQL-backed keys, Redis quotas, batched usage writer) both implement them,
and ``gateway.services`` builds the set a running app uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gateway.usage.pricing import HostedTools


@dataclass(frozen=True)
class Principal:
    """An authenticated caller."""

    key_id: str
    tenant_id: str | None  # None for admin keys
    is_admin: bool = False
    allowed_models: frozenset[str] | None = None  # None: every model
    tenant_weight: float = 1.0  # fair-share weight for engine scheduling

    def may_use(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models


class Authenticator(Protocol):
    async def authenticate(self, token: str) -> Principal | None:
        """The principal for a presented bearer token, or None when it is unknown/revoked/expired."""
        ...


@dataclass
class QuotaState:
    """One limit's standing after an admission attempt, for the x-ratelimit-* headers."""

    limit: int
    remaining: int
    reset_seconds: float


@dataclass
class Ticket:
    """What an admission reserved; handed back to ``settle``."""

    principal: Principal
    model: str
    reserved_tokens: int
    requests: QuotaState | None = None
    tokens: QuotaState | None = None
    reservation: object = None  # opaque: what the admission reserved, for its settle (None: nothing)


class QuotaExceeded(Exception):
    def __init__(self, message: str, *, retry_after: float | None, ticket: Ticket | None = None,
                 budget: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after  # None: no wait admits the request (a limit of 0, or under it)
        self.ticket = ticket  # carries the limit states for the headers
        # refused by what is left of a budget (tokens or money), not by a rate: OpenAI's
        # ``insufficient_quota``, which no SDK retry can end (a period's end is hours away)
        self.budget = budget


class QuotaUnavailable(Exception):
    """The quota store cannot be reached and the policy is fail-closed."""


class Admission(Protocol):
    async def admit(self, principal: Principal, model: str, reserve_tokens: int,
                    output_field: str | None = "max_tokens", tools: HostedTools | None = None) -> Ticket:
        """Check and reserve in one atomic step; raise QuotaExceeded or QuotaUnavailable.
        ``output_field`` names the request's field the output reservation came from, for the
        refusal's message (None: the request generates nothing, as embeddings); ``tools``, the
        provider's tools the request enables, whose per-call fees are reserved too."""
        ...

    async def admit_poll(self, principal: Principal) -> Ticket:
        """Count a request that spends nothing itself (a read or cancel of a stored response) against
        the requests/min limits alone; raise QuotaExceeded or QuotaUnavailable. Nothing to settle."""
        ...

    def settle(self, ticket: Ticket, actual_tokens: int, cost: float) -> asyncio.Future[None]:
        """Release concurrency, correct reserved tokens to the actual count, add the cost. The
        settlement is on its way when this returns (the request path does not wait for more); the
        future completes when it is acknowledged, and never fails (an outage is logged)."""
        ...

    async def charge(self, principal: Principal, tokens: int, cost: float, *, once: str | None = None) -> None:
        """Count spend no admission reserved (a background response's, metered when it ends) against
        the principal's token and money budgets; never fails (an outage is logged). ``once``: a key
        the charge is counted under at most once, however often it is sent (for days)."""
        ...


def completed(value: Any = None) -> asyncio.Future[Any]:
    """A future that is already done (what a ``settle`` with nothing to wait for returns)."""
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


@dataclass
class UsageRecord:
    """One row per request, successful or not."""

    request_id: str
    key_id: str
    tenant_id: str | None
    model: str  # the public model name the client asked for
    deployment: str | None
    provider: str | None
    endpoint: str  # "chat.completions" | "completions"
    started_at: float  # unix time
    status: int  # the HTTP status returned to the client (200 for a stream cut off mid-way)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    exact: bool = True
    cost: float | None = None  # USD; None: not priced yet (the usage writer prices it by ``model``)
    error_type: str | None = None
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    stream: bool = False
    service_tier: str | None = None  # the provider's tier it says it served the request at ("priority")
    # the provider's own id of the answer (or of the last attempt's error answer), for its support:
    # the operator's, never shown to the tenant
    upstream_request_id: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


INCOMPLETE = "incomplete"  # ``extra["outcome"]`` of the record that stands for a request until it settles
QUOTA_REFUSED = "rate_limit_exceeded"  # the code (and usage row's error_type) of a 429 from the gateway's quotas
BUDGET_SPENT = "insufficient_quota"  # the code and type of one refused by a budget (the usage row: QUOTA_REFUSED)


class UsageSink(Protocol):
    def record(self, record: UsageRecord) -> None:
        """Queue a record; never blocks the request path, never raises."""
        ...

    def begin(self, record: UsageRecord) -> None:
        """Note an admitted request by the record that settles it if the process dies first (its
        reservation, marked incomplete); its ``record`` replaces it."""
        ...

    def sync(self) -> Awaitable[None]:
        """Done once every record and ``begin`` so far is durable (awaited before a response's last
        byte; already done when a sink keeps nothing waiting)."""
        ...
