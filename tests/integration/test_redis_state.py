"""The Redis edge on the real server: auto-pipelined bursts, optimistic JSON updates."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest
from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import ConnectionError, DataError, ResponseError

from kernel.adapters.redis import AutoPipelinedRedis
from kernel.settings import Settings
from kernel.stores.gates import JsonState, update_json

# The single-server client itself (bursts on one connection, MULTI, keyless scripts); the
# cluster client is tested in test_redis_cluster.py.
pytestmark = [pytest.mark.integration, pytest.mark.single_redis]


def _named_client(
    settings: Settings, label: str, max_connections: int
) -> tuple[str, AutoPipelinedRedis]:
    """A client of its own, whose connections carry a name to find them by in CLIENT LIST."""
    name = f"{label}-{uuid.uuid4().hex[:8]}"
    pool = BlockingConnectionPool.from_url(
        settings.redis_address(), max_connections=max_connections, client_name=name
    )
    return name, AutoPipelinedRedis(connection_pool=pool)


async def test_concurrent_read_modify_writes_lose_no_update(redis: Redis) -> None:
    key = f"test:cas:{uuid.uuid4().hex}"

    def bump(state: JsonState | None) -> tuple[JsonState, int]:
        count = (state or {"n": 0})["n"] + 1
        return {"n": count}, count

    results = await asyncio.gather(*(update_json(redis, key, bump, ttl_s=60) for _ in range(50)))
    assert sorted(r for _, r in results) == list(range(1, 51))
    state, _ = await update_json(redis, key, lambda s: (None, s), ttl_s=60)
    assert state is None  # returning None leaves the key as it is
    assert await redis.get(key) == b'{"n":50}'
    assert 0 < await redis.ttl(key) <= 60


async def test_a_burst_of_commands_shares_one_connection(redis: Redis, settings: Settings) -> None:
    """500 concurrent commands go out as pipelined bursts, not over 500 connections."""
    name, client = _named_client(settings, "burst", max_connections=128)
    key = f"test:burst:{uuid.uuid4().hex}"
    try:
        replies = await asyncio.gather(*(client.incr(key) for _ in range(500)))
        assert sorted(replies) == list(range(1, 501))  # every caller got its own reply
        mine = [c for c in await redis.client_list() if c.get("name") == name]
        assert 1 <= len(mine) <= 3  # two flushes in flight at most (+ a reconnect)
    finally:
        await redis.delete(key)
        await client.aclose()


async def test_a_second_burst_goes_out_while_the_first_waits_for_its_replies(
    redis: Redis, settings: Settings
) -> None:
    """Two bursts in flight, each on its own connection, each caller with its own reply."""
    name, client = _named_client(settings, "inflight", max_connections=8)
    key = f"test:burst:{uuid.uuid4().hex}"
    # Busy for ~50 ms on the server, so the first burst is still in flight when the second
    # one is flushed on the next loop turn.
    slow = (
        "local t = redis.call('TIME'); local until_us = t[1] * 1e6 + t[2] + 50000 "
        "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] >= until_us return ARGV[1]"
    )
    try:
        first = asyncio.ensure_future(client.eval(slow, 0, "first"))
        await asyncio.sleep(0)  # wait-ok: one loop turn, so the first burst is flushed alone
        await asyncio.sleep(0)  # wait-ok
        second = await asyncio.gather(client.set(key, "2"), client.get(key))
        assert await first == b"first"
        assert second == [True, b"2"]
        mine = [c for c in await redis.client_list() if c.get("name") == name]
        assert len(mine) == 2
    finally:
        await redis.delete(key)
        await client.aclose()


async def test_each_caller_of_a_burst_sees_its_own_error(redis: Redis) -> None:
    key = f"test:burst:{uuid.uuid4().hex}"
    await redis.set(key, "text")
    ok, wrong, also_ok = await asyncio.gather(
        redis.get(key), redis.incr(key), redis.strlen(key), return_exceptions=True
    )
    assert ok == b"text" and also_ok == 4
    assert isinstance(wrong, ResponseError)
    # A plain pipeline joins the burst and keeps its order; a transaction is still MULTI/EXEC.
    async with redis.pipeline(transaction=False) as pipe:
        pipe.append(key, "!").get(key)
        assert await pipe.execute() == [5, b"text!"]
    async with redis.pipeline(transaction=True) as tx:
        tx.set(key, "a").append(key, "b")
        assert await tx.execute() == [True, 2]
    await redis.delete(key)


async def test_a_bad_argument_fails_only_its_caller(redis: Redis) -> None:
    key = f"test:burst:{uuid.uuid4().hex}"
    ok, bad, reply_types = await asyncio.gather(
        redis.set(key, "1"),
        redis.execute_command("SET", key, object()),  # nothing the wire format can carry
        redis.hgetall(f"{key}:absent"),
        return_exceptions=True,
    )
    assert ok is True and reply_types == {}  # redis-py's reply shapes: bool, dict
    assert isinstance(bad, DataError)
    assert await redis.get(key) == b"1"
    await redis.delete(key)


async def test_the_client_recovers_after_the_server_drops_its_connection(
    redis: Redis, settings: Settings
) -> None:
    name, client = _named_client(settings, "drop", max_connections=4)
    try:
        assert await client.ping() is True
        for conn in [c for c in await redis.client_list() if c.get("name") == name]:
            await redis.client_kill_filter(_id=conn["id"])
        with contextlib.suppress(ConnectionError):
            await client.ping()  # a burst that met the closed socket fails its callers
        # Whether or not the pool noticed first, the dead connection is not used again.
        assert await client.ping() is True
        assert await client.ping() is True
    finally:
        await client.aclose()


async def test_scripts_come_back_after_redis_forgot_them(redis: Redis) -> None:
    """A restarted Redis has an empty script cache: bursts reload scripts and run them again."""
    script = redis.register_script("return tonumber(ARGV[1]) * 2")
    assert await script(args=[21]) == 42
    await redis.script_flush()
    assert await asyncio.gather(script(args=[1]), script(args=[2])) == [2, 4]
    await redis.script_flush()
    async with redis.pipeline(transaction=False) as pipe:
        await script(args=[5], client=pipe)
        assert await pipe.execute() == [10]
