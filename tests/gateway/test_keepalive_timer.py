"""``gateway.keepalive.KeepAlives``: the one timer that visits the relayed streams."""

from __future__ import annotations

import asyncio

from gateway.keepalive import KeepAlives


async def test_streams_are_visited_until_discarded_and_one_failing_stops_none() -> None:
    keepalives = KeepAlives(0.01)
    visits: list[str] = []

    def failing() -> None:
        visits.append("failing")
        raise RuntimeError("the client's transport broke")

    def beat() -> None:
        visits.append("beat")

    keepalives.add(failing)
    keepalives.add(beat)
    async with asyncio.timeout(10):
        while visits.count("beat") < 3:  # visited again and again, the failure notwithstanding
            await asyncio.sleep(0.01)
    assert visits.count("failing") >= 2
    keepalives.discard(failing)
    keepalives.discard(beat)
    await asyncio.sleep(0.05)  # at most one visit was under way
    seen = len(visits)
    await asyncio.sleep(0.1)
    assert len(visits) == seen  # no stream left: no visit


async def test_closing_stops_the_visits() -> None:
    keepalives = KeepAlives(0.01)
    visits: list[None] = []
    keepalives.add(lambda: visits.append(None))
    async with asyncio.timeout(10):
        while not visits:
            await asyncio.sleep(0.01)
    keepalives.close()
    seen = len(visits)
    await asyncio.sleep(0.1)
    assert len(visits) == seen
