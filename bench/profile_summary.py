"""Where a gateway request's time goes, from a py-spy raw profile (``bench.gateway --profile``).

    .venv/bin/python -m bench.profile_summary prof.txt [--cpu-ms 0.5] [--top 25]

Each sample goes to the first stage (innermost frame first) whose pattern one of its frames
matches; ``--cpu-ms`` (the bench's "gateway CPU per request") turns shares into microseconds per
request. Native time (the event loop's C code, system calls made from C) shows under the Python
frame that called it, or as "event loop" when none did. Threads that py-spy saw waiting on a lock
(logging's queue listener) and the usage write-ahead thread (its samples are mostly an fsync
that holds no GIL) are counted but left out of the shares.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

# (stage, substrings of a frame "function (file:line)"), innermost match wins
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("usage: buffer + write to SQL (background)", ("UsageWriter.", "gateway/usage/", "sqlalchemy/", "asyncpg/")),
    ("quotas: Redis admission", ("Pipeline._admit",)),
    ("quotas: Redis settlement", ("QuotaAdmission.settle",)),
    ("auth: key cache", ("authenticate_request", "Pipeline.authenticate", "gateway/auth/", "gateway/caching.py")),
    ("body: decode + validate", ("gateway/body.py", "create_dto_extractor")),
    ("call description (estimates)", ("describe_chat", "describe_completion")),
    ("upstream: HTTP client", ("aiohttp/", "HTTPUpstream.", "raw_http.py")),
    ("upstream: payload + answer decode", ("OpenAIHTTPBackend.", "backends/openai_wire.py")),
    ("stream relay (chunks)", ("SSERelay.", "ChunkRelay.", "ChunkReader.", "SSELines.")),
    ("routing", ("RoutePlan", "gateway/routing/")),
    ("settlement: usage record, metrics", ("Pipeline._settle", "MeteredSink", "hooks.on_settle")),
    ("response building", ("Pipeline._unary_response", "Pipeline._stream_response", "litestar/response/")),
    ("pipeline (other)", ("gateway/pipeline.py",)),
    (WAITING := "threads waiting on a lock", ("threading.py",)),
    ("telemetry middleware + access log", ("gateway/telemetry/", "logging/")),
    ("security headers", ("add_security_headers",)),
    ("Litestar (routing, DI, middleware)", ("litestar/",)),
    ("uvicorn + httptools (HTTP/1.1 server)", ("uvicorn/",)),
    ("event loop (native)", ("Runner.run",)),
]


WAL_THREAD = "the usage write-ahead thread (mostly in fsync, which py-spy counts as busy)"


def summarise(path: Path) -> tuple[Counter[str], int]:
    stages: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")[::-1]
        if any("WriteAhead._run" in f for f in frames):
            stages[WAL_THREAD] += n
            continue
        stage = next((name for f in frames for name, pats in STAGES if any(p in f for p in pats)), "other")
        stages[stage] += n
    return stages, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", type=Path)
    parser.add_argument("--cpu-ms", type=float, help="The gateway's CPU milliseconds per request.")
    args = parser.parse_args()
    stages, total = summarise(args.profile)
    waiting = stages.pop(WAITING, 0)
    wal = stages.pop(WAL_THREAD, 0)
    active = total - waiting - wal
    print(f"{total} samples: {waiting} of threads waiting on a lock, {wal} of {WAL_THREAD}; "
          f"shares of the other {active}, the event loop's thread")
    for name, n in stages.most_common():
        us = f"  {n / active * args.cpu_ms * 1000:6.1f} us/request" if args.cpu_ms else ""
        print(f"{n / active:6.1%}{us}  {name}")


if __name__ == "__main__":
    main()
