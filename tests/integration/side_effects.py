"""The Redis the test tools count their side effects in: ``TEST_SIDE_EFFECTS_URL`` when a
test sets it (an upstream apart from the fleet's state), else the fleet's own ``REDIS_URL``.

The tools run inside worker processes and count synchronously, so they use redis-py's
blocking clients: ``RedisCluster`` when ``REDIS_URL`` names a cluster, else ``Redis``.
"""

from __future__ import annotations

import os
from functools import cache

import redis
from redis.cluster import RedisCluster


@cache
def side_effects() -> redis.Redis | RedisCluster:
    """One client per process (single Redis or ``redis+cluster://``)."""
    url = os.environ.get("TEST_SIDE_EFFECTS_URL") or os.environ["REDIS_URL"]
    if url.startswith("redis+cluster://"):
        seed = url.removeprefix("redis+cluster://").split("/", 1)[0].split(",")[0]
        host, port = seed.rsplit(":", 1)
        return RedisCluster(host=host, port=int(port))
    return redis.Redis.from_url(url)
