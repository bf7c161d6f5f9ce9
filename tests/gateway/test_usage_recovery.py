"""The usage writer recovering what writers that were killed left behind, through real faults: a
writer process SIGKILLed, a PostgreSQL database taken away and given back."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from sqlalchemy import select

from gateway.db import Database, migrate
from gateway.db.models import UsageRow
from gateway.usage.journal import Journal, MappedJournal, read_records
from gateway.usage.pricing import Price, PriceTable
from gateway.usage.writer import UsageWriter
from tests.gateway.tenancy_fixtures import drop_pg_database, new_pg_database, pg_admin

PRICES = PriceTable({"m": Price(input_per_million=1.0, output_per_million=2.0)})

# A writer process that settles five requests, begins a sixth, and waits to be killed (it never
# flushes to SQL: its records are in its write-ahead segment alone).
DYING_WRITER = """
import asyncio, dataclasses, sys, time
from pathlib import Path
from gateway.contracts import UsageRecord
from gateway.db import Database
from gateway.usage.pricing import PriceTable
from gateway.usage.writer import UsageWriter

async def main() -> None:
    tenant, journal = sys.argv[1], Path(sys.argv[2])
    w = UsageWriter(Database.from_url("sqlite+aiosqlite://"), PriceTable({}), journal_dir=journal,
                    flush_interval=3600)
    def rec(i: int, **kw: object) -> UsageRecord:
        base: dict[str, object] = dict(request_id=f"{tenant}-{i}", key_id="k", tenant_id=tenant, model="m",
                                       deployment="d", provider="openai", endpoint="chat.completions",
                                       started_at=time.time(), status=200, prompt_tokens=10, completion_tokens=5)
        return UsageRecord(**(base | kw))  # type: ignore[arg-type]
    for i in range(6):
        w.begin(rec(i, status=500, error_type="incomplete", prompt_tokens=70, completion_tokens=30,
                    extra={"outcome": "incomplete"}))
    for i in range(5):
        w.record(rec(i))
    await w.wal.sync()
    print("ready", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def killed_writer(tenant: str, journal: Path) -> None:
    """Run ``DYING_WRITER`` until its records are on disk, then SIGKILL it."""
    proc = subprocess.Popen([sys.executable, "-c", DYING_WRITER, tenant, str(journal)], stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


@asynccontextmanager
async def migrated_pg() -> AsyncIterator[tuple[str, Database]]:
    """A private, migrated PostgreSQL database (never the shared one): (its name, a Database)."""
    name, url = await new_pg_database()
    await asyncio.to_thread(migrate.upgrade, url)
    db = Database.from_url(url)
    try:
        yield name, db
    finally:
        await db.dispose()
        await drop_pg_database(name)


async def take_away(name: str) -> None:
    """Cut every connection to database ``name`` and keep new ones out (renamed) until ``give_back``."""
    conn = await pg_admin()
    try:
        for _ in range(200):  # a client may reconnect in between; retry until the rename wins the race
            await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name)
            try:
                await conn.execute(f'ALTER DATABASE "{name}" RENAME TO "{name}_away"')
                return
            except Exception:
                await asyncio.sleep(0.01)
        raise AssertionError("could not take the database away")
    finally:
        await conn.close()


async def give_back(name: str) -> None:
    conn = await pg_admin()
    try:
        await conn.execute(f'ALTER DATABASE "{name}_away" RENAME TO "{name}"')
    finally:
        await conn.close()


async def rows_of(db: Database, tenant: str) -> dict[str, UsageRow]:
    async with db.session() as s:
        return {r.request_id: r for r in await s.scalars(select(UsageRow).where(UsageRow.tenant_id == tenant))}


async def test_a_killed_writers_segment_is_replayed_once_a_database_down_at_start_is_back(tmp_path: Path) -> None:
    """A worker SIGKILLed, its replacement started while PostgreSQL is down: the dead writer's
    records are written once the database is back, not left on disk until the next restart."""
    tenant = f"orphan-{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(killed_writer, tenant, tmp_path)
    assert list(tmp_path.glob("usage-*.jsonl"))
    async with migrated_pg() as (name, db):
        await take_away(name)
        heir = UsageWriter(db, PRICES, journal_dir=tmp_path, flush_interval=0.05, retry_interval=0.1)
        try:
            heir.start()
            await asyncio.sleep(0.5)  # its replay at start failed: the database is away
            await give_back(name)
            deadline = time.monotonic() + 10
            while len(rows := await rows_of(db, tenant)) < 6 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        finally:
            await heir.aclose()
        rows = await rows_of(db, tenant)
    assert sorted(rows) == [f"{tenant}-{i}" for i in range(6)]
    settled = [rows[f"{tenant}-{i}"] for i in range(5)]
    assert all((r.status, r.error_type, r.prompt_tokens, r.completion_tokens) == (200, None, 10, 5) for r in settled)
    lost = rows[f"{tenant}-5"]
    assert (lost.status, lost.error_type, lost.prompt_tokens, lost.completion_tokens) == (500, "incomplete", 70, 30)
    assert not list(tmp_path.glob("usage-*.jsonl"))  # replayed files are gone


@pytest.mark.parametrize("kind", [Journal, MappedJournal])
def test_a_journal_being_created_is_never_taken_for_a_dead_writers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: type[Journal]
) -> None:
    """Workers start at once: one looks for orphaned files while another has just created its own
    and not yet locked it. That file must not be found (it would be replayed and deleted under
    its owner, whose records would then go to a file no one can find after a crash)."""
    sibling = Journal(tmp_path)
    real, seen = fcntl.flock, list[list[Path] | None]()

    def racing(fd: int, op: int) -> None:  # the sibling looks just before the new file is locked
        if op == fcntl.LOCK_EX | fcntl.LOCK_NB and not seen:
            seen.append(None)  # once: ``orphans`` locks too
            seen[0] = sibling.orphans()
        real(fd, op)

    monkeypatch.setattr(fcntl, "flock", racing)
    created = kind(tmp_path)
    monkeypatch.setattr(fcntl, "flock", real)
    assert seen == [[]]
    assert created.path.exists() and created.path not in sibling.orphans()
    created.close(remove_if_empty=False)
    assert created.path in sibling.orphans()  # once its writer is gone, it is found
    sibling.close()


