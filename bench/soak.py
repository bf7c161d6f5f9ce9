"""Soak: 1,000 concurrent streaming requests through one gateway worker for a few minutes.

The production path as in ``bench.gateway`` (PostgreSQL keys and usage, Redis quotas with high
limits), an echo upstream streaming 20 chunks 50 ms apart. Rounds of ``--concurrency`` streams
at once run until ``--seconds`` have passed. Reports errors (must be 0), usage rows against
requests sent (must be equal, after SIGTERM flushed the buffer) and the gateway's RSS at the
start, middle and end (must stay flat).

    .venv/bin/python -m bench.soak [--seconds 180] [--concurrency 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
from pathlib import Path

from bench.gateway import gateway_config
from bench.harness import (
    count_usage_rows,
    fresh_database,
    make_tenant_key,
    print_table,
    report_if_exited,
    rss_mib,
    start_gateway,
    start_upstream,
    stop,
)
from bench.loadgen import Conn, http_request

KEEP_ALIVE_SECONDS = 4.0  # uvicorn closes idle keep-alive connections after 5 s


async def soak(
    url: str, key: str, concurrency: int, seconds: float, pid: int
) -> tuple[int, dict[str, int], list[float]]:
    body = {"model": "streamy", "stream": True, "messages": [{"role": "user", "content": "soak"}], "max_tokens": 32}
    host, port, raw = http_request(url, "/v1/chat/completions", body, key)
    sent = 0
    kinds: dict[str, int] = {}  # what went wrong (status or exception), and how often
    rss: list[float] = []  # after the first round (warm), at the middle, at the end
    rounds_rss: list[float] = []  # after every round, to tell a plateau from a leak
    started = time.monotonic()
    middle_taken = False

    # One keep-alive connection per client, reopened once idle for longer than the server keeps it.
    conns: list[tuple[Conn, float] | None] = [None] * concurrency

    async def one(i: int) -> str:
        held, conns[i] = conns[i], None
        if held is not None and time.monotonic() - held[1] > KEEP_ALIVE_SECONDS:
            held[0].close()
            held = None
        conn = held[0] if held is not None else await Conn.open(host, port)
        status = str((await conn.request(raw)).status)
        conns[i] = (conn, time.monotonic())
        return status

    while time.monotonic() - started < seconds:
        outcomes = await asyncio.gather(*(one(i) for i in range(concurrency)), return_exceptions=True)
        sent += len(outcomes)
        for outcome in outcomes:
            if outcome != "200":
                kind = outcome if isinstance(outcome, str) else type(outcome).__name__
                kinds[kind] = kinds.get(kind, 0) + 1
        rounds_rss.append(rss_mib(pid))
        if not rss:
            rss.append(rounds_rss[-1])
        if not middle_taken and time.monotonic() - started >= seconds / 2:
            rss.append(rss_mib(pid))
            middle_taken = True
    rss.append(rss_mib(pid))
    for held in conns:
        if held is not None:
            held[0].close()
    print("gateway RSS after each round (MiB):", " ".join(f"{r:.0f}" for r in rounds_rss))
    return sent, kinds, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--concurrency", type=int, default=1000)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))  # children inherit it
    with tempfile.TemporaryDirectory() as tmp, fresh_database() as db_url:
        work = Path(tmp)
        up, streamy = start_upstream("--output-words", "20", "--chunk-delay", "0.05")
        try:
            config = gateway_config(db_url, streamy, streamy, streamy, work / "journal")
            for group in config["models"]:
                group["deployments"][0]["max_concurrency"] = args.concurrency + 64
            gw = start_gateway(config, work)
            try:
                key = make_tenant_key(gw.url)
                sent, errors, rss = asyncio.run(soak(gw.url, key, args.concurrency, args.seconds, gw.proc.pid))
            finally:
                report_if_exited(gw)
                code = stop(gw.proc)
            rows = asyncio.run(count_usage_rows(db_url))
            problems = [line for line in gw.log.read_text().splitlines() if "ERROR" in line or "rror" in line][-5:]
        finally:
            stop(up)
    print_table(
        [
            ["streams sent", f"{sent:,}", f"{args.concurrency} at a time for {args.seconds:.0f} s"],
            ["errors", f"{sum(errors.values())} {errors or ''}".strip(), "0"],
            ["usage rows in PostgreSQL", f"{rows:,}", f"= streams sent (gateway exit code {code} after SIGTERM)"],
            ["gateway RSS after round 1 / middle / end (MiB)", " / ".join(f"{r:.0f}" for r in rss), "flat"],
        ],
        ["measurement", "value", "target"],
    )
    if problems:
        print("last errors in the gateway's log:", *problems, sep="\n  ")


if __name__ == "__main__":
    main()
