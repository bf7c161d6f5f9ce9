"""What the gateway tells a backend about one call, beyond the wire body: ``CallContext``.

Passed explicitly to every ``Backend`` method (no context variables). It holds

- the calling tenant and its fair-share weight: the local engine schedules fairly across tenants
  (``scheduling: fair``); an ``openai`` deployment with ``forward_tenant: true`` (an engine node,
  ``switchyard engine serve``) sends it in ``TENANT_HEADER`` / ``WEIGHT_HEADER``;
- the gateway's output cap for requests that set no limit (``quotas.default_max_tokens``; for a
  text completion at most 16, that API's own default): admission reserved that many output tokens
  per sequence, and the backend makes the reservation hold. An HTTP upstream is sent the cap as
  the request's limit; an in-process engine, which knows
  its context, stops at the cap or where the context ends, whichever comes first, rather than
  refusing a limit the client never asked for. A limit the client set always wins;
- ``on_meter``: a backend that meters a call from its start (the in-process engine) hands the
  gateway its ``Meter`` there, so a call cancelled before its answer is charged what it counts;
- ``rendered``: the chat prompt's ids as admission counted them with a backend's own tokenizer
  (``Tokenizing.tokenize_chat`` with its defaults), so that backend tokenizes the prompt only once.

A caller without a gateway (tests, scripts) passes nothing: no tenant, no cap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

TENANT_HEADER = "x-switchyard-tenant"
WEIGHT_HEADER = "x-switchyard-tenant-weight"
# The fair-share weights a tenant may have (the admin API's bounds): a ratio of at most 1e12 keeps
# the engine's virtual time (tokens / weight) finite, and a weight the admin API allows travels to an
# engine node unchanged.
MIN_WEIGHT = 1e-6
MAX_WEIGHT = 1e6


def fair_weight(weight: float) -> float:
    """``weight`` held within [MIN_WEIGHT, MAX_WEIGHT]; one <= 0 or not a finite number counts as 1."""
    if not math.isfinite(weight) or weight <= 0:
        return 1.0
    return min(max(weight, MIN_WEIGHT), MAX_WEIGHT)


@dataclass(frozen=True)
class CallingTenant:
    tenant_id: str
    weight: float = 1.0

    @classmethod
    def of(cls, tenant_id: str | None, weight: float = 1.0) -> CallingTenant | None:
        """The tenant, or None for calls on nobody's behalf (admin keys); its weight by ``fair_weight``."""
        return cls(tenant_id, fair_weight(weight)) if tenant_id else None


@dataclass(frozen=True)
class RenderedPrompt:
    """``backend.tokenize_chat(request)``: ids of that very request object (the body is not changed
    after admission), which the backend uses instead of rendering the request again."""

    backend: object
    request: object
    ids: list[int]


@dataclass(frozen=True)
class CallContext:
    tenant: CallingTenant | None = None
    output_cap: int | None = None  # generated tokens per sequence when the request sets no limit
    # given the ``backends.base.Meter`` of a call as it starts (Any: base imports this module)
    on_meter: Callable[[Any], None] | None = None
    rendered: tuple[RenderedPrompt, ...] = ()

    def prompt_ids(self, backend: object, request: object) -> list[int] | None:
        """The ids admission rendered for ``request`` with ``backend``'s tokenizer (None: not rendered)."""
        return next((r.ids for r in self.rendered if r.backend is backend and r.request is request), None)

    def output_limit(self, requested: int | None, room: int | None = None) -> int | None:
        """The client's limit if it set one; else the gateway's cap (None: none), at most ``room``."""
        if requested is not None:
            return requested
        if self.output_cap is None:
            return None
        return self.output_cap if room is None else max(1, min(self.output_cap, room))

    def tenant_headers(self) -> dict[str, str]:
        """The headers that tell an engine node whom this call is for (none without a tenant)."""
        who = self.tenant
        return {} if who is None else {TENANT_HEADER: who.tenant_id, WEIGHT_HEADER: repr(who.weight)}


NO_CONTEXT = CallContext()


def forwarded_tenant(headers: Mapping[str, str]) -> CallingTenant | None:
    """The tenant a gateway forwarded in ``tenant_headers`` (None when absent or malformed)."""
    tenant = headers.get(TENANT_HEADER, "").strip()
    if not tenant or len(tenant) > 200:
        return None
    try:
        weight = float(headers.get(WEIGHT_HEADER, "1"))
    except ValueError:
        weight = 1.0
    return CallingTenant(tenant, fair_weight(weight))
