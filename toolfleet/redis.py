"""The Redis edge: one asyncio client per process, and optimistic JSON updates."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import WatchError

from toolfleet.settings import Settings

T = TypeVar("T")

JsonState = dict[str, Any]

HashFields = dict[bytes | bytearray | memoryview | str | int | float, str]
"""A mapping redis-py's ``hset`` accepts as it is typed (its key type is invariant)."""


def connect_redis(settings: Settings) -> Redis:
    """A Redis client for the configured URL; replies stay bytes (Lua scripts return bytes).

    The pool blocks when all its connections are busy: concurrent handlers wait their turn
    instead of failing with "too many connections".
    """
    pool = BlockingConnectionPool.from_url(
        settings.redis_address(), max_connections=settings.redis_max_connections, timeout=60
    )
    return Redis(connection_pool=pool, decode_responses=False)


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
    """Read-modify-write one JSON value atomically (WATCH/MULTI), retrying on a conflict.

    ``change`` gets the current value (None when absent) and returns the new value (None
    leaves the key as it is) and a result; it must be pure, because it may run again.
    """
    async with redis.pipeline(transaction=True) as pipe:
        while True:
            try:
                await pipe.watch(key)
                raw = await pipe.get(key)
                state, result = change(json.loads(raw) if raw else None)
                pipe.multi()  # type: ignore[no-untyped-call]
                if state is not None:
                    pipe.set(key, json.dumps(state, separators=(",", ":")), ex=ttl_s)
                await pipe.execute()
            except WatchError:
                continue
            return state, result
