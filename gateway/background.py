"""The services' background tasks (heartbeats, followers, publishers, writers): how one is stopped.

A loop that writes to the database is asked to end between two steps (``Stopping``), not
cancelled: a task cancelled in the middle of a statement closes its connection under it, and on
SQLite that connection keeps the write lock until the statement is gone, so the process's last
writes wait out the busy timeout (30 s) and fail. Cancelling stays the last resort, past a
deadline; and no stop waits for ever on a task that does not end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

log = logging.getLogger("switchyard.background")

CANCEL_GRACE = 5.0  # seconds a cancelled task may take to end before it is left behind


async def stop_task(task: asyncio.Task[Any], grace: float = CANCEL_GRACE) -> bool:
    """Cancel ``task`` and wait until it has ended, ``grace`` seconds at most (one still running
    then is left, with a warning); an error it ended with is raised here. True when it ended."""
    task.cancel()
    await asyncio.wait({task}, timeout=grace)
    if not task.done():
        log.warning("background task %s did not end within %.0f s of its cancellation", task.get_name(), grace)
        return False
    _raise_its_error(task)
    return True


def _raise_its_error(task: asyncio.Task[Any]) -> None:
    """Raise the error an ended ``task`` ended with (its cancellation is no error)."""
    with contextlib.suppress(asyncio.CancelledError):
        task.result()


class Stopping:
    """A loop's pause between steps, which ``stop`` ends at once."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    async def pause(self, seconds: float) -> bool:
        """Wait ``seconds``; True when a stop was asked for (before or meanwhile)."""
        if not self._event.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self._event.wait()
        return self._event.is_set()

    async def stop(self, task: asyncio.Task[Any], timeout: float) -> bool:
        """Ask the loop ``task`` runs to end after its current step and wait ``timeout`` seconds for
        it; cancel it only then. True when it ended by itself."""
        self._event.set()
        await asyncio.wait({task}, timeout=timeout)
        if task.done():
            _raise_its_error(task)
            return True
        log.warning("background task %s still busy %.0f s after it was asked to stop: cancelling it",
                    task.get_name(), timeout)
        await stop_task(task)
        return False
