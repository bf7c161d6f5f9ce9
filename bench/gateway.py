"""What the gateway adds to every request, measured against the same upstream hit directly.

Starts, each in its own process on loopback: three upstreams (no latency; 20 ms latency; 20
chunks 5 ms apart on a fixed clock), and the gateway (``switchyard serve`` settings: uvicorn + uvloop + httptools,
one worker unless ``--workers``) on the full production path: SQL API keys (PostgreSQL), Redis
quotas with high limits, usage metered into PostgreSQL. A fresh PostgreSQL database is created and
dropped. Load comes from a small raw-HTTP/1.1 asyncio client on keep-alive connections (or ``wrk``
for (a) with ``--wrk``).

    .venv/bin/python -m bench.gateway [--seconds 8] [--rates 500,1000] [--slices 3] [--workers 1]
                                      [--no-pin] [--wrk] [--profile prof.txt --profile-phase a]
                                      [--upstream lean|echo]

The upstreams are ``bench.lean_upstream`` (a raw asyncio protocol; about 0.3 ms of CPU per
20-chunk stream) unless ``--upstream echo`` takes the dev echo server (uvicorn and an ASGI app;
about 0.8 ms). They share the load CPU with Redis and the load generator. The choice moves (a)'s
direct rate most (here 28,000-40,000 requests/s lean, 8,000-15,000 echo, so the ratio to it);
with the two alternated in one run, (b) and (c) through the gateway came out the same within noise.

Pinning (the default on a machine with at least two CPUs): the gateway (all its workers) runs on
the first ``--workers`` CPUs with ``taskset``; this process (the load generator), the
upstreams, and the running Redis and PostgreSQL servers (``harness.services_on``, for the run) on
the others: the gateway has its cores to itself, as beside stores on other machines. Each figure
is measured in the same run against the upstream hit directly, so ratios hold better than absolute
numbers on a busy host; (b) and (c) alternate short slices of each (``--slices``) so that a pause
of the host hits both.

(a) non-streaming requests/s at 64 concurrent connections, zero upstream latency, and its ratio
    to the direct upstream's rate; the gateway's CPU time per request
(b) added latency p50/p99 at fixed offered rates (default 500 and 1,000 requests/s), 20 ms upstream
    latency; the rate actually served
(c) 64 concurrent streams of 20 chunks 5 ms apart, kept up (64 connections started evenly over
    a stream's 100 ms, each starting its next stream as the last ends) and in bursts (all 64
    start at once): added time to first chunk and total
    p50/p99; streams completed per second, and their ratio to the direct upstream's
(d) each gateway worker's RSS after the run; and usage rows in PostgreSQL = requests sent.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.harness import (
    ADMIN_KEY,
    REDIS_URL,
    UPSTREAMS,
    Gateway,
    count_usage_rows,
    cpu_seconds,
    fresh_database,
    interpreter,
    make_tenant_key,
    print_table,
    report_if_exited,
    rss_mib,
    services_on,
    start_gateway,
    start_upstream,
    stop,
    usage_caught_up,
    worker_pids,
)
from bench.loadgen import Run, Target, bursts, closed_loop, http_request, open_loop, wrk_rps

# ---------------------------------------------------------------- the benchmark


STREAM_SECONDS = 0.1  # how long a stream of the "streamy" upstream lasts: 20 chunks 5 ms apart
CHAT = {"messages": [{"role": "user", "content": "Say hello to the benchmark, please."}], "max_tokens": 16}


def gateway_config(db_url: str, fast: str, slow: str, streamy: str, journal: Path) -> dict[str, Any]:
    def group(name: str, url: str) -> dict[str, Any]:
        return {
            "name": name,
            "max_retries": 0,
            "deployments": [{"provider": "openai", "model": "echo", "api_base": url + "/v1", "api_key": "sk-upstream"}],
        }

    return {
        "auth": {"admin_key": ADMIN_KEY, "key_cache_seconds": 2},
        "database": {"url": db_url},
        "redis": {"url": REDIS_URL, "on_unavailable": "fail_closed"},
        "usage": {"journal_dir": str(journal)},
        "models": [group("fast", fast), group("slow", slow), group("streamy", streamy)],
        "prices": {"fast": {"input_per_million": 1, "output_per_million": 2}},
    }


def gateway_cpu(gw: Gateway, *, kernel_only: bool = False) -> float:
    """CPU seconds used so far by the gateway: its workers and (with several) their supervisor
    (``kernel_only``: their system time)."""
    pids = {gw.proc.pid, *worker_pids(gw.proc.pid)}
    return sum(cpu_seconds(pid, kernel_only=kernel_only) for pid in pids)


def in_kernel(system: float, cpu: float) -> str:
    """The note on a CPU figure: the share of it spent in the kernel, where no Python change reaches."""
    return f", {system / cpu:.0%} of it in the kernel" if cpu > 0 else ""


def errors_of(run: Run) -> int:
    return run.errors + len(run.results) - len(run.ok)


async def throughput(
    args: argparse.Namespace,
    gw: Gateway,
    key: str,
    upstream: str,
    upstream_pid: int,
    direct: tuple[str, int, bytes],
    via: tuple[str, int, bytes],
) -> tuple[list[list[str]], int]:
    """(a): requests/s at 64 connections, direct and through the gateway; the CPU time each server
    spends per request, and the rate that makes on one whole core (what a busy host cannot hide)."""
    rows: list[list[str]] = []
    if args.wrk and shutil.which("wrk"):
        d_rps, _ = wrk_rps(upstream, "/v1/chat/completions", CHAT | {"model": "echo"}, key, 64, args.seconds)
        g_rps, errors = wrk_rps(gw.url, "/v1/chat/completions", CHAT | {"model": "fast"}, key, 64, args.seconds)
        sent = int(g_rps * args.seconds)  # approximate: wrk does not report exact counts here
    else:
        d_cpu0 = cpu_seconds(upstream_pid)
        d = await closed_loop(direct, 64, args.seconds)
        d_cpu = (cpu_seconds(upstream_pid) - d_cpu0) / max(1, len(d.results))
        profiler = _profile(gw, args, "a")
        cpu0, sys0 = gateway_cpu(gw), gateway_cpu(gw, kernel_only=True)
        g = await closed_loop(via, 64, args.seconds)
        cpu, system = gateway_cpu(gw) - cpu0, gateway_cpu(gw, kernel_only=True) - sys0
        _stop_profile(profiler)
        d_rps, g_rps, errors = len(d.ok) / d.seconds, len(g.ok) / g.seconds, errors_of(g)
        sent = len(g.results)
        g_cpu = cpu / max(1, len(g.results))
        rows.append(
            [
                "(a) server CPU per request (ms)",
                f"{d_cpu * 1000:.3f}",
                f"{g_cpu * 1000:.3f}",
                f"{(g_cpu - d_cpu) * 1000:+.3f}",
                "",
                f"gateway used {cpu / g.seconds:.0%} of a core{in_kernel(system, cpu)}",
            ]
        )
        rows.append(
            [
                "(a) req/s per whole core (1 / CPU per request)",
                f"{1 / d_cpu:,.0f}",
                f"{1 / g_cpu:,.0f}",
                f"{d_cpu / g_cpu:.1%} of direct",
                ">= 10% of direct",
                "",
            ]
        )
    rows.insert(
        0,
        [
            "(a) non-stream req/s @64 conns",
            f"{d_rps:,.0f}",
            f"{g_rps:,.0f}",
            f"{g_rps / d_rps:.1%} of direct",
            ">= 10% of direct",
            f"errors {errors}",
        ],
    )
    return rows, sent


async def interleaved(gw: Gateway, slices: int, load: Callable[[Target], Awaitable[Run]], direct: Target,
                      via: Target) -> tuple[Run, Run, float, float]:
    """``slices`` short runs each way, alternating (direct, gateway, direct, ...), pooled: a pause of
    this shared machine (another process, the hypervisor) lands on both sides alike instead of
    deciding one side's percentiles. Also the gateway's CPU seconds during its runs, and the part of
    them in the kernel."""
    d, g, cpu, system = Run(), Run(), 0.0, 0.0
    for _ in range(slices):
        for pooled, target in ((d, direct), (g, via)):
            cpu0, sys0 = gateway_cpu(gw), gateway_cpu(gw, kernel_only=True)
            part = await load(target)
            if pooled is g:
                cpu += gateway_cpu(gw) - cpu0
                system += gateway_cpu(gw, kernel_only=True) - sys0
            pooled.results += part.results
            pooled.errors += part.errors
            pooled.seconds += part.seconds
    return d, g, cpu, system


async def latency(args: argparse.Namespace, gw: Gateway, direct: Target, via: Target) -> tuple[list[list[str]], int]:
    """(b): added latency at fixed offered rates (20 ms upstream), and the rate actually served."""
    rows: list[list[str]] = []
    sent = 0
    profiler = _profile(gw, args, "b")
    for rate in args.rates:
        load = partial(open_loop, rate=rate, seconds=args.seconds / 2 / args.slices)
        d, g, *_ = await interleaved(gw, args.slices, load, direct, via)
        sent += len(g.results)
        for q, target in ((0.5, "<= 1 ms added"), (0.99, "<= 3 ms added")):
            added = g.pct(q) - d.pct(q)
            notes = f"served {len(g.ok) / g.seconds:,.0f}/s, errors {errors_of(g)}" if q == 0.5 else ""
            rows.append(
                [
                    f"(b) latency p{q * 100:.0f} @{rate:g} req/s (ms)",
                    f"{d.pct(q):.2f}",
                    f"{g.pct(q):.2f}",
                    f"{added:+.2f}",
                    target,
                    notes,
                ]
            )
    _stop_profile(profiler)
    return rows, sent


async def streams(args: argparse.Namespace, gw: Gateway, direct: Target, via: Target) -> tuple[list[list[str]], int]:
    """(c): 64 concurrent streams of 20 chunks, two ways: kept up (64 connections started evenly over
    a stream's length, each starting its next stream as the last ends) and in bursts (64 started at
    the same instant, ``--rounds`` times): added time to the first chunk and to the end; streams
    completed per second; gateway CPU."""
    rows: list[list[str]] = []
    sent = 0
    profiler = _profile(gw, args, "c")
    for how, slices, load in (
        ("kept up", args.slices,
         partial(closed_loop, connections=64, seconds=args.seconds / args.slices, stagger=STREAM_SECONDS)),
        ("bursts", 1, partial(bursts, concurrency=64, rounds=args.rounds)),
    ):
        d, g, cpu, system = await interleaved(gw, slices, load, direct, via)
        rows += _stream_rows(how, d, g, cpu, system)
        sent += len(g.results)
    _stop_profile(profiler)
    return rows, sent


def _stream_rows(how: str, d: Run, g: Run, cpu: float, system: float) -> list[list[str]]:
    rows: list[list[str]] = []
    for label, what, q, target in (
        ("TTFC p50", "first", 0.5, "<= 2 ms added"),
        ("TTFC p99", "first", 0.99, "<= 5 ms added"),
        ("total p50", "total", 0.5, ""),
        ("total p99", "total", 0.99, ""),
    ):
        rows.append(
            [
                f"(c) 64 streams x20, {how}: {label} (ms)",
                f"{d.pct(q, what):.2f}",
                f"{g.pct(q, what):.2f}",
                f"{g.pct(q, what) - d.pct(q, what):+.2f}",
                target,
                f"errors {errors_of(g)}" if label == "TTFC p50" else "",
            ]
        )
    rows.append(
        [
            f"(c) {how}: gateway CPU per stream (ms)",
            "-",
            f"{cpu * 1000 / max(1, len(g.results)):.3f}",
            "-",
            "",
            f"gateway used {cpu / g.seconds:.0%} of a core{in_kernel(system, cpu)}",
        ]
    )
    d_sps, g_sps = len(d.ok) / d.seconds, len(g.ok) / g.seconds
    rows.append(
        [
            f"(c) {how}: streams completed per second",
            f"{d_sps:,.0f}",
            f"{g_sps:,.0f}",
            f"{g_sps / d_sps:.1%} of direct",
            ">= 95% of direct",
            "",
        ]
    )
    return rows


async def measure(
    args: argparse.Namespace, gw: Gateway, key: str, ups: dict[str, str], pids: dict[str, int], db_url: str
) -> tuple[list[list[str]], int]:
    sent = 0

    def pair(model: str, stream: bool = False) -> tuple[Target, Target]:
        body = CHAT | {"model": model} | ({"stream": True} if stream else {})
        return (
            http_request(ups[model], "/v1/chat/completions", body | {"model": "echo"}, None),
            http_request(gw.url, "/v1/chat/completions", body, key),
        )

    rows: list[list[str]] = []
    direct, via = pair("fast")
    sent += len((await closed_loop(via, 16, 1.0)).results)  # warm-up: key cache, pools, lazy imports
    await closed_loop(direct, 16, 0.5)
    phases = (
        ("a", lambda: throughput(args, gw, key, ups["fast"], pids["fast"], direct, via)),
        ("b", lambda: latency(args, gw, *pair("slow"))),
        ("c", lambda: streams(args, gw, *pair("streamy", stream=True))),
    )
    for name, phase in phases:
        if name in args.phases:
            # each phase starts with the usage of the ones before written, so that their writes (PostgreSQL
            # shares the load CPU) do not fall in its slices
            waited = await usage_caught_up(db_url, sent)
            if waited > 1:
                print(f"({name}) waited {waited:.1f} s for the usage rows of the phases before", file=sys.stderr)
            phase_rows, phase_sent = await phase()
            rows += phase_rows
            sent += phase_sent
    return rows, sent


def _profile(gw: Gateway, args: argparse.Namespace, phase: str) -> subprocess.Popen[bytes] | None:
    """py-spy on the gateway during ``phase`` when ``--profile`` names it (stopped by _stop_profile)."""
    if not args.profile or phase not in args.profile_phase or phase not in args.phases:
        return None
    cmd = [
        shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"),
        "record",
        "--pid",
        str(gw.proc.pid),
        "--format",
        "raw",
        "--rate",
        "200",
        "--nonblocking",
        *(["--subprocesses"] if args.workers > 1 else []),
        "--output",
        args.profile,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop_profile(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def cpu_plan(workers: int, pin: bool) -> tuple[str | None, str | None]:
    """(the gateway's CPUs, the load generator's) as taskset lists, or (None, None) unpinned."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) <= workers:
        return None, None
    return ",".join(map(str, cpus[:workers])), ",".join(map(str, cpus[workers:]))


