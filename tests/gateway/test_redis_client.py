"""The quota store's Redis client (gateway/quotas/redis_client.py) against a real redis-server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis

from gateway.quotas import redis_client
from gateway.quotas.redis_client import RedisError, RedisUnavailable, RespClient, encode_command
from tests.support.redis_server import RedisProcess

DEAD = "redis://127.0.0.1:9/0"  # nothing listens on port 9


@pytest.fixture
def server() -> Iterator[RedisProcess]:
    proc = RedisProcess().start()
    yield proc
    proc.stop()


def test_encoding() -> None:
    assert encode_command(("SET", "k", 1.5, b"\x00")) == b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\n1.5\r\n$1\r\n\x00\r\n"


def test_encoding_with_remembered_arguments_keeps_each_type_apart() -> None:
    """Equal-hashing 1, 1.0 and True never share an encoding; the remembered ones stay bounded."""
    once = encode_command(("EVALSHA", "k", 1, 1.0, True, b"1", "1"))
    assert once == encode_command(("EVALSHA", "k", 1, 1.0, True, b"1", "1"))
    assert once == b"*7\r\n$7\r\nEVALSHA\r\n$1\r\nk\r\n$1\r\n1\r\n$3\r\n1.0\r\n$4\r\nTrue\r\n$1\r\n1\r\n$1\r\n1\r\n"
    assert encode_command((True, 1)) == b"*2\r\n$4\r\nTrue\r\n$1\r\n1\r\n"
    for i in range(3 * redis_client._BULK_CACHE_SIZE):
        assert encode_command((f"key:{i}", i)) == b"*2\r\n$%d\r\nkey:%d\r\n$%d\r\n%d\r\n" % (
            len(str(i)) + 4, i, len(str(i)), i)
    assert len(redis_client._BULK_CACHE) <= redis_client._BULK_CACHE_SIZE


async def test_concurrent_commands_get_their_own_replies(server: RedisProcess) -> None:
    client = RespClient.from_url(server.url)
    try:
        replies = await asyncio.gather(*(client.execute("INCRBY", f"k{i % 7}", i) for i in range(500)))
        expected: dict[int, int] = {}
        for i, reply in enumerate(replies):
            expected[i % 7] = expected.get(i % 7, 0) + i
            assert reply == expected[i % 7]  # in order, per key: each caller got its own answer
        assert await client.ping()
    finally:
        await client.aclose()


async def test_scripts_load_themselves_and_errors_raise(server: RedisProcess) -> None:
    client = RespClient.from_url(server.url)
    try:
        script = client.register_script("return {KEYS[1], tonumber(ARGV[1]) + 1}")
        assert await script(keys=["a"], args=[41]) == [b"a", 42]  # NOSCRIPT -> EVAL, then cached
        await client.execute("SCRIPT", "FLUSH")
        assert await script(keys=["b"], args=[1]) == [b"b", 2]
        with pytest.raises(RedisError, match="ERR"):
            await client.execute("NOSUCHCOMMAND")
        assert await client.execute("SET", "x", "y") == b"OK"  # the connection is still in step
    finally:
        await client.aclose()


async def test_submitted_commands_go_out_in_order_without_waiting(server: RedisProcess) -> None:
    client = RespClient.from_url(server.url)
    try:
        first = client.submit("SET", "n", 1)  # no connection yet: sent once one is open
        assert await first == b"OK"
        sent = [client.submit("INCR", "n") for _ in range(5)]  # not awaited ...
        assert await client.execute("GET", "n") == b"6"  # ... yet done before a later command
        assert [await s for s in sent] == [2, 3, 4, 5, 6]
        script = client.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
        await client.execute("SCRIPT", "FLUSH")
        assert await script.submit(keys=["n"], args=[10]) == 16  # NOSCRIPT: sent whole, still answered
        assert await script.submit(keys=["n"], args=[1]) == 17
        failed = client.submit("NOSUCHCOMMAND")
        with pytest.raises(RedisError, match="ERR"):
            await failed
    finally:
        await client.aclose()


async def test_a_script_sent_without_waiting_runs_before_later_commands_on_a_new_server(
        server: RedisProcess) -> None:
    """A server that never saw the script (new, or restarted: its script cache is empty) still runs
    it before the commands sent after it: a settlement is counted before the next admission."""
    client = RespClient.from_url(server.url)
    try:
        await client.execute("SCRIPT", "FLUSH")
        await client.aclose()  # a new connection, as after a restart
        script = client.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
        await client.execute("SET", "n", 0)
        settled = script.submit(keys=["n"], args=[5])  # not awaited
        assert await client.execute("GET", "n") == b"5"
        assert await settled == 5
        assert await client.execute("SCRIPT", "EXISTS", script.sha) == [1]
        broken = client.register_script("return (")  # a script Redis cannot load: its own error
        with pytest.raises(RedisError, match="(?i)compil|syntax|error"):
            await broken.submit(keys=[], args=[])
        assert await client.execute("GET", "n") == b"5"  # still in step
    finally:
        await client.aclose()


async def test_a_command_waited_for_leaves_at_once_one_not_waited_for_when_the_turn_ends(
        server: RedisProcess) -> None:
    """An admission does not wait for the loop's turn to end before Redis has it; a settlement
    (nobody waits on it) goes out with the turn's others, and the first carries any left pending."""
    client = RespClient.from_url(server.url)
    observer = redis.Redis.from_url(server.url)  # a second, blocking connection: sees what Redis has now
    try:
        await client.execute("PING")
        protocol = client._protocol
        assert protocol is not None
        later = client.submit("SET", "later", 1)
        time.sleep(0.2)  # still this turn of the loop
        assert observer.get("later") is None
        now = protocol.send(encode_command(("SET", "now", 1)))  # as execute sends
        time.sleep(0.2)
        assert observer.mget("later", "now") == [b"1", b"1"]  # both written, in order, before the turn ended
        assert await later == b"OK" and await now == b"OK"
    finally:
        observer.close()
        await client.aclose()


