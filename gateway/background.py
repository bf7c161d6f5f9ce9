"""The services' background tasks (heartbeats, followers, publishers): how one is stopped."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def stop_task(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
