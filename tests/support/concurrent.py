"""Independent slow calls side by side: each `switchyard` process spends ~1.5 s importing, so a test
that starts several in a row waits for them one after another when two cores could share them."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def concurrently(*calls: Callable[[], T], workers: int = 4) -> list[T]:
    """Every call's result, in the order given; a call's exception is raised here (the first in order)."""
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(calls)))) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]