async def test_a_command_waited_for_joins_the_turns_end_while_redis_is_behind(server: RedisProcess) -> None:
    """With more than PIPELINE_BEYOND commands written and unanswered, an admission goes out at the
    turn's end (with whatever else is left for it), in order; once they are answered it leaves at
    once again. Commands only queued for the turn's end do not count."""
    client = RespClient.from_url(server.url)
    observer = redis.Redis.from_url(server.url)
    try:
        await client.execute("PING")
        protocol = client._protocol
        assert protocol is not None
        settled = [client.submit("INCR", "settled") for _ in range(redis_client.PIPELINE_BEYOND + 5)]
        first = protocol.send(encode_command(("SET", "first", 1)))  # only queued: written at once, with them
        queued = protocol.send(encode_command(("SET", "queued", 1)))  # now all those are written, unanswered
        time.sleep(0.2)  # still this turn of the loop: no reply read
        assert observer.mget("settled", "first", "queued") == [b"%d" % len(settled), b"1", None]
        assert await queued == b"OK" and await first == b"OK"
        assert await asyncio.gather(*settled) == list(range(1, len(settled) + 1))
        now = protocol.send(encode_command(("SET", "now", 1)))
        time.sleep(0.2)
        assert observer.get("now") == b"1"
        assert await now == b"OK"
    finally:
        observer.close()
        await client.aclose()


async def test_a_subscription_gets_each_message_until_its_connection_closes(server: RedisProcess) -> None:
    admin = RespClient.from_url(server.url)
    await admin.execute("CONFIG", "SET", "requirepass", "s3cret")
    await admin.execute("AUTH", "s3cret")
    try:
        got: list[bytes] = []
        with pytest.raises(RedisError, match="WRONGPASS|invalid"):
            await RespClient.from_url(f"redis://:wrong@127.0.0.1:{server.port}/0").subscribe("ch", got.append)
        subscription = await RespClient.from_url(f"redis://:s3cret@127.0.0.1:{server.port}/0").subscribe(
            "ch", got.append)
        assert await admin.execute("PUBLISH", "ch", "one") == 1 and await admin.execute("PUBLISH", "other", "x") == 0
        await admin.execute("PUBLISH", "ch", b"two")
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert got == [b"one", b"two"] and not subscription.closed.done()
        await admin.execute("CLIENT", "KILL", "TYPE", "pubsub")
        await asyncio.wait_for(subscription.closed, 5)
    finally:
        await admin.aclose()


