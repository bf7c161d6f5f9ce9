"""The write-ahead segment: written before ``add`` returns, fsynced by its thread."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest

from gateway.contracts import UsageRecord
from gateway.usage.journal import Journal, MappedJournal, read_records
from gateway.usage.wal import WriteAhead


def rec() -> UsageRecord:
    return UsageRecord(request_id=uuid.uuid4().hex, key_id="k1", tenant_id="t1", model="m", deployment="d",
                       provider="openai", endpoint="chat.completions", started_at=time.time(), status=200,
                       prompt_tokens=10, completion_tokens=5)


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The file descriptors fsynced, in order."""
    seen: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        seen.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


async def test_a_record_is_in_the_file_when_add_returns(tmp_path: Path) -> None:
    """Nothing to await: a process killed right after ``add`` has the record in its segment."""
    wal = WriteAhead(tmp_path, sync_interval=3600)
    records = [rec(), rec()]
    for r in records:
        wal.add(r)
    assert read_records(wal.segment.path) == records
    await wal.aclose()


async def test_sync_returns_once_the_segment_is_fsynced(tmp_path: Path, fsyncs: list[int]) -> None:
    wal = WriteAhead(tmp_path, sync_interval=3600)  # no fsync but the one a waiter asks for
    wal.add(rec())
    await asyncio.wait_for(wal.sync(), 5)
    assert fsyncs == [wal.segment._fd]
    await wal.aclose()


async def test_unsynced_writes_are_fsynced_within_the_interval(tmp_path: Path, fsyncs: list[int]) -> None:
    wal = WriteAhead(tmp_path, sync_interval=0.05)
    for _ in range(3):
        wal.add(rec())
    deadline = time.monotonic() + 5
    while not fsyncs and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert fsyncs == [wal.segment._fd]  # one fsync for the three writes
    await asyncio.sleep(0.2)
    assert len(fsyncs) == 1  # nothing written since: nothing to fsync
    await wal.aclose()


async def test_a_write_after_the_thread_took_its_segment_is_fsynced_again(tmp_path: Path, fsyncs: list[int]) -> None:
    """The lock-free path (the segment already listed for the thread) never skips a write the
    thread's last fsync may have missed: once the thread takes the list, the next write lists it again."""
    wal = WriteAhead(tmp_path, sync_interval=0.02)
    for round_ in range(1, 4):
        wal.add(rec())
        wal.add(rec())  # already listed: no lock
        deadline = time.monotonic() + 5
        while len(fsyncs) < round_ and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert fsyncs == [wal.segment._fd] * round_
    await wal.aclose()


async def test_rotate_keeps_the_old_records_and_carries_the_given_ones(tmp_path: Path, fsyncs: list[int]) -> None:
    wal = WriteAhead(tmp_path, sync_interval=3600)
    settled, in_flight = rec(), rec()
    wal.add(in_flight)
    wal.add(settled)
    retired = wal.rotate([in_flight])
    assert read_records(retired.path) == [in_flight, settled]
    assert read_records(wal.segment.path) == [in_flight]
    await wal.sync()
    assert sorted(fsyncs) == sorted([retired._fd, wal.segment._fd])  # a waiter needs both on disk
    retired.discard()
    await wal.aclose()


@pytest.mark.parametrize("segment", ["mapped", "written"])
async def test_a_disk_that_refuses_a_write_is_logged_once_and_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, segment: str
) -> None:
    wal = WriteAhead(tmp_path, sync_interval=3600)
    assert isinstance(wal.segment, MappedJournal)
    wal.segment.discard()
    # a mapped segment meets the refusal when it grows (each record here outgrows 64 bytes)
    wal.segment = MappedJournal(tmp_path, size=64) if segment == "mapped" else Journal(tmp_path)
    first = rec()
    wal.add(first)
    segment_fd = os.dup(wal.segment._fd)
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, wal.segment._fd)  # the segment's descriptor now refuses every write and allocation
    for _ in range(3):
        wal.add(rec())
    assert sum("write-ahead segment failed" in m for m in caplog.messages) == 1
    os.dup2(segment_fd, wal.segment._fd)
    for fd in (full, segment_fd):
        os.close(fd)
    written = rec()
    wal.add(written)
    assert "the usage write-ahead segment is written again" in caplog.messages
    assert read_records(wal.segment.path) == [first, written]  # whole lines only
    await wal.aclose()


def test_a_mapped_segment_reads_back_whole_records_only(tmp_path: Path) -> None:
    """Past a mapped segment's records its file holds zeros (and, after a process killed mid-copy,
    part of a line): a reader takes the whole records; ``close`` cuts the file to them."""
    segment = MappedJournal(tmp_path, size=256)
    records = [rec() for _ in range(3)]  # each outgrows the size before: the file grows
    for r in records:
        segment.append_one(r)
    whole = segment._size
    torn = b'{"request_id": "tor'  # a copy cut short by a SIGKILL
    segment._map[whole : whole + len(torn)] = torn
    assert read_records(segment.path) == records
    assert os.path.getsize(segment.path) > whole
    segment.close(remove_if_empty=False)
    assert os.path.getsize(segment.path) == whole and read_records(segment.path) == records


def test_a_segment_the_previous_version_wrote_still_reads(tmp_path: Path) -> None:
    """Before ``cost`` could be None (not priced yet), every record was written priced: a line of
    that version reads back with its cost, a free answer's 0.0 included."""
    path = tmp_path / "usage-1-abcdef.jsonl"
    line = ('{"request_id":"r%d","key_id":"k","tenant_id":null,"model":"m","deployment":"d","provider":"openai",'
            '"endpoint":"chat.completions","started_at":1700000000.0,"status":200,"prompt_tokens":10,'
            '"completion_tokens":5,"cached_tokens":0,"exact":true,"cost":%s,"error_type":null,"latency_ms":1.0,'
            '"ttft_ms":null,"stream":false,"service_tier":null,"upstream_request_id":null,"extra":{}}\n')
    path.write_text(line % (1, "0.0") + line % (2, "0.25"))
    assert [(r.request_id, r.cost) for r in read_records(path)] == [("r1", 0.0), ("r2", 0.25)]
    assert read_records(path)[0].cost is not None  # priced: replay never prices it again
