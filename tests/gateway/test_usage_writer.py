"""The batched usage writer on SQLite and PostgreSQL: batching, idempotency, journal, reports."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest
from sqlalchemy import func, select

from gateway.contracts import UsageRecord
from gateway.db import Database
from gateway.db.models import UsageHourly, UsageRow
from gateway.settings import ConfigError, load_settings
from gateway.usage.journal import MappedJournal
from gateway.usage.pricing import Price, PriceTable
from gateway.usage.report import ReportQuery, usage_report
from gateway.usage.wal import SWITCH_INTERVAL
from gateway.usage.writer import UsageWriter
from tests.gateway.tenancy_fixtures import db  # noqa: F401

PRICES = PriceTable({"m": Price(input_per_million=1.0, output_per_million=2.0)})


def rec(tenant: str = "t1", model: str = "m", **kw: object) -> UsageRecord:
    base: dict[str, object] = dict(
        request_id=uuid.uuid4().hex, key_id="k1", tenant_id=tenant, model=model, deployment="d",
        provider="openai", endpoint="chat.completions", started_at=time.time(), status=200,
        prompt_tokens=10, completion_tokens=5,
    )  # fmt: skip
    base.update(kw)
    return UsageRecord(**base)  # type: ignore[arg-type]


async def count(db: Database, **where: object) -> int:
    async with db.session() as s:
        q = select(func.count()).select_from(UsageRow)
        for k, v in where.items():
            q = q.where(getattr(UsageRow, k) == v)
        return int(await s.scalar(q) or 0)


async def test_batches_are_written_and_costed(db: Database, tmp_path: Path) -> None:
    tenant = uuid.uuid4().hex[:8]
    w = UsageWriter(db, PRICES, journal_dir=tmp_path, batch_size=7, flush_interval=0.05)
    w.start()
    for _ in range(50):
        w.record(rec(tenant))
    await w.aclose()
    assert await count(db, tenant_id=tenant) == 50
    async with db.session() as s:
        cost = await s.scalar(select(func.sum(UsageRow.cost)).where(UsageRow.tenant_id == tenant))
    assert cost == pytest.approx(50 * (10 * 1.0 + 5 * 2.0) / 1e6)


async def test_every_field_arrives_as_recorded(db: Database, tmp_path: Path) -> None:
    """Each column of a row and of its hourly rollup holds the record's value, to the microsecond
    and the last digit (on PostgreSQL the batch goes in as JSON, gateway.usage.pg_bulk: a column out
    of place, a string badly quoted or a number rounded shows here)."""
    tenant = uuid.uuid4().hex[:8]
    started = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)
    odd = 'g/"1",{x}\\n\u00e9\U0001f680'  # quotes, braces, a backslash, accents, an emoji
    full = rec(tenant, deployment=odd, provider="anthropic", endpoint="completions", stream=True,
               prompt_tokens=1234, completion_tokens=567, cached_tokens=89, exact=False, cost=0.1234567890123,
               status=502, error_type="upstream_error", latency_ms=12.345678901, ttft_ms=3.25,
               started_at=started.timestamp(), service_tier="priority", upstream_request_id="req_" + "9" * 124)
    bare = rec(tenant, tenant_id=None, deployment=None, provider=None, ttft_ms=None, started_at=started.timestamp())
    w = UsageWriter(db, PRICES, journal_dir=tmp_path)
    assert sys.getswitchinterval() <= SWITCH_INTERVAL  # the write-ahead thread gets the GIL within it
    for r in (full, bare):
        w.record(r)
    await w.aclose()
    async with db.session() as s:
        rows = {r.request_id: r for r in (await s.scalars(select(UsageRow).where(
            UsageRow.request_id.in_([full.request_id, bare.request_id])))).all()}
        hourly = (await s.scalars(select(UsageHourly).where(UsageHourly.tenant_id == tenant))).all()
    got = rows[full.request_id]
    assert (got.tenant_id, got.key_id, got.model, got.deployment, got.provider, got.endpoint, got.stream) == (
        tenant, "k1", "m", odd, "anthropic", "completions", True)
    assert (got.prompt_tokens, got.completion_tokens, got.cached_tokens, got.exact, got.cost, got.status) == (
        1234, 567, 89, False, 0.1234567890123, 502)
    assert (got.error_type, got.latency_ms, got.ttft_ms, got.started_at, got.service_tier,
            got.upstream_request_id) == ("upstream_error", 12.345678901, 3.25, started, "priority", "req_" + "9" * 124)
    empty = rows[bare.request_id]
    assert (empty.tenant_id, empty.deployment, empty.provider, empty.ttft_ms, empty.error_type,
            empty.service_tier, empty.upstream_request_id) == (None,) * 7
    assert [(h.hour, h.error_type, h.requests, h.errors, h.prompt_tokens, h.cached_tokens, h.cost) for h in hourly] == [
        (started.replace(minute=0, second=0, microsecond=0), "upstream_error", 1, 1, 1234, 89, 0.1234567890123)]


async def test_same_request_id_is_never_doubled(db: Database, tmp_path: Path) -> None:
    tenant = uuid.uuid4().hex[:8]
    records = [rec(tenant) for _ in range(5)]
    w = UsageWriter(db, PRICES, journal_dir=tmp_path)
    for r in records + records:
        w.record(r)
    assert await w.flush()
    for r in records:
        w.record(r)
    assert await w.flush()
    await w.aclose()
    assert await count(db, tenant_id=tenant) == 5


async def test_outage_goes_to_journal_then_replays(db: Database, tmp_path: Path) -> None:
    tenant = uuid.uuid4().hex[:8]
    dead = Database.from_url("postgresql+asyncpg://nobody@127.0.0.1:9/none")  # nothing listens on port 9
    w = UsageWriter(dead, PRICES, journal_dir=tmp_path, max_buffer=4)
    for _ in range(10):
        w.record(rec(tenant))
    assert not await w.flush()
    assert w.pending == 10 and not w.db_healthy
    await w.aclose()  # the process ends with the database still down
    files = list(tmp_path.glob("usage-*.jsonl"))
    assert sum(p.stat().st_size > 0 for p in files) == 1
    await dead.dispose()
    # a later writer (the restarted gateway) finds the orphaned journal and replays it
    w2 = UsageWriter(db, PRICES, journal_dir=tmp_path, flush_interval=0.05)
    w2.start()
    for _ in range(3):
        w2.record(rec(tenant))
    await asyncio.sleep(0.3)
    await w2.aclose()
    assert await count(db, tenant_id=tenant) == 13
    assert not [p for p in tmp_path.glob("usage-*.jsonl") if p.stat().st_size > 0]


async def test_records_spilled_during_a_replay_are_each_sent_once(db: Database, tmp_path: Path) -> None:
    """While the journal's records go to the database, more spill into it (a slow database): the
    next read starts where the last ended, so no record is read and sent again, and the journal
    is emptied once it has caught up."""
    tenant = uuid.uuid4().hex[:8]
    w = UsageWriter(db, PRICES, journal_dir=tmp_path, batch_size=4)
    w.journal.append([rec(tenant) for _ in range(6)])
    sent: list[str] = []
    write = w._write

    async def slow_write(batch: list[UsageRecord]) -> bool:
        sent.extend(r.request_id for r in batch)
        if len(sent) <= 8:  # the first batches: more records spill meanwhile
            w.journal.append([rec(tenant) for _ in range(3)])
        return await write(batch)

    w._write = slow_write  # type: ignore[method-assign]
    assert await w.flush()
    assert len(sent) == len(set(sent)) == 6 + 3 * 2 == await count(db, tenant_id=tenant)  # two spills
    assert w.journal.count == 0 and w.journal.size == 0
    await w.aclose()


async def test_a_journal_line_that_is_no_record_is_kept_not_dropped(
    db: Database, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An orphaned journal (edited by hand, say) with a good record, a line whose value has the
    wrong type, and a last line torn by a crash: the record is written, the bad line moves to the
    quarantine file with the reason, the torn line (no complete record) is let go."""
    tenant = uuid.uuid4().hex[:8]
    good = rec(tenant)
    bad = {**json.loads(msgspec.json.encode(rec(tenant))), "prompt_tokens": "ten"}
    (tmp_path / "usage-1-dead.jsonl").write_bytes(
        msgspec.json.encode(good) + b"\n" + json.dumps(bad).encode() + b"\n" + b'{"request_id": "tor')
    w = UsageWriter(db, PRICES, journal_dir=tmp_path, flush_interval=0.05)
    with caplog.at_level(logging.WARNING, logger="switchyard.usage"):
        w.start()
        await asyncio.sleep(0.3)
        await w.aclose()
    assert await count(db, tenant_id=tenant) == 1
    assert not (tmp_path / "usage-1-dead.jsonl").exists()
    kept = [json.loads(line) for line in (tmp_path / "quarantine.jsonl").read_text().splitlines()]
    assert len(kept) == 1 and json.loads(kept[0]["unreadable_line"]) == bad
    assert "prompt_tokens" in kept[0]["quarantine_reason"]
    assert any("not a usage record" in r.message for r in caplog.records)


