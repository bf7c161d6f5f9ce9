"""Where a stream's first chunk waits inside the gateway: each step of a streamed request's way from
its bytes read to its response's head written with the first chunk, as percentiles, for 64 streams
kept up and in bursts (``bench.gateway``'s (c)), through the production path (SQL API keys, Redis
quotas, PostgreSQL metering) on a pinned core.

    .venv/bin/python -m bench.stream_wait [--seconds 12] [--rounds 30] [--shapes kept-up,bursts]

The gateway process runs with ``bench/probes`` on its path, whose ``sitecustomize`` stamps each
step in the gateway's own functions (its docstring names them) and writes the stamps at exit; one
gateway per load shape. Each step waits for its own work and for the event loop's other work
(other streams' chunks, other requests), and the upstream step for the upstream on the load CPU:
a column "mean in the slowest 2 %" shows which steps the slowest first chunks lost their time in.
A step's percentiles do not add up to the whole's. The probe adds a few microseconds per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from functools import partial
from pathlib import Path

from bench.gateway import CHAT, STREAM_SECONDS, gateway_config, gateway_cpu, pin_load
from bench.harness import (
    UPSTREAMS,
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
from bench.loadgen import Run, bursts, closed_loop, http_request

PROBES = Path(__file__).parent / "probes"
SLOWEST = 0.02


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def table(segments: list[str], samples: list[list[float]]) -> list[list[str]]:
    """A row per step and one for the whole (ms): p50, p90, p99, and the mean over the samples
    whose whole is among the slowest ``SLOWEST``."""
    wholes = [sum(s) for s in samples]
    by_whole = sorted(range(len(samples)), key=wholes.__getitem__)
    slow = [samples[i] for i in by_whole[-max(1, int(len(samples) * SLOWEST)):]]
    rows = []
    for i, name in enumerate([*segments, "whole: request read -> first chunk written"]):
        values = [s[i] if i < len(segments) else w for s, w in zip(samples, wholes, strict=True)]
        slow_mean = sum(s[i] if i < len(segments) else sum(s) for s in slow) / len(slow)
        rows.append([name, *(f"{pct(values, q) * 1000:.3f}" for q in (0.5, 0.9, 0.99)), f"{slow_mean * 1000:.3f}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=12.0, help="Length of the kept-up run.")
    parser.add_argument("--rounds", type=int, default=30, help="Rounds of 64 streams at once for the bursts.")
    parser.add_argument("--shapes", default="kept-up,bursts", help="Load shapes, comma-separated: kept-up, bursts.")
    args = parser.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    gateway_cpus, load_cpus, load_set = pin_load(1)
    loads = {
        "kept-up": partial(closed_loop, connections=64, seconds=args.seconds, stagger=STREAM_SECONDS),
        "bursts": partial(bursts, concurrency=64, rounds=args.rounds),
    }
    print(f"gateway on CPUs {gateway_cpus}, load, upstream, Redis and PostgreSQL on {load_cpus}; "
          f"Python: {interpreter()}")
    with tempfile.TemporaryDirectory() as tmp, fresh_database() as db_url, services_on(load_set):
        proc, streamy = start_upstream("--output-words", "20", "--chunk-delay", "0.005", cpus=load_cpus,
                                       module=UPSTREAMS["lean"])
        try:
            for shape in shapes:
                out = Path(tmp) / f"{shape}.json"
                os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROBES), os.environ.get("PYTHONPATH")]))
                os.environ["STREAM_WAIT_OUT"] = str(out)
                try:
                    config = gateway_config(db_url, streamy, streamy, streamy, Path(tmp) / f"journal-{shape}")
                    gw = start_gateway(config, Path(tmp), 1, gateway_cpus)
                finally:
                    del os.environ["STREAM_WAIT_OUT"]
                try:
                    key = make_tenant_key(gw.url)
                    target = http_request(gw.url, "/v1/chat/completions", CHAT | {"model": "streamy", "stream": True},
                                          key)
                    warm = asyncio.run(closed_loop(target, 16, 1.0))  # warm-up: key cache, pools, lazy imports
                    cpu0 = gateway_cpu(gw)
                    run: Run = asyncio.run(loads[shape](target))
                    busy = (gateway_cpu(gw) - cpu0) / run.seconds
                finally:
                    report_if_exited(gw)
                    stop(gw.proc)
                found = json.loads(out.read_text())
                del found["samples"][: len(warm.results)]  # the warm-up's, about: first chunks come in order
                print(f"\n{shape}: {len(run.ok)} streams ({run.errors + len(run.results) - len(run.ok)} errors), "
                      f"{len(found['samples'])} first chunks timed, the gateway {busy:.0%} busy")
                print_table(table(found["segments"], found["samples"]),
                            ["step (ms)", "p50", "p90", "p99", f"mean in the slowest {SLOWEST:.0%}"])
        finally:
            stop(proc)


if __name__ == "__main__":
    main()
