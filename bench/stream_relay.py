"""The gateway's own CPU per relayed stream chunk, in one process: pulled by the relay's task, or
pushed from the upstream connection's callback (``ChunkRelay.push``, what ``switchyard serve`` does).

The real parts, from the bytes an upstream sends to the bytes for the client: the upstream
connection's protocol and httptools parsing (``backends.raw_http``), the SSE lines, the chunk
decode and metering (``backends.openai_http``), and ``gateway.streaming.SSERelay`` with the public
model name rewritten into each chunk. Left out: the sockets (a transport that drops what is
written) and the event loop's I/O, so the figures are the Python work alone, with hot caches.

    .venv/bin/python -m bench.stream_relay [--chunks 20000] [--rounds 3]

"pulled" runs one event-loop turn per chunk, as a chunk arriving on its own does; that turn's
own cost (a bare turn, measured alongside) is subtracted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import uvloop

from backends.base import ChunkStream, Meter
from backends.openai_http import _chat_text
from backends.openai_relay import ChunkReader, ChunkRelay, UsageWanted
from backends.openai_wire import ChatCompletionChunk
from backends.raw_http import _Connection
from backends.raw_stream import RawStream
from backends.turn_writes import TurnWrites
from gateway.streaming import SSERelay

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


class _DroppingTransport:
    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Pool:
    def _release(self, conn: _Connection) -> None:
        pass


class _Upstream:
    async def close_stream(self, stream: RawStream) -> None:
        stream.close()


def upstream_chunk(i: int) -> bytes:
    """One chunk as an OpenAI-compatible upstream sends it: an SSE event in an HTTP/1.1 chunk."""
    event = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1733300000, "model": "upstream",
             "choices": [{"index": 0, "delta": {"content": f"w{i} "}, "finish_reason": None}]}
    body = b"data: " + json.dumps(event).encode() + b"\n\n"
    return b"%x\r\n%b\r\n" % (len(body), body)


async def open_relay(push: bool, written: list[int]) -> tuple[_Connection, AsyncIterator[bytes]]:
    """A relay over a connection that has answered with its headers and first chunk."""
    conn = _Connection(TurnWrites(asyncio.get_running_loop()))
    conn.connection_made(_DroppingTransport())  # type: ignore[arg-type]
    slots = asyncio.Semaphore(1)
    await slots.acquire()
    stream = RawStream(conn, _Pool(), slots)  # type: ignore[arg-type]
    answer = asyncio.ensure_future(conn.exchange(b"", stream))
    await asyncio.sleep(0)
    conn.data_received(HEAD + upstream_chunk(0))
    await answer
    loop = asyncio.get_running_loop()
    reader = ChunkReader(stream, ChatCompletionChunk, 300.0)
    meter = Meter()
    first = await reader.next(loop.time() + 3600)
    relay = ChunkRelay(_Upstream(), stream, reader, first, loop.time() + 3600, meter,  # type: ignore[arg-type]
                       UsageWanted(False, False), _chat_text)

    async def on_end(*_: Any) -> None:
        pass

    sse = SSERelay(ChunkStream(relay, meter), "public", on_end)
    if push:
        sse.write_directly(lambda data: written.append(len(data)) is None)
    events = sse.events()
    await anext(events)  # the first chunk
    return conn, events


async def pushed(chunks: list[bytes]) -> float:
    written: list[int] = []
    conn, events = await open_relay(True, written)
    relay = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0)  # the relay is pushing
    t0 = time.perf_counter()
    for chunk in chunks:
        conn.data_received(chunk)
    elapsed = time.perf_counter() - t0
    relay.cancel()
    assert len(written) == len(chunks)
    return elapsed


async def pulled(chunks: list[bytes]) -> float:
    conn, events = await open_relay(False, [])
    taken = 0

    async def take() -> None:  # what the response does with each event: anext, then send
        nonlocal taken
        async for _ in events:
            taken += 1
            if taken == len(chunks):
                return

    relay = asyncio.ensure_future(take())
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    for chunk in chunks:
        conn.data_received(chunk)
        await asyncio.sleep(0)  # a loop turn: the relay's task wakes and takes the chunk
    elapsed = time.perf_counter() - t0
    await relay
    return elapsed


async def bare_turns(n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        await asyncio.sleep(0)
    return time.perf_counter() - t0


async def main(args: argparse.Namespace) -> None:
    chunks = [upstream_chunk(i) for i in range(1, args.chunks + 1)]
    for round_ in range(1, args.rounds + 1):
        turn = await bare_turns(len(chunks)) / len(chunks)
        pull = await pulled(chunks) / len(chunks) - turn
        push = await pushed(chunks) / len(chunks)
        print(f"round {round_}: pulled {pull * 1e6:.2f} us per chunk (after a bare loop turn's {turn * 1e6:.2f}), "
              f"pushed {push * 1e6:.2f} us per chunk")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    uvloop.run(main(parser.parse_args()))
