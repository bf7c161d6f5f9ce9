"""A copy of this checkout's last commit with the gateway's busiest pure-Python modules compiled
by mypyc, to measure with ``bench.gateway_ab`` what compiling them would save:

    .venv/bin/python -m bench.mypyc_tree /tmp/compiled
    .venv/bin/python -m bench.gateway_ab --baseline /tmp/compiled --phases ac

The compiled copy is A. On the 2-core development host (2026-12-05), 12 to 16 rounds a run:

- ``MODULES`` with ``gateway/usage/writer.py`` (18 modules): (a) 0.130 vs 0.144, 0.124 vs 0.140
  and 0.124 vs 0.140 ms of CPU per request (10-11 % less); (c) 0.673 vs 0.654, 0.758 vs 0.752,
  0.701 vs 0.726 and 0.733 vs 0.706 ms per stream (no difference); four runs with (c), none
  stopped. With ``--pairs 4`` (a fresh pair of gateways every 2-4 rounds), (a) 0.132 vs 0.147,
  0.145 vs 0.163, 0.139 vs 0.151 ms, the pure build's CPU per request over the compiled one's
  1.06-1.22 in each of the 12 pairs; one more such run ended within 30 s, a gateway gone.
- With ``backends/raw_http.py`` and ``backends/openai_http.py`` compiled too: (a) 0.117 vs 0.136,
  0.113 vs 0.130, 0.115 vs 0.130 and 0.117 vs 0.135 ms (10-14 % less), but the gateway stopped in
  5 of 6 runs with (c) and 1 of 4 of (a) alone: a task's wakeup raised ``TypeError('invalid
  exception object')``, and formatting that for the log was a segmentation fault.

Why the builds died (found 2026-12-05): a compiled coroutine that catches an exception raised
inside ``async with`` around a pure-Python context manager whose ``__aexit__`` awaits corrupts
that exception; the event loop then fails on it (``TypeError`` in ``Task.task_wakeup``) and
formatting it for the log is a segmentation fault. Twenty lines do it with mypy 2.4.1 on CPython
3.11.7::

    class CM:  # not compiled
        async def __aenter__(self): await asyncio.sleep(0); return self
        async def __aexit__(self, *exc): await asyncio.sleep(0); return False
    async def boom(): await asyncio.sleep(0); raise ValueError("x")  # not compiled

    async def write(self) -> bool:  # compiled: 20 tasks x 3,000 calls, a crash within the run
        try:
            async with CM():
                await boom()
        except Exception:
            return False
        return True

``UsageWriter._insert`` is such a place (``async with engine.begin()``): any error from the
database there, such as the rollup deadlocks two gateways on one database met until the writer
gave each slice its own transaction, killed a build with ``gateway/usage/writer.py`` compiled
(bisected: 3 of 4 runs of ``gateway_ab --phases abc --pairs 4`` with it alone compiled; 0 of 4
with ``quotas/credit`` and ``quotas/admission`` alone). It is left out of ``MODULES`` since.

Not part of the product: mypyc checks every annotation at run time
(``SqlAuthenticator._load`` failed on a SQLAlchemy ``Row`` typed as a tuple, so it is left out
too), the build needs a C compiler, and compiled modules next to their sources shadow later edits.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from bench.harness import ROOT

# Modules that mypyc compiles and that run per request; the others on the path cannot be compiled
# as they are (msgspec Structs: backends/openai_wire.py, backends/http_upstream.py; Litestar
# subclasses: gateway/controllers; gateway/body.py's class attribute access) or misbehave (above:
# gateway/usage/writer.py, backends/raw_http.py, backends/openai_http.py).
MODULES = (
    "gateway/pipeline.py", "gateway/fast_routes.py", "gateway/calls.py", "gateway/routing/plan.py",
    "gateway/quotas/credit.py", "gateway/quotas/admission.py", "gateway/usage/wal.py", "gateway/usage/journal.py",
    "gateway/telemetry/middleware.py",
    "gateway/telemetry/hooks.py", "gateway/telemetry/context.py", "backends/turn_writes.py",
    "backends/estimate.py", "gateway/auth/guard.py", "gateway/auth/throttle.py",
    "gateway/request_headers.py", "gateway/caching.py",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path, help="Where to put the copy (must not exist).")
    args = parser.parse_args()
    target: Path = args.directory.resolve()
    if target.exists():
        parser.error(f"{target} exists")
    target.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    mypyc = shutil.which("mypyc") or str(Path(sys.executable).parent / "mypyc")
    subprocess.run([mypyc, *MODULES], cwd=target, check=True)
    print(f"compiled {len(MODULES)} modules in {target}; compare: "
          f"{sys.executable} -m bench.gateway_ab --baseline {target} --phases ac")


if __name__ == "__main__":
    main()
