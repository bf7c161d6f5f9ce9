"""Who a backend call is for: the tenant and its fair-share weight, passed without new arguments.

The gateway sets ``calling_tenant`` around each backend call; the local engine reads it to
schedule fairly across tenants (``scheduling: fair``). Remote providers ignore it, except engine
nodes (``switchyard engine serve``) behind an ``openai`` deployment with ``forward_tenant: true``:
they are sent the tenant in ``TENANT_HEADER`` and ``WEIGHT_HEADER`` and schedule by it too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class CallingTenant:
    tenant_id: str
    weight: float = 1.0


TENANT_HEADER = "x-switchyard-tenant"
WEIGHT_HEADER = "x-switchyard-tenant-weight"

_current: ContextVar[CallingTenant | None] = ContextVar("switchyard_calling_tenant", default=None)


def calling_tenant() -> CallingTenant | None:
    """The tenant of the backend call in progress (None outside a gateway request)."""
    return _current.get()


@contextlib.contextmanager
def for_tenant(tenant_id: str | None, weight: float = 1.0) -> Iterator[None]:
    """Run the enclosed backend calls on behalf of ``tenant_id`` (None: no tenant, e.g. admin keys)."""
    token = _current.set(CallingTenant(tenant_id, weight if weight > 0 else 1.0) if tenant_id else None)
    try:
        yield
    finally:
        _current.reset(token)


def tenant_headers() -> dict[str, str]:
    """The headers that tell an engine node whom the call in progress is for (none outside a tenant)."""
    who = _current.get()
    return {} if who is None else {TENANT_HEADER: who.tenant_id, WEIGHT_HEADER: repr(who.weight)}


def forwarded_tenant(headers: Mapping[str, str]) -> CallingTenant | None:
    """The tenant a gateway forwarded in ``tenant_headers`` (None when absent or malformed)."""
    tenant = headers.get(TENANT_HEADER, "").strip()
    if not tenant or len(tenant) > 200:
        return None
    try:
        weight = float(headers.get(WEIGHT_HEADER, "1"))
    except ValueError:
        weight = 1.0
    return CallingTenant(tenant, weight if 0 < weight < 1e6 else 1.0)
