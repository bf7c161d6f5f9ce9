"""backends.turn_writes on real socket pairs (the upstream client's use of it: tests/backends/test_raw_http.py)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from backends.turn_writes import TurnWrites


def unread(peer: socket.socket) -> bytes:
    """What has reached ``peer`` so far, without waiting."""
    try:
        return peer.recv(1 << 16, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return b""


@contextmanager
def socket_pairs(n: int) -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    pairs = [socket.socketpair() for _ in range(n)]
    try:
        yield pairs
    finally:
        for ours, peer in pairs:
            ours.close()
            peer.close()


async def test_a_turns_first_write_goes_at_once_and_the_rest_at_its_end() -> None:
    loop = asyncio.get_running_loop()
    writes = TurnWrites(loop)
    with socket_pairs(3) as pairs:
        transports = [(await loop.create_connection(asyncio.Protocol, sock=ours))[0] for ours, _ in pairs]
        for i, transport in enumerate(transports):
            writes.write(transport, b"request %d" % i)
        assert [unread(peer) for _, peer in pairs] == [b"request 0", b"", b""]
        await asyncio.sleep(0)  # the turn ends
        assert [unread(peer) for _, peer in pairs] == [b"", b"request 1", b"request 2"]
        writes.write(transports[2], b"next turn")
        assert unread(pairs[2][1]) == b"next turn"  # the first of its turn again: at once
        for transport in transports:
            transport.close()


async def test_a_write_whose_connection_was_aborted_is_dropped() -> None:
    loop = asyncio.get_running_loop()
    writes = TurnWrites(loop)
    with socket_pairs(2) as pairs:
        first, second = [(await loop.create_connection(asyncio.Protocol, sock=ours))[0] for ours, _ in pairs]
        writes.write(first, b"sent")
        writes.write(second, b"never sent")
        second.abort()  # e.g. its request was cancelled before the turn ended
        await asyncio.sleep(0.01)
        assert unread(pairs[0][1]) == b"sent"
        assert unread(pairs[1][1]) == b""  # end of stream: the connection went without the request
        first.close()



class RefusingTransport(asyncio.Transport):
    """A transport whose write raises (what a broken one might do)."""

    def __init__(self) -> None:
        super().__init__()
        self.aborted = False

    def is_closing(self) -> bool:
        return self.aborted

    def write(self, data: bytes | bytearray | memoryview) -> None:
        raise RuntimeError("refused")

    def abort(self) -> None:
        self.aborted = True


async def test_a_write_that_raises_aborts_its_connection_and_the_others_still_go() -> None:
    loop = asyncio.get_running_loop()
    writes = TurnWrites(loop)
    with socket_pairs(2) as pairs:
        first, last = [(await loop.create_connection(asyncio.Protocol, sock=ours))[0] for ours, _ in pairs]
        refusing = RefusingTransport()
        writes.write(first, b"first")
        writes.write(refusing, b"refused")
        writes.write(last, b"after it")
        await asyncio.sleep(0)
        assert refusing.aborted
        assert unread(pairs[1][1]) == b"after it"
        first.close()
        last.close()
