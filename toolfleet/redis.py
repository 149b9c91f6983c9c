"""The Redis edge: one asyncio client per process."""

from __future__ import annotations

from redis.asyncio import Redis

from toolfleet.settings import Settings


def connect_redis(settings: Settings) -> Redis:
    """A Redis client for the configured URL; responses stay bytes (Lua scripts return bytes)."""
    return Redis.from_url(
        settings.redis_address(), decode_responses=False, health_check_interval=30
    )