def pin_load(workers: int, pin: bool = True) -> tuple[str | None, str | None, set[int] | None]:
    """``cpu_plan``, with this process (the load generator) moved onto the load CPUs: (the
    gateway's CPUs, the load's, the load's as a set for ``services_on``), all None unpinned."""
    gateway_cpus, load_cpus = cpu_plan(workers, pin)
    load_set = {int(c) for c in load_cpus.split(",")} if load_cpus else None
    if load_set:
        os.sched_setaffinity(0, load_set)
    return gateway_cpus, load_cpus, load_set


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="Length of each timed phase.")
    parser.add_argument("--rounds", type=int, default=10, help="Rounds of 64 concurrent streams for (c).")
    parser.add_argument("--slices", type=int, default=3,
                        help="(b) and (c): alternate this many short runs each way, direct and through the gateway.")
    parser.add_argument("--rates", default="500,1000", help="Offered requests/s of (b), comma-separated.")
    parser.add_argument("--workers", type=int, default=1, help="Gateway worker processes.")
    parser.add_argument("--no-pin", dest="pin", action="store_false", help="Do not pin processes to CPUs.")
    parser.add_argument("--wrk", action="store_true", help="Use wrk (Debian package) for (a).")
    parser.add_argument("--profile", help="py-spy raw (collapsed) profile of the gateway, written to this file.")
    parser.add_argument("--profile-phase", default="a", help="The phase --profile covers: a, b or c.")
    parser.add_argument("--phases", default="abc", help="Which of the phases (a) (b) (c) to run.")
    parser.add_argument("--upstream", choices=sorted(UPSTREAMS), default="lean",
                        help="The upstreams: lean (bench.lean_upstream) or echo (backends.dev.echo_server).")
    args = parser.parse_args()
    args.rates = [float(r) for r in args.rates.split(",") if r]
    gateway_cpus, load_cpus, load_set = pin_load(args.workers, args.pin)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with tempfile.TemporaryDirectory() as tmp, fresh_database() as db_url, services_on(load_set) as moved:
        work = Path(tmp)
        procs = {}
        try:
            procs["fast"], fast = start_upstream(cpus=load_cpus, module=UPSTREAMS[args.upstream])
            procs["slow"], slow = start_upstream("--latency", "0.02", cpus=load_cpus, module=UPSTREAMS[args.upstream])
            procs["streamy"], streamy = start_upstream("--output-words", "20", "--chunk-delay", "0.005", cpus=load_cpus,
                                                       module=UPSTREAMS[args.upstream])
            config = gateway_config(db_url, fast, slow, streamy, work / "journal")
            gw = start_gateway(config, work, args.workers, gateway_cpus)
            try:
                key = make_tenant_key(gw.url)
                ups = {"fast": fast, "slow": slow, "streamy": streamy}
                pids = {name: proc.pid for name, proc in procs.items()}
                rows, sent = asyncio.run(measure(args, gw, key, ups, pids, db_url))
                rss = [rss_mib(pid) for pid in worker_pids(gw.proc.pid)]
            finally:
                report_if_exited(gw)
                code = stop(gw.proc)
            rows.append(
                [
                    "(d) RSS per gateway worker after the run (MiB)",
                    "-",
                    ", ".join(f"{r:.0f}" for r in rss),
                    "-",
                    "<= 150 MiB",
                    f"exit code {code} after SIGTERM",
                ]
            )
            rows_in_db = asyncio.run(count_usage_rows(db_url))
            rows.append(
                [
                    "usage rows in PostgreSQL",
                    "-",
                    f"{rows_in_db:,}",
                    "-",
                    f"= requests sent ({sent:,}" + (", approx. with --wrk" if args.wrk else "") + ")",
                    "",
                ]
            )
        finally:
            for proc in procs.values():
                stop(proc)
    pinning = (f"gateway on CPUs {gateway_cpus}; load, upstreams, Redis and PostgreSQL ({len(moved)} processes) "
               f"on {load_cpus}" if gateway_cpus else "unpinned")
    print(f"{args.workers} gateway worker(s), {pinning}, {args.seconds:g} s phases")
    print(f"Python: {interpreter()}")
    print_table(rows)


if __name__ == "__main__":
    main()
