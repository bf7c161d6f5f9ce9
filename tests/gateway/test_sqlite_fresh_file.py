"""Several processes opening one fresh SQLite file at once (two CLI commands, workers starting):
switching a new file to WAL needs a lock SQLite's busy timeout does not wait for, so all but one
could get "database is locked" at connect time (seen in CI: ``switchyard tenant list`` beside
``switchyard db wait``). ``sqlite_pragmas`` is what every connection of ours runs first."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path
from typing import Any

from gateway.db.engine import sqlite_pragmas

PROCESSES = 3
ROUNDS = 60  # before the fix, about 4 rounds in 10 had a process fail


def _open(path: str, barrier: Any) -> str | None:
    barrier.wait()  # each process at its first connection, at once
    try:
        conn = sqlite3.connect(path, timeout=30)  # as the engine connects (connect_args)
        try:
            sqlite_pragmas(conn)
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            return None if mode == "wal" else f"journal mode {mode}"
        finally:
            conn.close()
    except Exception as exc:  # what the test reports
        return repr(exc)


def test_processes_opening_a_fresh_file_at_once_all_connect_in_wal(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    failures: list[str] = []
    with ctx.Manager() as manager, ctx.Pool(PROCESSES) as pool:
        for i in range(ROUNDS):
            barrier = manager.Barrier(PROCESSES)
            path = str(tmp_path / f"fresh{i}.db")
            failures += [f for f in pool.starmap(_open, [(path, barrier)] * PROCESSES) if f]
    assert failures == []
