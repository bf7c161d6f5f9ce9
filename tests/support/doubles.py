"""Small real implementations of the gateway's seams for tests (no mocks of HTTP or SQL)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from gateway.contracts import Principal, QuotaExceeded, QuotaState, Ticket, UsageRecord, completed
from gateway.drain import Drain
from gateway.usage.pricing import HostedTools


class StaticKeys:
    """An Authenticator over a fixed token -> Principal table."""

    def __init__(self, keys: dict[str, Principal]) -> None:
        self.keys = keys

    async def authenticate(self, token: str) -> Principal | None:
        return self.keys.get(token)


@dataclass
class Settlement:
    ticket: Ticket
    actual_tokens: int
    cost: float


class ScriptedAdmission:
    """Admits everyone except the key ids in ``throttled``; records every settlement."""

    def __init__(self, throttled: dict[str, float] | None = None) -> None:
        self.throttled = throttled or {}  # key_id -> retry_after seconds
        self.settled: list[Settlement] = []

    async def admit(self, principal: Principal, model: str, reserve_tokens: int,
                    output_field: str | None = "max_tokens", tools: HostedTools | None = None) -> Ticket:
        state = QuotaState(limit=60, remaining=59, reset_seconds=1.0)
        if principal.key_id in self.throttled:
            ticket = Ticket(principal, model, 0, requests=QuotaState(60, 0, 7.0))
            raise QuotaExceeded("Rate limit reached for requests", retry_after=self.throttled[principal.key_id],
                                ticket=ticket)
        return Ticket(principal=principal, model=model, reserved_tokens=reserve_tokens, requests=state)

    async def admit_poll(self, principal: Principal) -> Ticket:
        return await self.admit(principal, "", 0)

    def settle(self, ticket: Ticket, actual_tokens: int, cost: float) -> asyncio.Future[None]:
        self.settled.append(Settlement(ticket, actual_tokens, cost))
        return completed()

    async def charge(self, principal: Principal, tokens: int, cost: float, *, once: str | None = None) -> None:
        self.settled.append(Settlement(Ticket(principal, "", 0), tokens, cost))


@dataclass
class RecordingSink:
    records: list[UsageRecord] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def record(self, record: UsageRecord) -> None:
        with self.arrived:
            self.records.append(record)
            self.arrived.notify_all()

    def begin(self, record: UsageRecord) -> None:
        return None

    async def sync(self) -> None:
        return None

    def wait_for(self, count: int, timeout: float = 10.0) -> list[UsageRecord]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.records) >= count, timeout)
            return list(self.records)


class CutAfter(Drain):
    """A drain under way whose time runs out after ``reads`` more chunks."""

    def __init__(self, reads: int) -> None:
        super().__init__()
        self.draining, self._reads = True, reads

    async def next_or_cut(self, chunks: AsyncIterator[Any]) -> Any:
        self._reads -= 1
        if self._reads < 0:
            self.cut.set()
        return await super().next_or_cut(chunks)