async def test_select_and_auth_from_the_url(server: RedisProcess) -> None:
    admin = RespClient.from_url(server.url)
    await admin.execute("CONFIG", "SET", "requirepass", "s3cret")
    try:
        client = RespClient.from_url(f"redis://:s3cret@127.0.0.1:{server.port}/3")
        await client.execute("SET", "where", "db3")
        assert await admin.execute("AUTH", "s3cret") == b"OK"
        assert await admin.execute("GET", "where") is None  # db 0
        await admin.execute("SELECT", 3)
        assert await admin.execute("GET", "where") == b"db3"
        with pytest.raises(RedisError, match="AUTH"):
            await RespClient.from_url(f"redis://:wrong@127.0.0.1:{server.port}/0").execute("PING")
        await client.aclose()
    finally:
        await admin.aclose()


async def recovered(client: RespClient) -> None:
    """Wait for the client's background PING to find Redis answering again."""
    deadline = time.monotonic() + 5
    while client.failing:
        assert time.monotonic() < deadline, "the client did not find Redis back"
        await asyncio.sleep(0.02)


async def test_a_silent_server_fails_commands_at_once_until_it_answers_again(server: RedisProcess) -> None:
    """Once a command timed out, the next ones do not each wait for the timeout: they fail at once
    while a PING in the background finds out when Redis answers again; then they are sent again."""
    client = RespClient.from_url(server.url, timeout=0.5)
    script = client.register_script("return 1")
    try:
        assert await client.ping()
        server.pause()
        with pytest.raises(RedisUnavailable, match="within 0.5 s"):
            await client.execute("PING")
        assert client.failing
        t0 = time.monotonic()
        for _ in range(20):
            with pytest.raises(RedisUnavailable, match="fail at once"):
                await client.execute("PING")
            with pytest.raises(RedisUnavailable, match="fail at once"):
                await script(keys=[], args=[])
            with pytest.raises(RedisUnavailable, match="fail at once"):
                await client.submit("PING")
            with pytest.raises(RedisUnavailable, match="fail at once"):
                await script.submit(keys=[], args=[])
        assert time.monotonic() - t0 < 0.4  # 80 commands, none waited for the 0.5 s timeout
        await asyncio.sleep(1.2)  # PINGs go on timing out in the background
        assert client.failing
        server.resume()
        await recovered(client)
        assert await client.ping() and await script(keys=[], args=[]) == 1
    finally:
        await client.aclose()


async def test_unreachable_paused_and_restarted_servers(server: RedisProcess) -> None:
    with pytest.raises(RedisUnavailable):
        await RespClient.from_url(DEAD, timeout=0.5).execute("PING")
    client = RespClient.from_url(server.url, timeout=0.5)
    try:
        assert await client.ping()
        server.pause()  # connected, but nothing answers: every waiter fails within the timeout
        t0 = time.monotonic()
        results = await asyncio.gather(*(client.execute("PING") for _ in range(20)), return_exceptions=True)
        assert all(isinstance(r, RedisUnavailable) for r in results) and time.monotonic() - t0 < 2
        server.resume()
        await recovered(client)
        assert await client.ping()  # reconnected
        server.stop()
        with pytest.raises(RedisUnavailable):
            await client.execute("PING")
        server.start()
        assert await client.ping()
    finally:
        await client.aclose()


async def test_a_command_sent_without_waiting_times_out_too(server: RedisProcess) -> None:
    """``submit`` (the settlement's way) is watched by the same deadline as ``execute``: a reply that
    never comes fails it, and the connection is replaced."""
    client = RespClient.from_url(server.url, timeout=0.5)
    try:
        assert await client.ping()
        server.pause()
        t0 = time.monotonic()
        sent = client.submit("PING")
        with pytest.raises(RedisUnavailable, match="within 0.5 s"):
            await sent
        assert 0.4 < time.monotonic() - t0 < 2
        server.resume()
        await recovered(client)
        assert await client.ping()
    finally:
        await client.aclose()