async def test_a_journal_keeps_the_upstream_request_id_and_one_written_before_it_still_replays(
        db: Database, tmp_path: Path) -> None:
    """A record's ``upstream_request_id`` goes through the journal (a SQL outage) to its row; a line
    written before records had one (no such key) is still a record: its row has none."""
    tenant = uuid.uuid4().hex[:8]
    new, old = rec(tenant, upstream_request_id="req_abc"), rec(tenant)
    older = json.loads(msgspec.json.encode(old))
    del older["upstream_request_id"]
    dead = Database.from_url("postgresql+asyncpg://nobody@127.0.0.1:9/none")  # nothing listens on port 9
    w = UsageWriter(dead, PRICES, journal_dir=tmp_path)
    w.record(new)
    assert not await w.flush()  # to the journal
    await w.aclose()
    await dead.dispose()
    (tmp_path / "usage-1-old.jsonl").write_bytes(json.dumps(older).encode() + b"\n")
    w2 = UsageWriter(db, PRICES, journal_dir=tmp_path, flush_interval=0.05)
    w2.start()
    await asyncio.sleep(0.3)
    await w2.aclose()
    async with db.session() as s:
        rows = (await s.execute(select(UsageRow.request_id, UsageRow.upstream_request_id)
                                .where(UsageRow.tenant_id == tenant))).all()
    assert dict(rows) == {new.request_id: "req_abc", old.request_id: None}


