"""Chat streams a test holds open against a served gateway, for its shutdown and restart tests."""

from __future__ import annotations

import asyncio

import httpx

BODY = {"model": "echo", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


async def open_streams(client: httpx.AsyncClient, count: int, timeout: float = 30) -> list[asyncio.Task[list[str]]]:
    """``count`` streams, once each has its first chunk: each task's result is its events' data
    (``[DONE]`` last), or ends with ``"cut"`` when the connection broke."""
    started = asyncio.Event()
    firsts = 0

    async def one() -> list[str]:
        nonlocal firsts
        lines: list[str] = []
        try:
            async with client.stream("POST", "/v1/chat/completions", json=BODY) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        firsts += not lines
                        lines.append(line[6:])
                        if firsts == count:
                            started.set()
        except httpx.HTTPError:
            lines.append("cut")
        return lines

    tasks = [asyncio.create_task(one()) for _ in range(count)]
    await asyncio.wait_for(started.wait(), timeout)
    return tasks
