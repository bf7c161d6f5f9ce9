"""What a streamed request costs the gateway, split into what every stream pays once and what each
chunk adds, next to a non-streamed request: CPU per request through the whole production path of
``bench.gateway`` (SQL API keys, Redis quotas, routing, PostgreSQL metering), for streams of a few
lengths at one concurrency.

    .venv/bin/python -m bench.stream_cost [--words 1,5,20] [--connections 256] [--seconds 5]
                                          [--chunk-delay 0.005]

One ``bench.lean_upstream`` per length (a role chunk, ``--words`` content chunks, the finish and
usage chunks, ``--chunk-delay`` apart), and the gateway on its own pinned CPU with the load generator,
upstreams, Redis and PostgreSQL on the others, as ``bench.gateway`` runs them. Each row is a closed
loop of ``--connections`` keep-alive connections (their streams started evenly over the first
stream's length): requests/s, the gateway's CPU per request, and the share of its core that is.
The default keeps the core busy in every row (the share reads 98-100 %), as in (a) and in a burst;
a lighter load costs more per stream and per chunk, as each event then wakes the loop on its own
(on the 2-core host, 16 connections: 0.54 ms + 59 us per chunk; 128 connections, the longest
streams' row at 90-93 %: 0.28-0.32 ms + 26-27 us).
The last lines fit CPU per stream = fixed + per chunk x chunks over the stream rows (least
squares), and set the fixed part beside the non-streamed request's cost.

The split bounds bursts of new streams (``bench.gateway``'s "(c) bursts"): 64 streams that start
at the same instant need 64 times the part of the fixed cost that comes before a first chunk, of one
core, before the last of them has its first chunk, in whatever order the work is done.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from bench.gateway import CHAT, gateway_config, gateway_cpu, pin_load
from bench.harness import (
    fresh_database,
    interpreter,
    make_tenant_key,
    print_table,
    running_gateway,
    services_on,
    start_upstream,
    stop,
)
from bench.loadgen import closed_loop, http_request

LEAN = "bench.lean_upstream"
EXTRA_CHUNKS = 3  # besides the content chunks: the role, finish and usage chunks ([DONE] is not one)


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through ``points`` (x, y); two x values at least."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--words", default="1,5,20", help="Content chunks per stream, comma-separated (two at least).")
    parser.add_argument("--connections", type=int, default=256, help="Concurrent connections of each closed loop.")
    parser.add_argument("--seconds", type=float, default=5.0, help="Length of each timed run.")
    parser.add_argument("--chunk-delay", type=float, default=0.005, help="Seconds between a stream's chunks.")
    args = parser.parse_args()
    lengths = sorted({int(w) for w in args.words.split(",") if w})
    if len(lengths) < 2:
        parser.error("--words needs two lengths at least, to split a stream's cost")
    gateway_cpus, load_cpus, load_set = pin_load(1)
    rows: list[list[str]] = []
    streams: list[tuple[float, float]] = []  # (chunks, CPU ms per stream)
    unary = 0.0
    with tempfile.TemporaryDirectory() as tmp, fresh_database() as db_url, services_on(load_set):
        ups = {w: start_upstream("--output-words", str(w), "--chunk-delay", str(args.chunk_delay), cpus=load_cpus,
                                 module=LEAN) for w in lengths}
        try:
            config = gateway_config(db_url, ups[lengths[0]][1], ups[lengths[0]][1], ups[lengths[0]][1],
                                    Path(tmp) / "journal")
            config["models"] = [
                {"name": f"w{w}", "max_retries": 0,
                 "deployments": [{"provider": "openai", "model": "echo", "api_base": url + "/v1", "api_key": "sk-up"}]}
                for w, (_, url) in ups.items()
            ]
            with running_gateway(config, Path(tmp), 1, gateway_cpus) as gw:
                key = make_tenant_key(gw.url)
                runs = [("non-streamed", lengths[0], False), *(("stream", w, True) for w in lengths)]
                for kind, words, stream in runs:
                    target = http_request(gw.url, "/v1/chat/completions",
                                          CHAT | {"model": f"w{words}", "stream": stream, "max_tokens": words}, key)
                    length = (words + EXTRA_CHUNKS) * args.chunk_delay if stream else 0.0
                    asyncio.run(closed_loop(target, args.connections, 0.5, stagger=length))  # warm-up
                    cpu0 = gateway_cpu(gw)
                    run = asyncio.run(closed_loop(target, args.connections, args.seconds, stagger=length))
                    cpu = gateway_cpu(gw) - cpu0
                    per = cpu * 1000 / max(1, len(run.results))
                    errors = run.errors + len(run.results) - len(run.ok)
                    if stream:
                        streams.append((words + EXTRA_CHUNKS, per))
                    else:
                        unary = per
                    rows.append([kind, str(words + EXTRA_CHUNKS) if stream else "-",
                                 f"{len(run.results) / run.seconds:,.0f}", f"{per:.3f}", f"{cpu / run.seconds:.0%}",
                                 f"errors {errors}"])
        finally:
            for proc, _ in ups.values():
                stop(proc)
    fixed, per_chunk = fit(streams)
    print(f"gateway on CPUs {gateway_cpus}, load on {load_cpus}; {args.connections} connections, "
          f"{args.seconds:g} s runs, chunks {args.chunk_delay * 1000:g} ms apart")
    print(f"Python: {interpreter()}")
    print_table(rows, ["request", "chunks", "requests/s", "gateway CPU per request (ms)", "of the core", "notes"])
    print(f"a stream: {fixed:.3f} ms + {per_chunk * 1000:.1f} us per chunk "
          f"(least squares over the stream rows); a non-streamed request: {unary:.3f} ms, "
          f"so a stream's fixed part is {fixed / unary:.1f} of them")


if __name__ == "__main__":
    main()
