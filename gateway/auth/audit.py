"""The audit trail of authentication: sign-ins, sign-outs, failures and key use, with who, when and
from where, in the ``auth_events`` table the admin reads (``GET /admin/v1/audit``,
``switchyard admin audit``).

Events are buffered in process and written in batches every second, off the request path. At
shutdown, events the database does not take in time are kept in a file in ``spill_dir`` (the usage
journal's folder), which the next process to start on that folder takes up (``audit-*.jsonl``,
claimed by renaming, so one process takes each). Key use is recorded once per key and client
address per ``key_use_interval`` (per process), so a busy key writes a row an hour per address, not
a row per request; of the pairs seen within the interval the newest ``MAX_SEEN`` are remembered
(one forgotten sooner is recorded again sooner: a row more, never one less). Failures are bounded by the throttle; if
the database is down, the buffer keeps the newest ``max_buffer`` events and counts what it drops.
Client addresses are stored as printable ASCII only (a proxy's header could carry anything).
Events older than ``retention`` seconds are deleted by the writer, once an hour.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import msgspec
from sqlalchemy import delete, insert, select

from gateway.background import Stopping
from gateway.contracts import Principal
from gateway.db.engine import Database
from gateway.db.errors import is_unavailable
from gateway.db.models import AuthEvent

log = logging.getLogger("switchyard.audit")

Event = Literal["key_used", "key_failed", "login", "login_failed", "logout"]
EVENTS: tuple[str, ...] = ("key_used", "key_failed", "login", "login_failed", "logout")
Surface = Literal["api", "admin", "dashboard"]
_CLIENT_CHARS = 64
_UNPRINTABLE = re.compile(r"[^\x21-\x7e]")
_PRUNE_EVERY = 3600.0
MAX_SEEN = 100_000  # (key, client address) pairs whose last recorded use is remembered


class AuditEntry(msgspec.Struct, frozen=True):
    """One event, as buffered, inserted and kept in a spill file."""

    at: datetime
    event: str
    client: str
    surface: str
    key_id: str | None = None
    tenant_id: str | None = None
    key_prefix: str | None = None


class AuditLog:
    def __init__(self, db: Database, *, key_use_interval: float = 3600.0, retention: float = 90 * 86400.0,
                 max_buffer: int = 10_000, flush_every: float = 1.0, spill_dir: Path | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.db = db
        self._clock = clock
        self.spill_dir = spill_dir
        self.key_use_interval = key_use_interval
        self.retention = retention
        self.flush_every = flush_every
        self.dropped = 0
        self._buffer: deque[AuditEntry] = deque(maxlen=max_buffer)
        # (key id, client) -> when its use was last recorded, oldest first
        self._seen: dict[tuple[str, str], float] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopping = Stopping()

    def record(self, event: Event, *, client: str, surface: Surface, principal: Principal | None = None,
               key_prefix: str | None = None) -> None:
        if len(self._buffer) == self._buffer.maxlen:
            self.dropped += 1
        self._buffer.append(AuditEntry(
            at=datetime.now(UTC), event=event, client=_UNPRINTABLE.sub("?", client[:_CLIENT_CHARS]), surface=surface,
            key_id=principal.key_id if principal else None, tenant_id=principal.tenant_id if principal else None,
            key_prefix=key_prefix,
        ))

    def key_used(self, principal: Principal, *, client: str, surface: Surface) -> None:
        """Record a key's use from ``client`` unless recorded within ``key_use_interval``."""
        now, seen = self._clock(), (principal.key_id, client)
        last = self._seen.get(seen)
        if last is not None and now - last < self.key_use_interval:
            return
        self._seen.pop(seen, None)
        self._seen[seen] = now  # at the end: the map stays in the order of its times
        while self._seen and (len(self._seen) > MAX_SEEN
                              or now - next(iter(self._seen.values())) >= self.key_use_interval):
            del self._seen[next(iter(self._seen))]  # the oldest: its interval is over, or it is one too many
        self.record("key_used", client=client, surface=surface, principal=principal)

    async def flush(self) -> None:
        """Write what is buffered; on failure it stays buffered for the next try."""
        batch = list(self._buffer)
        if not batch:
            return
        async with self.db.session() as session:
            await session.execute(insert(AuthEvent), [msgspec.structs.asdict(e) for e in batch])
            await session.commit()
        for _ in batch:
            self._buffer.popleft()

    async def prune(self) -> int:
        """Delete the events older than ``retention``; how many went."""
        cutoff = datetime.now(UTC) - timedelta(seconds=self.retention)
        async with self.db.session() as session:
            result = await session.execute(delete(AuthEvent).where(AuthEvent.at < cutoff))
            await session.commit()
        return int(result.rowcount or 0)  # type: ignore[attr-defined]  # a CursorResult

    def start(self) -> None:
        self._take_up_spilled()
        self._task = asyncio.create_task(self._run(), name="audit-writer")

    def _take_up_spilled(self) -> None:
        """Buffer the events earlier processes kept in ``spill_dir`` at their shutdown."""
        if self.spill_dir is None:
            return
        for path in sorted(self.spill_dir.glob("audit-*.jsonl")):
            claimed = path.with_name(f"claimed-{os.getpid()}-{path.name}")
            try:
                path.rename(claimed)  # atomic: of several workers starting together, one takes it
            except FileNotFoundError:
                continue
            for line in claimed.read_bytes().splitlines():
                try:
                    self._buffer.append(msgspec.json.decode(line, type=AuditEntry))
                except msgspec.DecodeError:
                    log.warning("an unreadable line in %s left out: %r", path.name, line[:500])
            claimed.unlink()

    def _spill(self) -> bool:
        """Keep the buffered events in a file of ``spill_dir``; True when written."""
        if self.spill_dir is None or not self._buffer:
            return False
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        path = self.spill_dir / f"audit-{os.getpid()}-{os.urandom(3).hex()}.jsonl"
        partial = path.with_suffix(".partial")  # renamed once whole: a reader never sees half of it
        partial.write_bytes(b"".join(msgspec.json.encode(e) + b"\n" for e in self._buffer))
        partial.rename(path)
        return True

    async def _run(self) -> None:
        pruned = float("-inf")
        while not await self._stopping.pause(self.flush_every):
            try:
                await self.flush()
            except Exception as exc:
                if is_unavailable(exc):  # the database is down: keep the events and try again
                    log.warning("audit events not written yet (%s); %d waiting", type(exc).__name__,
                                len(self._buffer))
                else:  # the batch itself is refused: never let it block the events after it
                    log.exception("audit events dropped: %d", len(self._buffer))
                    self.dropped += len(self._buffer)
                    self._buffer.clear()
                continue
            if (now := time.monotonic()) - pruned >= _PRUNE_EVERY:
                pruned = now
                try:
                    await self.prune()
                except Exception as exc:
                    log.warning("old audit events not pruned yet (%s)", type(exc).__name__)

    async def aclose(self, timeout: float = 10.0) -> None:
        """Stop the writer after its current step and write what is buffered, waiting at most
        ``timeout`` seconds for the database in all (one that has gone silent must not hold the
        process's shutdown); what it does not take waits in ``spill_dir`` for the next start."""
        deadline = time.monotonic() + timeout
        ended = self._task is None or await self._stopping.stop(self._task, timeout)
        try:
            if not ended:
                raise TimeoutError  # the writer was stuck in the database, which takes nothing now
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                await self.flush()
        except Exception as exc:
            try:
                if self._spill():
                    log.warning("audit events not written at shutdown (%s): %d kept in %s for the next start",
                                type(exc).__name__, len(self._buffer), self.spill_dir)
                    return
            except OSError:
                log.exception("keeping the audit events in %s failed", self.spill_dir)
            log.error("audit events lost at shutdown: %d (%s)", len(self._buffer), type(exc).__name__)


async def list_events(db: Database, *, event: str | None = None, key_id: str | None = None,
                      tenant_id: str | None = None, client: str | None = None,
                      since: datetime | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """The newest events first, filtered by whichever of the arguments are given."""
    query = select(AuthEvent).order_by(AuthEvent.at.desc(), AuthEvent.id.desc()).limit(limit)
    for column, value in ((AuthEvent.event, event), (AuthEvent.key_id, key_id),
                          (AuthEvent.tenant_id, tenant_id), (AuthEvent.client, client)):
        if value is not None:
            query = query.where(column == value)
    if since is not None:
        query = query.where(AuthEvent.at >= since)
    async with db.session() as session:
        rows = (await session.scalars(query)).all()
    return [{"at": r.at.isoformat(), "event": r.event, "client": r.client, "surface": r.surface,
             "key_id": r.key_id, "tenant_id": r.tenant_id, "key_prefix": r.key_prefix} for r in rows]
