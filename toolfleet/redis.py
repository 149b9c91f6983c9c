"""The Redis edge: one asyncio client per process, and optimistic JSON updates."""

from __future__ import annotations

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
