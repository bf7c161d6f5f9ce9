"""Who a backend call is for: the tenant and its fair-share weight, passed without new arguments.

The gateway sets ``calling_tenant`` around each backend call; the local engine reads it to
schedule fairly across tenants (``scheduling: fair``). Remote providers ignore it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class CallingTenant:
    tenant_id: str
    weight: float = 1.0


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