async def test_a_refused_record_is_quarantined_and_later_batches_go_through(
    db: Database, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tenant = uuid.uuid4().hex[:8]
    w = UsageWriter(db, PRICES, journal_dir=tmp_path, batch_size=4)
    no_key = rec(tenant, key_id=None)  # NOT NULL: refused by both databases
    too_long = rec(tenant, error_type="x" * 100)  # longer than String(64): refused by PostgreSQL, kept by SQLite
    first = [rec(tenant), no_key, rec(tenant), too_long]  # one batch
    for r in first + [rec(tenant) for _ in range(6)]:
        w.record(r)
    with caplog.at_level(logging.ERROR, logger="switchyard.usage"):
        assert await w.flush()  # the batch is not retried forever, and the batches after it are written
    refused = [no_key, too_long] if db.dialect == "postgresql" else [no_key]
    assert w.pending == 0 and w.db_healthy
    assert await count(db, tenant_id=tenant) == 10 - len(refused)
    quarantine = tmp_path / "quarantine.jsonl"
    lines = [json.loads(line) for line in quarantine.read_text().splitlines()]
    assert [line["request_id"] for line in lines] == [r.request_id for r in refused]
    assert all(line["quarantine_reason"] and line["tenant_id"] == tenant for line in lines)
    assert all(r.request_id in caplog.text for r in refused)  # logged by request id
    assert not w.journal.path.stat().st_size  # nothing left in the journal
    async with db.session() as s:  # the rollups count each written row once
        hourly = await s.scalar(select(func.sum(UsageHourly.requests)).where(UsageHourly.tenant_id == tenant))
    assert hourly == 10 - len(refused)

    for r in first:  # the same records again (a replayed journal): nothing doubles, nothing is quarantined twice
        w.record(r)
    assert await w.flush()
    await w.aclose()
    assert await count(db, tenant_id=tenant) == 10 - len(refused)
    assert len(quarantine.read_text().splitlines()) == len(refused)
    async with db.session() as s:
        hourly = await s.scalar(select(func.sum(UsageHourly.requests)).where(UsageHourly.tenant_id == tenant))
    assert hourly == 10 - len(refused)


async def test_report_groups_and_filters(db: Database, tmp_path: Path) -> None:
    a, b = uuid.uuid4().hex[:8], uuid.uuid4().hex[:8]
    w = UsageWriter(db, PRICES, journal_dir=tmp_path)
    day1 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    for i in range(4):
        w.record(rec(a, started_at=day1 + 3600 * i))
    w.record(rec(a, model="other", started_at=day1 + 86400 + 5, status=502, prompt_tokens=0, completion_tokens=0))
    w.record(rec(b, started_at=day1 + 10))
    await w.aclose()
    rows = await usage_report(db, ReportQuery(group_by=("model", "day"), tenant_id=a))
    assert rows == [
        {"model": "m", "day": "2026-01-01", "requests": 4, "errors": 0, "prompt_tokens": 40,
         "completion_tokens": 20, "cached_tokens": 0, "total_tokens": 60, "cost": 0.00008},
        {"model": "other", "day": "2026-01-02", "requests": 1, "errors": 1, "prompt_tokens": 0,
         "completion_tokens": 0, "cached_tokens": 0, "total_tokens": 0, "cost": 0.0},
    ]  # fmt: skip
    only_day2 = ReportQuery(group_by=("tenant",), start=datetime(2026, 1, 2, tzinfo=UTC), tenant_id=a)
    assert [r["requests"] for r in await usage_report(db, only_day2)] == [1]


async def test_shutdown_flushes_the_buffer(db: Database, tmp_path: Path) -> None:
    tenant = uuid.uuid4().hex[:8]
    w = UsageWriter(db, PRICES, journal_dir=tmp_path, flush_interval=3600, batch_size=1000)
    w.start()
    for _ in range(25):
        w.record(rec(tenant))
    await asyncio.sleep(0.05)
    assert await count(db, tenant_id=tenant) == 0  # still buffered: batches, not one INSERT per request
    await w.aclose()
    assert await count(db, tenant_id=tenant) == 25


async def test_memory_stays_bounded_while_the_database_is_down(tmp_path: Path) -> None:
    dead = Database.from_url("postgresql+asyncpg://nobody@127.0.0.1:9/none")
    w = UsageWriter(dead, PRICES, journal_dir=tmp_path, max_buffer=100)
    for _ in range(1000):
        w.record(rec())
    assert w.pending == 1000 and w.journal.count >= 900  # at most max_buffer records in memory
    await w.aclose()
    await dead.dispose()


async def test_config_prices_are_stored_and_stored_prices_used(db: Database, tmp_path: Path) -> None:
    from gateway.db.models import ModelPrice
    from gateway.services import Tenancy
    from gateway.settings import parse_settings

    async with db.session() as s:
        s.add(ModelPrice(model="stored-only", input_per_million=5.0, output_per_million=6.0))
        await s.commit()
    url = db.engine.url.render_as_string(hide_password=False)
    for _ in range(2):  # a second start (another replica) upserts the same rows
        prices = {"m": {"input_per_million": 1, "output_per_million": 2}}
        raw = {"database": {"url": url}, "usage": {"journal_dir": str(tmp_path)}, "prices": prices}
        settings = parse_settings(raw, env={})
        tenancy = Tenancy.from_settings(settings)
        await tenancy.start()
        await tenancy.aclose()
    async with db.session() as s:
        stored = {r.model: (r.input_per_million, r.output_per_million) for r in await s.scalars(select(ModelPrice))}
    assert stored["m"] == (1.0, 2.0) and stored["stored-only"] == (5.0, 6.0)
    assert tenancy.prices.cost("stored-only", 1_000_000, 0) == 5.0


def test_group_priced_per_deployment_reserves_the_highest_price() -> None:
    from gateway.settings import parse_settings

    dep = {"provider": "openai", "model": "x", "api_base": "http://127.0.0.1:9/v1"}
    settings = parse_settings({
        "models": [{"name": "g", "deployments": [dep | {"name": "cheap"}, dep | {"name": "dear"}]}],
        "prices": {"cheap": {"input_per_million": 1, "output_per_million": 2},
                   "dear": {"input_per_million": 3, "output_per_million": 4}},
    }, env={})  # fmt: skip
    table = PriceTable.from_settings(settings)
    assert table.max_per_million("g") == 4.0 and table.cost("g", 1_000_000, 0) == 3.0
    assert table.max_per_million("unpriced") == 0.0


def test_group_priced_itself_reserves_at_its_dearest_deployments_price_too() -> None:
    """A request is priced at its deployment's price when it has one: the group's own price alone
    would reserve too little for the dearer deployment (a service tier of its, here)."""
    from gateway.settings import parse_settings

    dep = {"provider": "openai", "model": "x", "api_base": "http://127.0.0.1:9/v1"}
    settings = parse_settings({
        "models": [{"name": "g", "deployments": [dep | {"name": "plain"}, dep | {"name": "tiered"}]}],
        "prices": {"g": {"input_per_million": 1, "output_per_million": 2},
                   "tiered": {"input_per_million": 1, "output_per_million": 2,
                              "service_tiers": {"priority": {"output_per_million": 7}}}},
    }, env={})  # fmt: skip
    table = PriceTable.from_settings(settings)
    assert table.max_per_million("g") == 7.0
    assert table.cost("g", 1_000_000, 1_000_000) == 3.0  # the group's own prices still cost its records


async def test_a_writer_that_died_is_replayed_from_its_write_ahead_segment(db: Database, tmp_path: Path) -> None:
    """Records synced by a writer that then died are written by the next one; a request it died in
    is recorded from its reservation (incomplete), and a settled request's own record wins."""
    tenant = f"wal-{uuid.uuid4().hex[:8]}"
    dead = UsageWriter(db, PRICES, journal_dir=tmp_path, flush_interval=3600)  # never flushes to SQL
    settled, in_flight = rec(tenant), rec(tenant)
    def reserved(r: UsageRecord) -> UsageRecord:
        return dataclasses.replace(r, status=500, error_type="incomplete", prompt_tokens=70, completion_tokens=30,
                                   extra={"outcome": "incomplete"})

    dead.begin(reserved(settled))
    dead.begin(reserved(in_flight))
    dead.record(settled)
    await dead.sync()  # what the pipeline awaits before a response's last byte
    await dead.wal.aclose()
    for journal in (dead.wal.segment, dead.journal):  # the process is gone: locks free, nothing cleaned up
        if isinstance(journal, MappedJournal):
            journal._map.close()  # the mapping holds a descriptor of the file, and so its lock
        journal._file.close()
    heir = UsageWriter(db, PRICES, journal_dir=tmp_path)
    heir.start()
    await heir.aclose()
    async with db.session() as s:
        rows = {r.request_id: r for r in (await s.scalars(select(UsageRow).where(UsageRow.tenant_id == tenant)))}
    assert set(rows) == {settled.request_id, in_flight.request_id}
    assert rows[settled.request_id].status == settled.status and rows[settled.request_id].error_type is None
    lost = rows[in_flight.request_id]
    assert (lost.status, lost.error_type, lost.prompt_tokens, lost.completion_tokens) == (500, "incomplete", 70, 30)
    assert not list(tmp_path.glob("usage-*.jsonl"))  # replayed files are gone


@pytest.mark.parametrize("sync_before_reply", [True, False])
async def test_sync_waits_for_the_fsync_only_when_asked_to(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync_before_reply: bool
) -> None:
    """With ``sync_before_reply`` the reply's wait ends once the record is fsynced; without, there is
    nothing to wait for (the write-ahead thread fsyncs within its interval)."""
    fsyncs: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: fsyncs.append(fd) or real(fd))
    w = UsageWriter(db, PRICES, journal_dir=tmp_path, flush_interval=3600, sync_before_reply=sync_before_reply,
                    fsync_interval=3600)  # no fsync but the one a reply may wait for
    w.record(rec())
    waited = w.sync()
    if sync_before_reply:
        await asyncio.wait_for(waited, 5)
        assert fsyncs == [w.wal.segment._fd]
    else:
        assert isinstance(waited, asyncio.Future) and waited.done()
        await waited
        assert fsyncs == []
    await w.aclose()


async def test_records_are_fsynced_within_the_configured_interval(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``usage.fsync_interval_ms`` (here 400) sets when the write-ahead thread fsyncs a record."""
    fsyncs: list[float] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: fsyncs.append(time.monotonic()) or real(fd))
    interval = load_settings(env={"SWITCHYARD__USAGE__FSYNC_INTERVAL_MS": "400"}).usage.fsync_interval_ms / 1000
    w = UsageWriter(db, PRICES, journal_dir=tmp_path, flush_interval=3600, fsync_interval=interval)
    started = time.monotonic()
    w.record(rec())
    while not fsyncs and time.monotonic() - started < 5:
        await asyncio.sleep(0.01)
    assert fsyncs and 0.35 <= fsyncs[0] - started < 2
    await w.aclose()
    with pytest.raises(ConfigError, match="fsync_interval_ms"):
        load_settings(env={"SWITCHYARD__USAGE__FSYNC_INTERVAL_MS": "0"})