# A writer process whose files may not grow past 4 KiB (a full disk: every write past it fails
# with EFBIG), recording 400 requests while the database is away; it serves until SIGTERM, then
# closes its writer (the database may still be away) and exits.
FULL_DISK_WRITER = """
import asyncio, resource, signal, sys, time
from pathlib import Path
from gateway.contracts import UsageRecord
from gateway.db import Database
from gateway.usage.pricing import PriceTable
from gateway.usage.writer import UsageWriter

async def main() -> None:
    tenant, journal, url = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 12, 1 << 12))
    w = UsageWriter(Database.from_url(url), PriceTable({}), journal_dir=journal, flush_interval=0.05,
                    retry_interval=0.1)
    w.start()
    for i in range(400):
        w.record(UsageRecord(request_id=f"{tenant}-{i}", key_id="k", tenant_id=tenant, model="m", deployment="d",
                             provider="openai", endpoint="chat.completions", started_at=time.time(), status=200,
                             prompt_tokens=10, completion_tokens=5))
        if i % 50 == 49:
            await asyncio.sleep(0.15)  # flushes fail meanwhile: their batches go to the journal
    print("recorded", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await w.aclose(timeout=1)

asyncio.run(main())
"""


async def full_disk_writer(tenant: str, journal: Path, url: str) -> asyncio.subprocess.Process:
    """``FULL_DISK_WRITER``, once it has recorded its requests."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", FULL_DISK_WRITER, tenant, str(journal), url, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert proc.stdout is not None and await asyncio.wait_for(proc.stdout.readline(), 30) == b"recorded\n"
    return proc


async def test_a_full_disk_while_the_database_is_down_loses_nothing_and_stops_nothing(tmp_path: Path) -> None:
    """PostgreSQL away and the journal's disk full: the records the journal cannot take stay in
    memory, and the writer keeps going, so every one is written once the database is back (not
    left to a restart, not lost)."""
    tenant = f"full-{uuid.uuid4().hex[:8]}"
    async with migrated_pg() as (name, db):
        url = db.engine.url.render_as_string(hide_password=False)
        await take_away(name)
        proc = await full_disk_writer(tenant, tmp_path, url)
        try:
            await asyncio.sleep(0.3)
            assert proc.returncode is None
            await give_back(name)
            deadline = time.monotonic() + 10
            while len(await rows_of(db, tenant)) < 400 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert sorted(await rows_of(db, tenant)) == sorted(f"{tenant}-{i}" for i in range(400))
        finally:
            proc.kill()
            await proc.wait()


async def test_a_writer_stopped_with_a_full_disk_and_the_database_down_leaves_its_records_to_the_next(
    tmp_path: Path,
) -> None:
    """SIGTERM while PostgreSQL is away and the journal's disk is full: the writer closes cleanly,
    the records the disk holds stay there (the write-ahead segments of those the journal refused
    are not deleted at exit), and the next writer writes every one of them once the database is
    back. (Records the full disk took nowhere are in memory alone: the exit loses them.)"""
    tenant = f"stop-{uuid.uuid4().hex[:8]}"
    async with migrated_pg() as (name, db):
        url = db.engine.url.render_as_string(hide_password=False)
        await take_away(name)
        proc = await full_disk_writer(tenant, tmp_path, url)
        try:
            await asyncio.sleep(0.3)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 15) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        on_disk = {r.request_id for path in tmp_path.glob("usage-*.jsonl") for r in read_records(path)}
        assert len(on_disk) >= 10
        await give_back(name)
        heir = UsageWriter(db, PRICES, journal_dir=tmp_path, flush_interval=0.05)
        heir.start()
        await heir.aclose()
        assert on_disk <= set(await rows_of(db, tenant))
    assert not list(tmp_path.glob("usage-*.jsonl"))
