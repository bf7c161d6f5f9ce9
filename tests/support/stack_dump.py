"""Run a module as ``python -m`` would, with stack dumps on request: SIGUSR2 writes the stack of
every asyncio task of the running loop, and SIGABRT (``faulthandler``) every thread's, to stderr.
Test harnesses start gateway processes through it, so that one which does not stop in time shows
where it waits (``python -m tests.support.stack_dump uvicorn ...``)."""

from __future__ import annotations

import asyncio
import faulthandler
import runpy
import signal
import sys
from types import FrameType


def awaited_frames(awaitable: object) -> list[str]:
    """Where a suspended coroutine waits: its frame, then the frames of what it awaits, down the
    chain (``Task.print_stack`` shows only the outermost frame of a suspended task)."""
    lines = []
    while awaitable is not None:
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "gi_frame", None) or getattr(
            awaitable, "ag_frame", None)
        if frame is not None:
            lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        awaitable = getattr(awaitable, "cr_await", None) or getattr(awaitable, "gi_yieldfrom", None) or getattr(
            awaitable, "ag_await", None)
    return lines


def dump_tasks(signum: int, frame: FrameType | None) -> None:
    try:
        tasks = asyncio.all_tasks()
    except RuntimeError:  # no loop running in this thread
        print("stack dump: no event loop running", file=sys.stderr, flush=True)
        return
    print(f"stack dump: {len(tasks)} asyncio tasks", file=sys.stderr)
    for task in tasks:
        print(f"task {task.get_name()}:", *awaited_frames(task.get_coro()), sep="\n", file=sys.stderr)
    sys.stderr.flush()


def main() -> None:
    faulthandler.enable(all_threads=True)
    signal.signal(signal.SIGUSR2, dump_tasks)
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
