"""A gateway worker's memory over rounds of non-streamed load: does it grow, and what is it made of?

    .venv/bin/python -m bench.rss_rounds [--rounds 8] [--seconds 10]

``bench.gateway``'s production path and pinning (the gateway on its own CPU; load generator,
upstream, Redis and PostgreSQL on the others), one upstream answering at once. Each round is a
closed loop of 64 connections for ``--seconds``; after it the worker's anonymous and file-backed
resident memory (``RssAnon``, ``RssFile`` of ``/proc/PID/status``) is read right away and again
once every usage row of the rounds so far is in PostgreSQL. ``RssFile`` includes the usage
write-ahead segment's mapped pages for the records not yet written to SQL, so the first reading
grows with how far PostgreSQL is behind; the second shows what stays.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from bench.gateway import CHAT, gateway_config, pin_load
from bench.harness import (
    UPSTREAMS,
    fresh_database,
    interpreter,
    make_tenant_key,
    print_table,
    running_gateway,
    services_on,
    start_upstream,
    stop,
    usage_caught_up,
    worker_pids,
)
from bench.loadgen import closed_loop, http_request


def resident_mib(pid: int) -> tuple[float, float]:
    """(RssAnon, RssFile) of ``pid`` in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["RssAnon"].split()[0]) / 1024, int(fields["RssFile"].split()[0]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8, help="Rounds of load.")
    parser.add_argument("--seconds", type=float, default=10.0, help="Length of each round.")
    args = parser.parse_args()
    gateway_cpus, load_cpus, load_set = pin_load(1)
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp, fresh_database() as db_url, services_on(load_set):
        proc, fast = start_upstream(cpus=load_cpus, module=UPSTREAMS["lean"])
        try:
            config = gateway_config(db_url, fast, fast, fast, Path(tmp) / "journal")
            with running_gateway(config, Path(tmp), 1, gateway_cpus) as gw:
                key = make_tenant_key(gw.url)
                pid = (worker_pids(gw.proc.pid) or [gw.proc.pid])[0]
                anon, mapped = resident_mib(pid)
                rows.append(["start", "-", "-", "-", f"{anon:.1f}", f"{mapped:.1f}"])
                target = http_request(gw.url, "/v1/chat/completions", CHAT | {"model": "fast"}, key)
                sent = 0
                for i in range(args.rounds):
                    run = asyncio.run(closed_loop(target, 64, args.seconds))
                    sent += len(run.results)
                    after = resident_mib(pid)
                    asyncio.run(usage_caught_up(db_url, sent))
                    written = resident_mib(pid)
                    rows.append([str(i + 1), f"{len(run.ok) / run.seconds:,.0f}", f"{after[0]:.1f}", f"{after[1]:.1f}",
                                 f"{written[0]:.1f}", f"{written[1]:.1f}"])
        finally:
            stop(proc)
    print(f"gateway on CPUs {gateway_cpus}, load on {load_cpus}; Python: {interpreter()}")
    print_table(rows, ["round", "requests/s", "RssAnon after (MiB)", "RssFile after", "RssAnon written",
                       "RssFile written"])


if __name__ == "__main__":
    main()
