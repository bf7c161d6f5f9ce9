"""The audit writer at a worker's shutdown while another worker holds SQLite's write lock: the
events it is writing land in the database, and the shutdown does not wait out the busy timeout."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from gateway.auth.audit import AuditLog, list_events
from gateway.contracts import Principal
from gateway.db import migrate
from gateway.db.engine import Database


async def test_a_shutdown_while_the_writer_waits_for_the_lock_writes_its_events(tmp_path: Path) -> None:
    """The writer used to be cancelled mid-insert: its connection, closed under a statement still
    running, kept the write lock, so the last flush waited 30 s for it and gave up, the events
    going to a spill file instead of the table."""
    path = tmp_path / "audit.db"
    url = f"sqlite+aiosqlite:///{path}"
    await asyncio.to_thread(migrate.upgrade, url)
    db = Database.from_url(url)
    spill = tmp_path / "journal"
    audit = AuditLog(db, flush_every=0.05, spill_dir=spill)
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)  # another worker
    try:
        audit.start()
        await asyncio.sleep(0.2)  # the writer has run once: its connection is open
        other.execute("BEGIN IMMEDIATE")  # the other worker writes
        for client in ("10.0.0.1", "10.0.0.2"):
            audit.record("key_used", client=client, surface="api", principal=Principal(key_id="k", tenant_id="t"))
        await asyncio.sleep(0.3)  # the writer's insert waits for the lock
        closing = asyncio.create_task(audit.aclose(timeout=20))
        await asyncio.sleep(0.3)
        other.execute("COMMIT")  # the other worker is done
        await asyncio.wait_for(closing, 60)
        assert sorted(r["client"] for r in await list_events(db)) == ["10.0.0.1", "10.0.0.2"]
        assert not spill.exists() or list(spill.iterdir()) == []
    finally:
        other.close()
        await db.dispose()
