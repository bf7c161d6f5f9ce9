"""Two builds of the gateway side by side in one run: what a change does to (b) and (c) of
``bench.gateway``, on a host too noisy for two separate runs to tell.

Starts the upstreams, PostgreSQL, Redis and pinning as ``bench.gateway`` does, and two gateways on
the same CPU: A from another checkout (``--baseline``, a git worktree of the commit before the
change: its ``gateway`` and ``backends`` packages go first on the path) and B from this tree. Only
one of them has load at a time: each round runs a short slice of the upstream hit directly, then
A, then B (then B before A the next round), for (a) requests on 64 connections with no upstream
latency (the CPU per request is the figure to read), (b) requests at a fixed offered rate with 20 ms
upstream latency and (c) 64 streams kept up, and with ``--phases`` holding ``s``, (c)'s bursts
(64 streams started at once, ``BURSTS_PER_SLICE`` times a slice); the slices of each are pooled.
The upstreams are ``bench.gateway``'s (``--upstream``).

Two processes of the same build differ too, by a few per cent of CPU per request for as long as
they run (an A/A run of 16 rounds on the 2-core host: B above A in 14 of them, pooled 0.133 vs
0.135 ms; in another, 0.141 vs 0.140). ``--pairs N`` shares the rounds among N pairs of gateway
processes started in turn, and prints B's CPU per request over A's for each pair under the table:
a change shows when every pair agrees on it.

    git worktree add /tmp/base HEAD~1
    .venv/bin/python -m bench.gateway_ab --baseline /tmp/base [--rounds 8] [--pairs 1] [--slice 1.5] [--rate 1000]
                                      [--phases abcs]

``--baseline-venv`` runs A from another virtual environment (another Python, other library
versions) with this tree's code unless ``--baseline`` names another checkout as well.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from bench.gateway import CHAT, STREAM_SECONDS, errors_of, gateway_config, gateway_cpu, pin_load
from bench.harness import (
    UPSTREAMS,
    Gateway,
    fresh_database,
    interpreter,
    make_tenant_key,
    print_table,
    report_if_exited,
    services_on,
    start_gateway,
    start_upstream,
    stop,
)
from bench.loadgen import Run, Target, bursts, closed_loop, http_request, open_loop

BUILDS = ("A", "B")
BURSTS_PER_SLICE = 8  # (c)'s bursts: 64 streams at once, this many times in each slice (~0.1 s each)


@contextmanager
def python_path(first: str | None) -> Iterator[None]:
    """``first`` ahead on the path of the processes started inside (the gateway's packages)."""
    saved = os.environ.get("PYTHONPATH")
    if first is not None:
        os.environ["PYTHONPATH"] = first
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@dataclass
class Pooled:
    """Every slice so far, by (phase, who); the gateways' CPU seconds in them; and for each phase,
    B's CPU per request over A's in each pair of gateway processes."""

    runs: dict[tuple[str, str], Run] = field(default_factory=lambda: defaultdict(Run))
    cpu: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    pair_ratios: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))


async def compare(args: argparse.Namespace, gateways: dict[str, Gateway], key: str, fast: str, slow: str,
                  streamy: str, rounds: int, pooled: Pooled) -> None:
    """``rounds`` rounds through this pair of gateways, added to ``pooled``."""
    targets: dict[str, dict[str, Target]] = {"a": {}, "b": {}, "c": {}, "s": {}}
    targets["a"]["direct"] = http_request(fast, "/v1/chat/completions", CHAT | {"model": "echo"}, None)
    targets["b"]["direct"] = http_request(slow, "/v1/chat/completions", CHAT | {"model": "echo"}, None)
    targets["c"]["direct"] = http_request(streamy, "/v1/chat/completions", CHAT | {"model": "echo", "stream": True},
                                          None)
    for name, gw in gateways.items():
        targets["a"][name] = http_request(gw.url, "/v1/chat/completions", CHAT | {"model": "fast"}, key)
        targets["b"][name] = http_request(gw.url, "/v1/chat/completions", CHAT | {"model": "slow"}, key)
        targets["c"][name] = http_request(gw.url, "/v1/chat/completions", CHAT | {"model": "streamy", "stream": True},
                                          key)
    loads: dict[str, Callable[[Target], Awaitable[Run]]] = {
        "a": partial(closed_loop, connections=64, seconds=args.slice),
        "b": partial(open_loop, rate=args.rate, seconds=args.slice),
        "c": partial(closed_loop, connections=64, seconds=args.slice, stagger=STREAM_SECONDS),
        "s": partial(bursts, concurrency=64, rounds=BURSTS_PER_SLICE),
    }
    targets["s"] = targets["c"]
    loads = {phase: load for phase, load in loads.items() if phase in args.phases}
    cpu: dict[tuple[str, str], float] = defaultdict(float)  # this pair's
    served: dict[tuple[str, str], int] = defaultdict(int)
    for round_ in range(rounds):
        order = ("direct", *BUILDS) if round_ % 2 == 0 else ("direct", *reversed(BUILDS))
        for phase, load in loads.items():
            for who in order:
                cpu0 = gateway_cpu(gateways[who]) if who in gateways else 0.0
                part = await load(targets[phase][who])
                if who in gateways:
                    cpu[phase, who] += gateway_cpu(gateways[who]) - cpu0
                    served[phase, who] += len(part.results)
                run = pooled.runs[phase, who]
                run.results += part.results
                run.errors += part.errors
                run.seconds += part.seconds
    for phase in loads:
        for who in BUILDS:
            pooled.cpu[phase, who] += cpu[phase, who]
        a, b = (cpu[phase, who] / max(1, served[phase, who]) for who in BUILDS)
        if a > 0:
            pooled.pair_ratios[phase].append(b / a)


