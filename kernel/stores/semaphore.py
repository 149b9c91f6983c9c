"""Fleet-wide counting semaphores in Redis, lease-based so a crashed holder's slots come back.

Each semaphore is a sorted set of holder ids scored by lease expiry. Acquiring first drops
expired holders, so a worker that was SIGKILLed frees its slots when its leases run out.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from redis.asyncio import Redis

# KEYS: one sorted set per semaphore; ARGV: holder, lease_s, then one limit per key.
# All or nothing: a call needs its tenant slot and its tool slot together, and taking one
# while waiting for the other could deadlock two workers against each other.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if redis.call('ZCARD', key) >= tonumber(ARGV[2 + i]) then return 0 end
end
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, now + tonumber(ARGV[2]), ARGV[1])
end
return 1
"""

_RENEW = """
local t = redis.call('TIME')
local expiry = tonumber(t[1]) + tonumber(t[2]) / 1e6 + tonumber(ARGV[2])
for _, key in ipairs(KEYS) do redis.call('ZADD', key, 'XX', expiry, ARGV[1]) end
return 1
"""


class FleetSemaphores:
    """Acquire several fleet-wide semaphores at once, with a lease the holder keeps renewing."""

    def __init__(self, redis: Redis, lease_s: float = 30.0) -> None:
        self.redis = redis
        self.lease_s = lease_s
        self._acquire = redis.register_script(_ACQUIRE)
        self._renew = redis.register_script(_RENEW)

    async def try_acquire(self, holder: str, limits: Sequence[tuple[str, int]]) -> bool:
        """Take one slot of every (key, limit) or none of them."""
        if not limits:
            return True
        keys = [k for k, _ in limits]
        return bool(
            await self._acquire(keys=keys, args=[holder, self.lease_s, *(n for _, n in limits)])
        )

    async def renew(self, holder: str, keys: Sequence[str]) -> None:
        """Push the holder's lease out again."""
        if keys:
            await self._renew(keys=list(keys), args=[holder, self.lease_s])

    async def release(self, holder: str, keys: Sequence[str]) -> None:
        """Give the slots back."""
        if keys:
            async with self.redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.zrem(key, holder)
                await pipe.execute()

    @asynccontextmanager
    async def hold(
        self, holder: str, limits: Sequence[tuple[str, int]], *, poll_s: float = 0.02
    ) -> AsyncIterator[None]:
        """Wait for the slots, hold them (renewing the lease) for the block, then release."""
        if not limits:
            yield  # nothing to hold: no round trip, no renewer
            return
        delay = poll_s
        while not await self.try_acquire(holder, limits):
            # Jitter spreads waiting workers out so they do not retry in lockstep.
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 0.1)
        keys = [k for k, _ in limits]
        renewer = asyncio.create_task(self._keep_renewing(holder, keys))
        try:
            yield
        finally:
            renewer.cancel()
            await self.release(holder, keys)

    async def _keep_renewing(self, holder: str, keys: list[str]) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            await self.renew(holder, keys)
