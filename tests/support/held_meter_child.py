"""A replica that meters a background response and hangs while it charges the budgets: its Redis is
behind a black-holed ``TcpGate`` (a partition), so the charge waits for a reply that never comes.
``tests/gateway/test_held_usage_sigkill.py`` SIGKILLs it there.

``python -m tests.support.held_meter_child DB_URL REDIS_PREFIX JOURNAL_DIR RESPONSE_ID LEASE_SECONDS``:
meters ``RESPONSE_ID`` as ended with ``USAGE``, with a usage writer on ``JOURNAL_DIR`` (flushed
never: its records stay in its write-ahead segment) and claims held ``LEASE_SECONDS``; prints
``charging`` once the charge has begun.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from backends.base import Meter
from gateway import held_usage
from gateway.contracts import Admission, Principal
from gateway.db import Database
from gateway.pipeline import Pipeline
from gateway.quotas.admission import QuotaAdmission
from gateway.quotas.limits import LimitsSource
from gateway.quotas.redis_store import RedisStore, connect_redis
from gateway.stored_responses import ResponseStore
from gateway.usage.pricing import Price, PriceTable
from gateway.usage.writer import UsageWriter
from tests.support.tcp_gate import TcpGate

PRICES = PriceTable({"m": Price(input_per_million=1.0, output_per_million=3.0)})
USAGE = {"input_tokens": 7, "output_tokens": 3}  # what the upstream reports the response spent


def ended(response_id: str) -> dict[str, Any]:
    """The upstream's answer for the response, ended."""
    return {"id": response_id, "object": "response", "status": "completed", "model": "m", "created_at": 1,
            "usage": USAGE}


def pipeline(admission: Admission, usage: UsageWriter) -> Pipeline:
    """What ``meter_ended`` needs of a pipeline: the price of a response's spend, admission and usage."""
    def cost(deployment: str | None, model: str, meter: Meter) -> float:
        return PRICES.cost(model, meter.prompt_tokens, meter.completion_tokens, meter.cached_tokens)

    return cast(Pipeline, SimpleNamespace(cost=cost, services=SimpleNamespace(admission=admission, usage=usage)))


class Announced:
    """An admission that says on stdout when a charge begins."""

    def __init__(self, admission: QuotaAdmission) -> None:
        self.admission = admission

    async def charge(self, principal: Principal, tokens: int, cost: float, *, once: str | None = None) -> None:
        print("charging", flush=True)
        await self.admission.charge(principal, tokens, cost, once=once)


async def main(url: str, prefix: str, journal: Path, response_id: str, lease: float) -> None:
    held_usage.LEASE_SECONDS = lease
    db = Database.from_url(url)
    gate = TcpGate("127.0.0.1", 6379)
    port = await gate.start()
    gate.black_hole()
    client = connect_redis(f"redis://127.0.0.1:{port}/0", timeout=3600)
    writer = UsageWriter(db, PRICES, journal_dir=journal, flush_interval=3600, sync_before_reply=True)
    admission = QuotaAdmission(RedisStore(client, prefix=prefix), LimitsSource(db), PRICES,
                               on_unavailable="fail_open")
    await held_usage.meter_ended(pipeline(cast(Admission, Announced(admission)), writer), ResponseStore(db),
                                 response_id, ended(response_id))
    print("metered", flush=True)  # not reached: the charge waits for ever


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4], float(sys.argv[5])))
