"""The test harness's stack dump (tests.support.stack_dump): SIGUSR2 shows where each task waits."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

WAITER = """
import asyncio

async def held_here(event):
    await event.wait()

async def main():
    print("ready", flush=True)
    await asyncio.create_task(held_here(asyncio.Event()), name="the-waiter")

asyncio.run(main())
"""


def test_sigusr2_shows_where_every_task_waits(tmp_path: Path) -> None:
    (tmp_path / "waiter_module.py").write_text(WAITER)
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.stack_dump", "waiter_module"],
                            env={"PYTHONPATH": f"{tmp_path}:{Path(__file__).parents[1]}"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        time.sleep(0.2)
        proc.send_signal(signal.SIGUSR2)
        time.sleep(0.5)
    finally:
        proc.kill()
    err = proc.communicate()[1]
    assert "task the-waiter:" in err
    assert "in held_here" in err and "locks.py" in err  # down the chain of awaits
