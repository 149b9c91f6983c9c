"""The Redis the test tools count their side effects in: ``TEST_SIDE_EFFECTS_URL`` when a
test sets it (an upstream apart from the fleet's state), else the fleet's own ``REDIS_URL``.

Most tools run inside worker processes and count synchronously, so they use redis-py's
blocking clients: ``RedisCluster`` when ``REDIS_URL`` names a cluster, else ``Redis``. Tools
whose timing a test measures count with the asyncio clients (``async_side_effects``), so
that counting never blocks the worker's event loop under the other calls it runs.
"""

from __future__ import annotations

import os
from functools import cache

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster


def _url() -> tuple[str, tuple[str, int] | None]:
    """The URL, and the seed node when it names a cluster."""
    url = os.environ.get("TEST_SIDE_EFFECTS_URL") or os.environ["REDIS_URL"]
    if not url.startswith("redis+cluster://"):
        return url, None
    seed = url.removeprefix("redis+cluster://").split("/", 1)[0].split(",")[0]
    host, port = seed.rsplit(":", 1)
    return url, (host, int(port))


@cache
def side_effects() -> redis.Redis | RedisCluster:
    """One blocking client per process (single Redis or ``redis+cluster://``)."""
    url, seed = _url()
    if seed is not None:
        return RedisCluster(host=seed[0], port=seed[1])
    return redis.Redis.from_url(url)


@cache
def async_side_effects() -> redis.asyncio.Redis | AsyncRedisCluster:
    """One asyncio client per process, for the event loop of the worker that calls it. Its
    pool waits for a free connection instead of failing: a worker of 50 slots runs 50 tools
    that each write here at once."""
    url, seed = _url()
    if seed is not None:
        return AsyncRedisCluster(host=seed[0], port=seed[1])
    pool = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=64, timeout=30)
    return redis.asyncio.Redis(connection_pool=pool)


ENTER_IN_FLIGHT = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
return n
"""
"""INCR a scope's in-flight counter and raise its recorded peak in one step (keys:
``in_flight_keys``), so concurrent starts in different processes never both read a stale
peak; DECR the counter when the call ends."""


def in_flight_keys(scope: str) -> tuple[str, str]:
    """(current, peak) in-flight counters of a scope: a tool, a tenant or a worker."""
    return f"test:inflight:{{{scope}}}", f"test:peak:{{{scope}}}"  # one slot: one script
