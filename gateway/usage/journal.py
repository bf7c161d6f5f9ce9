"""A local append-only journal of usage records the database could not take yet.

Each writer process appends JSON lines to its own file, holding an exclusive ``flock`` on it.
Files whose lock can be taken belong to a process that is gone; any writer may replay those.
Replays are safe to repeat: inserts are idempotent by request_id.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import msgspec

from gateway.contracts import UsageRecord

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(UsageRecord)


def read_records(path: Path, on_unreadable: Callable[[bytes, str], None] | None = None, *,
                 start: int = 0) -> list[UsageRecord]:
    """Every record in a journal file. A complete line that is not a usage record (say, a value of
    the wrong type in a file edited by hand) goes to ``on_unreadable`` with the reason, so that a
    replay can set it aside instead of dropping it; a last line with no newline is a write torn by
    a crash and holds no complete record, and so is one cut short by the zeros after a mapped
    segment's records (``MappedJournal``)."""
    out: list[UsageRecord] = []
    with path.open("rb") as f:
        f.seek(start)
        for line in f:
            if (end := line.find(b"\0")) >= 0:  # a mapped segment's unwritten rest (JSON has no NUL)
                line = line[:end]
                if not line:
                    break
            try:
                out.append(_decoder.decode(line))
            except msgspec.DecodeError as exc:
                if on_unreadable is not None and line.endswith(b"\n") and line.strip():
                    on_unreadable(line.rstrip(b"\n"), str(exc))
            if end >= 0:
                break
    return out


def _create_locked(directory: Path, mode: str) -> tuple[Path, IO[bytes]]:
    """A new journal file, opened in ``mode`` and locked before it has the name ``orphans`` looks
    for: a writer starting beside this one (every worker starts at once) never finds it unlocked,
    takes it for a dead writer's and deletes it under its owner."""
    name = f"usage-{os.getpid()}-{os.urandom(3).hex()}.jsonl"
    fresh = directory / f".{name}.new"
    file = fresh.open(mode, buffering=0)
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        fresh.rename(directory / name)
    except BaseException:
        file.close()
        fresh.unlink(missing_ok=True)
        raise
    return directory / name, file


class Journal:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.path, self._file = _create_locked(directory, "ab")  # each append is its own write call
        self._fd = self._file.fileno()
        self.count = 0  # records appended and not yet truncated away
        self._size = 0  # bytes of whole lines in the file

    def append(self, records: Iterable[UsageRecord], *, fsync: bool = True) -> None:
        """Write ``records`` through to the file, in one ``write`` call (a process crash loses none
        of them); ``fsync`` also waits until the disk holds them (``sync`` does that later for
        several appends, from any thread)."""
        data = b"".join(_encoder.encode(r) + b"\n" for r in records)
        if data:
            self.write_lines(data, data.count(b"\n"))
            if fsync:
                os.fsync(self._fd)

    def append_one(self, record: UsageRecord) -> None:
        """``append([record], fsync=False)``, for the write-ahead segment's one record a call."""
        self.write_lines(_encoder.encode(record) + b"\n", 1)

    def write_lines(self, data: bytes, lines: int) -> None:
        """Write ``lines`` whole lines, ``data``, in one ``write`` call; a write the disk refuses
        leaves none of them."""
        try:
            written = os.write(self._fd, data)
            while written < len(data):  # a short write only comes with a full disk, whose next call raises
                written += os.write(self._fd, data[written:])
        except OSError:
            with contextlib.suppress(OSError):  # never leave a torn line for the next append to follow
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)
        self.count += lines

    def sync(self) -> None:
        """Fsync what was written (from any thread). A journal closed meanwhile (discarded once its
        records were safe elsewhere) has nothing left to keep."""
        if self._file.closed:
            return
        try:
            os.fsync(self._fd)
        except OSError:
            if not self._file.closed:
                raise

    @property
    def size(self) -> int:
        """Bytes of the whole lines written (an offset ``read`` can start at)."""
        return self._size

    def read(self, on_unreadable: Callable[[bytes, str], None] | None = None, *,
             start: int = 0) -> list[UsageRecord]:
        """The records from byte ``start`` (the start of a line) on."""
        return read_records(self.path, on_unreadable, start=start)

    def truncate(self) -> None:
        os.ftruncate(self._fd, 0)
        os.fsync(self._fd)
        self.count = self._size = 0

    def orphans(self) -> list[Path]:
        """Journal files of writers that are gone (their lock is free)."""
        found = []
        for path in sorted(self.directory.glob("usage-*.jsonl")):
            if path == self.path:
                continue
            try:
                with path.open("rb") as f:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            except (BlockingIOError, FileNotFoundError):
                continue
            found.append(path)
        return found

    def discard(self) -> None:
        """Close and delete the file (its records are safe elsewhere)."""
        self._file.close()
        self.path.unlink(missing_ok=True)

    def close(self, *, remove_if_empty: bool = True) -> None:
        empty = self.count == 0 and self.path.stat().st_size == 0
        self._file.close()
        if remove_if_empty and empty:
            self.path.unlink(missing_ok=True)


