"""Quotas in Redis: ``RedisStore`` runs each operation of ``QuotaStore`` as one Lua script
(``redis_scripts.py``, which describes the keys): one round trip, atomic across replicas."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

from gateway.contracts import QuotaState
from gateway.quotas.limits import WINDOW_SECONDS, period_id
from gateway.quotas.redis_client import Arg, RespClient
from gateway.quotas.redis_scripts import FORGET, RENEW, RENEW_TICKETS, RESERVE, SEED, SETTLE
from gateway.quotas.store import ONCE_SECONDS, PICOS_PER_MICRO, Decision, Lease, Reservation, budget_retry

NONE = -1  # "no limit" in script arguments and results


def connect_redis(url: str, *, timeout: float = 2.0) -> RespClient:
    """The pipelining client (``resp.py``); ``timeout`` keeps an unreachable Redis from hanging a request."""
    return RespClient.from_url(url, timeout=timeout)


def _member(ticket_id: str, second: int, tokens: int, micros: int) -> str:
    """A ticket's member in its scopes' ``:cc`` sets: its id and reservation (the second it was made
    in, its tokens and micro-dollars, which SEED counts while it is in flight), padded past 64 bytes
    (see above)."""
    return f"{ticket_id}:{second}:{tokens}:{micros}" + "#" * 64


def _limit(value: int | None) -> int:
    return NONE if value is None else int(value)


def _state(limit: int, remaining: int, reset_ms: int) -> QuotaState | None:
    if limit == NONE:
        return None
    return QuotaState(limit=limit, remaining=remaining, reset_seconds=max(0.0, reset_ms / 1000))


class RedisStore:
    def __init__(self, redis: RespClient, *, prefix: str = "sy:q") -> None:
        self.redis = redis
        self.prefix = prefix
        self._reserve = redis.register_script(RESERVE)
        self._settle = redis.register_script(SETTLE)
        self._seed = redis.register_script(SEED)
        self._renew = redis.register_script(RENEW)
        self._renew_tickets = redis.register_script(RENEW_TICKETS)
        self._forget = redis.register_script(FORGET)

    def _base(self, kind: str, sid: str) -> str:
        return f"{self.prefix}:{kind}:{sid}"

    async def ready(self) -> bool:
        """Redis answers (for /readyz)."""
        return await self.redis.ping()

    async def reserve(self, r: Reservation) -> Decision:
        keys: list[str] = []
        sec = math.floor(r.now)
        member = "" if r.requests_only else _member(r.ticket_id, sec, r.tokens, r.micros)
        args: list[Arg] = [r.now, member, r.tokens, r.micros,
                           r.now + r.lease_seconds, WINDOW_SECONDS, sec, f"r{sec}", f"t{sec}", 2 * WINDOW_SECONDS,
                           math.ceil(r.lease_seconds) + 1]
        for scope in r.scopes:
            lim = scope.limits
            pid, ttl = period_id(lim.budget_period, r.now)
            base = self._base(scope.kind, scope.id)
            keys += [base + ":win", base + ":cc", f"{base}:bd:{pid}"]
            cost = NONE if lim.cost_budget is None else round(lim.cost_budget * 1e6)
            args += [
                _limit(lim.requests_per_minute),
                _limit(lim.tokens_per_minute),
                _limit(lim.max_concurrency),
                _limit(lim.token_budget),
                cost,
                ttl + 86400 if ttl > 0 else 0,  # a day past the period's end
            ]
        out = await self._reserve(keys=keys, args=args)
        assert isinstance(out, list)  # the script returns its array reply
        ok, index, retry_ms = int(out[0]), int(out[2]), int(out[3])
        reason = out[1].decode() if isinstance(out[1], bytes) else str(out[1])
        req = _state(int(out[4]), int(out[5]), int(out[6]))
        tok = _state(int(out[7]), int(out[8]), int(out[9]))
        if ok:
            return Decision(True, requests=req, tokens=tok)
        retry = budget_retry(r, r.scopes[index]) if retry_ms < 0 else max(retry_ms / 1000, 0.001)
        return Decision(False, reason, index, retry, req, tok)

    async def seed_budget(self, kind: str, sid: str, pid: str, tokens: int, picos: int, ttl: int, now: float,
                          since: float | None, *, counted: Sequence[str] = ()) -> None:
        base = self._base(kind, sid)
        start = NONE if since is None else math.floor(since)
        micros, past = divmod(picos, PICOS_PER_MICRO)
        await self._seed(keys=[f"{base}:bd:{pid}", base + ":cc", *(self._charged(once) for once in counted)],
                         args=[tokens, micros, past, ttl, now, start, *counted])

    def _charged(self, once: str) -> str:
        """The key noting that the charge under ``once`` ran."""
        return f"{self.prefix}:charged:{once}"

    def settle(self, lease: Lease, now: float, actual_tokens: int, actual_picos: int, *,
               given_back: bool = False, once: str | None = None) -> asyncio.Future[object]:
        keys: list[str] = []
        for kind, sid, pid in lease.scopes:
            base = self._base(kind, sid)
            keys += [base + ":win", base + ":cc", f"{base}:bd:{pid}"]
        member = _member(lease.ticket_id, lease.second, lease.tokens, lease.micros)
        correction = divmod(actual_picos - lease.micros * PICOS_PER_MICRO, PICOS_PER_MICRO)
        args: list[Arg] = [member, f"t{lease.second}", actual_tokens - lease.tokens, *correction,
                           actual_tokens, *divmod(actual_picos, PICOS_PER_MICRO),
                           NONE if given_back else lease.second]
        if once is not None:
            keys.append(self._charged(once))
            args += [ONCE_SECONDS, once]
        return self._settle.submit(keys=keys, args=args)

    async def renew(self, leases: list[Lease], now: float, lease_seconds: float) -> None:
        keys: list[str] = []
        args: list[Arg] = [now + lease_seconds, math.ceil(lease_seconds)]
        for lease in leases:
            for kind, sid, pid in lease.scopes:
                base = self._base(kind, sid)
                keys += [base + ":cc", f"{base}:bd:{pid}"]
                args.append(_member(lease.ticket_id, lease.second, lease.tokens, lease.micros))
        if keys:
            await self._renew_tickets(keys=keys, args=args)

    async def forget(self, buckets: list[tuple[str, str, str]], leases: list[Lease]) -> None:
        keys = [f"{self._base(kind, sid)}:bd:{pid}" for kind, sid, pid in buckets]
        args: list[Arg] = [len(keys)]
        for lease in leases:
            member = _member(lease.ticket_id, lease.second, lease.tokens, lease.micros)
            for kind, sid, _ in lease.scopes:
                keys.append(self._base(kind, sid) + ":cc")
                args.append(member)
        await self._forget(keys=keys, args=args)
