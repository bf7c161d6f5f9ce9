"""A replica's quota admission (fail-open) and usage writer, reaching the local Redis through a
``TcpGate`` the test can black-hole: a network partition between that replica and Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from gateway.db import Database
from gateway.quotas.admission import QuotaAdmission
from gateway.quotas.limits import LimitsSource
from gateway.quotas.redis_store import RedisStore, connect_redis
from gateway.usage.pricing import PriceTable
from gateway.usage.writer import UsageWriter
from tests.support.tcp_gate import TcpGate


@dataclass
class GatedReplica:
    gate: TcpGate
    admission: QuotaAdmission
    writer: UsageWriter  # written only when flushed


@asynccontextmanager
async def gated_replica(db: Database, prefix: str, prices: PriceTable, journal: Path,
                        redis_timeout: float) -> AsyncIterator[GatedReplica]:
    gate = TcpGate("127.0.0.1", 6379)
    port = await gate.start()
    client = connect_redis(f"redis://127.0.0.1:{port}/0", timeout=redis_timeout)
    writer = UsageWriter(db, prices, journal_dir=journal, flush_interval=3600)
    admission = QuotaAdmission(RedisStore(client, prefix=prefix), LimitsSource(db), prices,
                               on_unavailable="fail_open", flush_records=writer.flush)
    try:
        yield GatedReplica(gate, admission, writer)
    finally:
        gate.reopen()
        await admission.aclose()
        await writer.aclose()
        await client.aclose()
        await gate.aclose()