def table(args: argparse.Namespace, pooled: Pooled) -> tuple[list[list[str]], list[str]]:
    """The rows of the pooled slices, and a line per phase with B's CPU per request over A's in each
    pair of gateway processes."""
    rows, notes = [], []
    for phase, what, label in (("a", "total", "(a) 64 connections"), ("b", "total", f"(b) latency @{args.rate:g}/s"),
                               ("c", "first", "(c) kept up: TTFC"), ("s", "first", "(c) bursts: TTFC")):
        if phase not in args.phases:
            continue
        direct = pooled.runs[phase, "direct"]
        for who in BUILDS:
            g = pooled.runs[phase, who]
            added = [g.pct(q, what) - direct.pct(q, what) for q in (0.5, 0.9, 0.99)]
            rows.append([f"{label}, {who}", " / ".join(f"{a:+.2f}" for a in added),
                         f"{len(g.ok) / g.seconds:,.0f} ({len(direct.ok) / direct.seconds:,.0f})",
                         f"{pooled.cpu[phase, who] / max(1, len(g.results)) * 1000:.3f}", f"{errors_of(g)}"])
        ratios = ", ".join(f"{r:.3f}" for r in pooled.pair_ratios[phase])
        notes.append(f"({phase}) B's CPU per request / A's, each pair of gateway processes: {ratios}")
    return rows, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", help="A checkout of the build to compare with (A); default: this tree.")
    parser.add_argument("--baseline-venv", type=Path, help="A virtual environment A runs from (default: this one).")
    parser.add_argument("--rounds", type=int, default=8, help="Rounds of slices: direct, A, B.")
    parser.add_argument("--slice", type=float, default=1.5, help="Seconds of each slice.")
    parser.add_argument("--rate", type=float, default=1000.0, help="Offered requests/s of (b).")
    parser.add_argument("--upstream", choices=sorted(UPSTREAMS), default="lean",
                        help="The upstreams: lean (bench.lean_upstream) or echo (backends.dev.echo_server).")
    parser.add_argument("--phases", default="abc",
                        help="Which of the phases (a) (b) (c) to run, and s for (c)'s bursts.")
    parser.add_argument("--pairs", type=int, default=1,
                        help="Pairs of gateway processes started in turn, the rounds shared among them.")
    args = parser.parse_args()
    if args.baseline is None and args.baseline_venv is None:
        parser.error("nothing to compare: give --baseline, --baseline-venv or both")
    gateway_cpus, load_cpus, load_set = pin_load(1)
    import uvloop

    uvloop.install()
    pooled = Pooled()
    with tempfile.TemporaryDirectory() as tmp, fresh_database() as db_url, services_on(load_set):
        procs = {}
        try:
            procs["fast"], fast = start_upstream(cpus=load_cpus, module=UPSTREAMS[args.upstream])
            procs["slow"], slow = start_upstream("--latency", "0.02", cpus=load_cpus, module=UPSTREAMS[args.upstream])
            procs["streamy"], streamy = start_upstream("--output-words", "20", "--chunk-delay", "0.005",
                                                       cpus=load_cpus, module=UPSTREAMS[args.upstream])
            baseline = str(Path(args.baseline).resolve()) if args.baseline else None
            for pair in range(args.pairs):
                rounds = args.rounds // args.pairs + (pair < args.rounds % args.pairs)
                gateways: dict[str, Gateway] = {}
                try:
                    for who, path, venv in zip(BUILDS, (baseline, None), (args.baseline_venv, None), strict=True):
                        work = Path(tmp) / f"{who}{pair}"
                        work.mkdir()
                        with python_path(path):
                            gateways[who] = start_gateway(
                                gateway_config(db_url, fast, slow, streamy, work / "journal"), work, 1, gateway_cpus,
                                venv)
                    key = make_tenant_key(gateways["B"].url)
                    asyncio.run(compare(args, gateways, key, fast, slow, streamy, rounds, pooled))
                finally:
                    for gw in gateways.values():
                        report_if_exited(gw)
                        stop(gw.proc)
        finally:
            for proc in procs.values():
                stop(proc)
    rows, notes = table(args, pooled)
    a = " from ".join(str(x) for x in (args.baseline or "this tree", args.baseline_venv) if x)
    print(f"A: {a}, B: this tree; {args.rounds} rounds of {args.slice:g} s slices through {args.pairs} pair(s) "
          f"of gateway processes, gateways on CPUs {gateway_cpus}")
    a_python = args.baseline_venv / "bin" / "python" if args.baseline_venv else sys.executable
    print(f"A's Python: {interpreter(a_python)}\nB's Python: {interpreter()}")
    print_table(rows, ["measurement", "added p50 / p90 / p99 (ms)", "served/s (direct)", "CPU per request (ms)",
                       "errors"])
    print("\n".join(notes))


if __name__ == "__main__":
    main()
