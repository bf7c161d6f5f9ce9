"""Two builds of the gateway side by side in one run: what a change does to (b) and (c) of
``bench.gateway``, on a host too noisy for two separate runs to tell.

Starts the upstreams, PostgreSQL, Redis and pinning as ``bench.gateway`` does, and two gateways on
the same CPU: A from another checkout (``--baseline``, a git worktree of the commit before the
change: its ``gateway`` and ``backends`` packages go first on the path) and B from this tree. Only
one of them has load at a time: each round runs a short slice of the upstream hit directly, then
A, then B (then B before A the next round), for (a) requests on 64 connections with no upstream
latency (the CPU per request is the figure to read), (b) requests at a fixed offered rate with 20 ms
upstream latency and (c) 64 streams kept up; the slices of each are pooled. The upstreams are
``bench.gateway``'s (``--upstream``).

    git worktree add /tmp/base HEAD~1
    .venv/bin/python -m bench.gateway_ab --baseline /tmp/base [--rounds 8] [--slice 1.5] [--rate 1000] [--phases abc]

``--baseline-venv`` runs A from another virtual environment (another Python, other library
versions) with this tree's code unless ``--baseline`` names another checkout as well.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from bench.gateway import CHAT, STREAM_SECONDS, cpu_plan, errors_of, gateway_config, gateway_cpu
from bench.harness import (
    UPSTREAMS,
    Gateway,
    fresh_database,
    make_tenant_key,
    print_table,
    report_if_exited,
    services_on,
    start_gateway,
    start_upstream,
    stop,
)
from bench.loadgen import Run, Target, closed_loop, http_request, open_loop

BUILDS = ("A", "B")


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


async def compare(args: argparse.Namespace, gateways: dict[str, Gateway], key: str, fast: str, slow: str,
                  streamy: str) -> list[list[str]]:
    targets: dict[str, dict[str, Target]] = {"a": {}, "b": {}, "c": {}}
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
    }
    loads = {phase: load for phase, load in loads.items() if phase in args.phases}
    runs = {(phase, who): Run() for phase in loads for who in ("direct", *BUILDS)}
    cpu = {(phase, who): 0.0 for phase in loads for who in BUILDS}
    for round_ in range(args.rounds):
        order = ("direct", *BUILDS) if round_ % 2 == 0 else ("direct", *reversed(BUILDS))
        for phase, load in loads.items():
            for who in order:
                cpu0 = gateway_cpu(gateways[who]) if who in gateways else 0.0
                part = await load(targets[phase][who])
                if who in gateways:
                    cpu[phase, who] += gateway_cpu(gateways[who]) - cpu0
                pooled = runs[phase, who]
                pooled.results += part.results
                pooled.errors += part.errors
                pooled.seconds += part.seconds
    rows = []
    for phase, what, label in (("a", "total", "(a) 64 connections"), ("b", "total", f"(b) latency @{args.rate:g}/s"),
                               ("c", "first", "(c) kept up: TTFC")):
        if phase not in loads:
            continue
        direct = runs[phase, "direct"]
        for who in BUILDS:
            g = runs[phase, who]
            added = [g.pct(q, what) - direct.pct(q, what) for q in (0.5, 0.9, 0.99)]
            rows.append([f"{label}, {who}", " / ".join(f"{a:+.2f}" for a in added),
                         f"{len(g.ok) / g.seconds:,.0f} ({len(direct.ok) / direct.seconds:,.0f})",
                         f"{cpu[phase, who] / max(1, len(g.results)) * 1000:.3f}", f"{errors_of(g)}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", help="A checkout of the build to compare with (A); default: this tree.")
    parser.add_argument("--baseline-venv", type=Path, help="A virtual environment A runs from (default: this one).")
    parser.add_argument("--rounds", type=int, default=8, help="Rounds of slices: direct, A, B.")
    parser.add_argument("--slice", type=float, default=1.5, help="Seconds of each slice.")
    parser.add_argument("--rate", type=float, default=1000.0, help="Offered requests/s of (b).")
    parser.add_argument("--upstream", choices=sorted(UPSTREAMS), default="lean",
                        help="The upstreams: lean (bench.lean_upstream) or echo (backends.dev.echo_server).")
    parser.add_argument("--phases", default="abc", help="Which of the phases (a) (b) (c) to run.")
    args = parser.parse_args()
    if args.baseline is None and args.baseline_venv is None:
        parser.error("nothing to compare: give --baseline, --baseline-venv or both")
    gateway_cpus, load_cpus = cpu_plan(1, True)
    if load_cpus is not None:
        os.sched_setaffinity(0, {int(c) for c in load_cpus.split(",")})
    load_set = {int(c) for c in load_cpus.split(",")} if load_cpus else None
    import uvloop

    uvloop.install()
    with tempfile.TemporaryDirectory() as tmp, fresh_database() as db_url, services_on(load_set):
        procs = {}
        gateways: dict[str, Gateway] = {}
        try:
            procs["fast"], fast = start_upstream(cpus=load_cpus, module=UPSTREAMS[args.upstream])
            procs["slow"], slow = start_upstream("--latency", "0.02", cpus=load_cpus, module=UPSTREAMS[args.upstream])
            procs["streamy"], streamy = start_upstream("--output-words", "20", "--chunk-delay", "0.005",
                                                       cpus=load_cpus, module=UPSTREAMS[args.upstream])
            baseline = str(Path(args.baseline).resolve()) if args.baseline else None
            for who, path, venv in zip(BUILDS, (baseline, None), (args.baseline_venv, None), strict=True):
                work = Path(tmp) / who
                work.mkdir()
                with python_path(path):
                    gateways[who] = start_gateway(gateway_config(db_url, fast, slow, streamy, work / "journal"),
                                                  work, 1, gateway_cpus, venv)
            key = make_tenant_key(gateways["B"].url)
            rows = asyncio.run(compare(args, gateways, key, fast, slow, streamy))
        finally:
            for gw in gateways.values():
                report_if_exited(gw)
                stop(gw.proc)
            for proc in procs.values():
                stop(proc)
    a = " from ".join(str(x) for x in (args.baseline or "this tree", args.baseline_venv) if x)
    print(f"A: {a}, B: this tree; {args.rounds} rounds of {args.slice:g} s slices, gateways on CPUs "
          f"{gateway_cpus}")
    print_table(rows, ["measurement", "added p50 / p90 / p99 (ms)", "served/s (direct)", "CPU per request (ms)",
                       "errors"])


if __name__ == "__main__":
    main()
