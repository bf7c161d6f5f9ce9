"""Tokenizer work sized by its input: a big input in a worker thread, a small one on the event loop.

A tokenizer takes about a second a megabyte, and every other request waits while the event loop
does it; below ``OFF_LOOP_BOUND`` bytes the thread hop would cost more than the work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
OFF_LOOP_BOUND = 64 * 1024  # bytes of input (a prompt's byte bound)


async def sized(bound: int, work: Callable[[], T]) -> T:
    """``work()``, in a worker thread when ``bound`` (its input's bytes) is past ``OFF_LOOP_BOUND``."""
    if bound > OFF_LOOP_BOUND:
        return await asyncio.to_thread(work)
    return work()
