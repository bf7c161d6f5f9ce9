"""A local append-only journal of usage records the database could not take yet.

Each writer process appends JSON lines to its own file, holding an exclusive ``flock`` on it.
Files whose lock can be taken belong to a process that is gone; any writer may replay those.
Replays are safe to repeat: inserts are idempotent by request_id.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO

import msgspec

from gateway.contracts import UsageRecord

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(UsageRecord)


def read_records(path: Path) -> list[UsageRecord]:
    """Every complete record in a journal file (a torn last line from a crash is skipped)."""
    out: list[UsageRecord] = []
    with path.open("rb") as f:
        for line in f:
            try:
                out.append(_decoder.decode(line))
            except msgspec.DecodeError:
                continue
    return out


class Journal:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"usage-{os.getpid()}-{os.urandom(3).hex()}.jsonl"
        self._file: IO[bytes] = self.path.open("ab")
        fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.count = 0  # records appended and not yet truncated away

    def append(self, records: Iterable[UsageRecord]) -> None:
        data = b"".join(_encoder.encode(r) + b"\n" for r in records)
        if not data:
            return
        self._file.write(data)
        self._file.flush()
        os.fsync(self._file.fileno())
        self.count += data.count(b"\n")

    def read(self) -> list[UsageRecord]:
        return read_records(self.path)

    def truncate(self) -> None:
        self._file.truncate(0)
        self._file.flush()
        os.fsync(self._file.fileno())
        self.count = 0

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

    def close(self, *, remove_if_empty: bool = True) -> None:
        empty = self.count == 0 and self.path.stat().st_size == 0
        self._file.close()
        if remove_if_empty and empty:
            self.path.unlink(missing_ok=True)
