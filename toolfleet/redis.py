"""The Redis edge: one auto-pipelining asyncio client per process, optimistic JSON updates."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from typing import Any, TypeVar
from weakref import WeakKeyDictionary

from redis.asyncio import BlockingConnectionPool, Redis
from redis.commands.core import AsyncScript

from toolfleet.settings import Settings

T = TypeVar("T")

# Compare-and-set: write the new value only if the key still holds what was read (by its
# SHA-1; an absent key reads as ''). ARGV: sha1 of the value read, new value, ttl.
_CAS = """
local current = redis.call('GET', KEYS[1]) or ''
if redis.sha1hex(current) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
return 1
"""
_cas_scripts: WeakKeyDictionary[Redis, AsyncScript] = WeakKeyDictionary()

JsonState = dict[str, Any]

HashFields = dict[bytes | bytearray | memoryview | str | int | float, str]
"""A mapping redis-py's ``hset`` accepts as it is typed (its key type is invariant)."""


# Commands that hold or change a connection's state: they never share a pipeline.
_OWN_CONNECTION = frozenset(
    {b"WATCH", b"UNWATCH", b"MULTI", b"EXEC", b"DISCARD", b"SELECT", b"SUBSCRIBE",
     b"PSUBSCRIBE", b"BLPOP", b"BRPOP", b"BLMOVE", b"BZPOPMIN", b"BZPOPMAX", b"XREAD",
     b"XREADGROUP", b"WAIT", b"CLIENT", b"MONITOR"}
)  # fmt: skip


class AutoPipelinedRedis(Redis):
    """A client that sends the commands issued in one event-loop turn as one pipeline.

    A service handles many calls at once, and each call's Redis steps are small scripts:
    sent one by one, every step pays a pool checkout, a write and a read of its own. Queued
    and flushed on the next loop iteration instead (as ioredis' auto-pipelining does), a
    burst of N steps costs one round trip. Each caller still awaits its own reply and sees
    its own error; commands of one caller keep their order because it awaits each reply.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._queued: list[tuple[tuple[Any, ...], dict[str, Any], asyncio.Future[Any]]] = []
        self._flushes: set[asyncio.Task[None]] = set()

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        """Queue the command for this loop turn's pipeline and wait for its reply."""
        name = args[0].encode() if isinstance(args[0], str) else args[0]
        if name.split(b" ")[0].upper() in _OWN_CONNECTION:
            return await super().execute_command(*args, **options)
        future = asyncio.get_running_loop().create_future()
        if not self._queued:
            asyncio.get_running_loop().call_soon(self._flush_queued)
        self._queued.append((args, options, future))
        return await future

    def _flush_queued(self) -> None:
        batch, self._queued = self._queued, []
        task = asyncio.create_task(self._send(batch))
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _send(
        self, batch: list[tuple[tuple[Any, ...], dict[str, Any], asyncio.Future[Any]]]
    ) -> None:
        pipe = self.pipeline(transaction=False)
        for args, options, _ in batch:
            pipe.execute_command(*args, **options)
        try:
            replies = await pipe.execute(raise_on_error=False)
        except BaseException as exc:  # the connection failed: every caller sees it
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, _, future), reply in zip(batch, replies, strict=True):
            if future.done():  # its caller was cancelled
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)


def connect_redis(settings: Settings) -> Redis:
    """A Redis client for the configured URL; replies stay bytes (Lua scripts return bytes).

    The client auto-pipelines (see ``AutoPipelinedRedis``). The pool blocks when all its
    connections are busy: flushes wait their turn instead of failing with "too many
    connections".
    """
    pool = BlockingConnectionPool.from_url(
        settings.redis_address(), max_connections=settings.redis_max_connections, timeout=60
    )
    return AutoPipelinedRedis(connection_pool=pool, decode_responses=False)


def text(value: bytes | str) -> str:
    """A Redis reply as text (the client keeps replies as bytes)."""
    return value.decode() if isinstance(value, bytes) else value


async def update_json(
    redis: Redis,
    key: str,
    change: Callable[[JsonState | None], tuple[JsonState | None, T]],
    *,
    ttl_s: int,
) -> tuple[JsonState | None, T]:
    """Read-modify-write one JSON value atomically (compare-and-set), retrying on a conflict.

    ``change`` gets the current value (None when absent) and returns the new value (None
    leaves the key as it is) and a result; it must be pure, because it may run again.
    Two round trips: GET, then a script that sets the value only if it did not change.
    """
    cas = _cas_scripts.get(redis)
    if cas is None:
        cas = _cas_scripts[redis] = redis.register_script(_CAS)
    while True:
        raw = await redis.get(key)
        current = raw.encode() if isinstance(raw, str) else raw or b""
        state, result = change(json.loads(current) if current else None)
        if state is None:
            return state, result
        read = hashlib.sha1(current, usedforsecurity=False).hexdigest()
        new = json.dumps(state, separators=(",", ":"))
        if await cas(keys=[key], args=[read, new, ttl_s]):
            return state, result