class MappedJournal(Journal):
    """A write-ahead segment written through a shared memory mapping of its file.

    An append is a copy into the page cache: no system call and no update of the file's times per
    record (a ``write`` here took 1.2 µs alone and 8-10 µs while the fsync thread worked on the same
    file), and as safe against a killed process as a ``write``, since the pages are the kernel's.
    The file is allocated ahead (``posix_fallocate``), so that a copy never meets a full disk (which
    would end the process with SIGBUS); growing it allocates first and raises OSError as a failed
    write does, before any byte is copied. Past the records the file holds zeros, until ``close``
    cuts them off; ``read_records`` stops at the first.
    """

    def __init__(self, directory: Path, *, size: int = 1 << 20) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.path, self._file = _create_locked(directory, "xb+")
        self._fd = self._file.fileno()
        self.count = 0
        self._size = 0
        try:
            os.posix_fallocate(self._fd, 0, size)
            self._map = mmap.mmap(self._fd, size)
        except BaseException:
            self.discard()
            raise

    def write_lines(self, data: bytes, lines: int) -> None:
        end = self._size + len(data)
        if end > len(self._map):
            size = max(end, 2 * len(self._map))
            os.posix_fallocate(self._fd, 0, size)
            self._map.resize(size)
        self._map[self._size : end] = data
        self._size = end
        self.count += lines

    def truncate(self) -> None:
        self._map[: self._size] = bytes(self._size)
        os.fsync(self._fd)
        self.count = self._size = 0

    def discard(self) -> None:
        if hasattr(self, "_map"):
            self._map.close()
        super().discard()

    def close(self, *, remove_if_empty: bool = True) -> None:
        self._map.close()
        os.ftruncate(self._fd, self._size)  # the zeros past the records go
        self._file.close()
        if remove_if_empty and self.count == 0 and self._size == 0:
            self.path.unlink(missing_ok=True)


class Quarantine:
    """Records the database refused for their own values (a constraint violation, a value too long
    or out of range), set aside so the records after them are written. One file per journal folder,
    ``quarantine.jsonl``: each line is a usage record plus ``quarantine_reason`` and
    ``quarantined_at`` (a journal line that was not a record at all is kept as text under
    ``unreadable_line``). Nothing replays it (it would fail again); once the data or the schema is
    fixed, renaming it ``usage-<anything>.jsonl`` lets a writer replay it like an orphaned journal
    (the extra fields are ignored, and rows already written are skipped by request id).
    """

    NAME = "quarantine.jsonl"

    def __init__(self, directory: Path) -> None:
        self.path = directory / self.NAME
        self._ids: set[str] | None = None  # request ids already in the file (read on first use)

    def add(self, record: UsageRecord, reason: str) -> bool:
        """Append ``record`` (durably); False when its request id is already there."""
        ids = self._known()
        if record.request_id in ids:
            return False
        stamp = {"quarantine_reason": reason, "quarantined_at": datetime.now(UTC).isoformat()}
        try:
            line = _encoder.encode(msgspec.to_builtins(record) | stamp)
        except (TypeError, ValueError, OverflowError):  # a value JSON cannot hold: keep what can be kept
            line = _encoder.encode({"request_id": str(record.request_id), "record": repr(record)} | stamp)
        with self.path.open("ab") as f:  # one write per line, O_APPEND: lines from several processes do not mix
            f.write(line + b"\n")
            f.flush()
            os.fsync(f.fileno())
        ids.add(record.request_id)
        return True

    def add_unreadable(self, line: bytes, reason: str) -> None:
        """Keep a journal line that is not a usage record, as text, with why it was refused."""
        entry = {"unreadable_line": line.decode("utf-8", "replace"), "quarantine_reason": reason,
                 "quarantined_at": datetime.now(UTC).isoformat()}
        with self.path.open("ab") as f:
            f.write(_encoder.encode(entry) + b"\n")
            f.flush()
            os.fsync(f.fileno())

    def _known(self) -> set[str]:
        if self._ids is None:
            self._ids = set()
            if self.path.exists():
                with self.path.open("rb") as f:
                    for line in f:
                        try:
                            self._ids.add(str(msgspec.json.decode(line)["request_id"]))
                        except (msgspec.DecodeError, KeyError, TypeError):
                            continue
        return self._ids
