"""The console's overview in Redis: per-minute and per-hour counts and gauges
(``kernel.rules.overview`` says what each field means and how they are folded).

A bucket is one hash; it expires a while after its span ends (``MINUTE_KEEP_S``,
``HOUR_KEEP_S``). Counts are added with HINCRBY (a batch of records in one pipeline), gauges
set with HSET; nothing here is read by a decision of the fleet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from redis.asyncio import Redis

from kernel.adapters.redis import HashFields, text
from kernel.rules.overview import HOUR, MINUTE, Fold, bucket_start
from kernel.stores.keys import Keys

MINUTE_KEEP_S = 26 * HOUR
"""How long a minute's counts are kept: a day's view, and a margin."""
HOUR_KEEP_S = 8 * 24 * HOUR
"""How long an hour's counts are kept: a week's view, and a margin."""


class Overview:
    """The overview's buckets, over one Redis connection."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    @staticmethod
    def _keep(width: int) -> int:
        return MINUTE_KEEP_S if width <= MINUTE else HOUR_KEEP_S

    async def add(self, folds: Sequence[Fold]) -> None:
        """Add one batch's increments (each bucket's fields, then its expiry)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            queued = False
            for f in folds:
                for start, counts in f.increments.items():
                    key = self.keys.overview(f.width, start)
                    for name, by in counts.items():
                        pipe.hincrby(key, name, by)
                    pipe.expire(key, f.width + self._keep(f.width))
                    queued = True
            if queued:
                await pipe.execute()

    async def sample(self, gauges: Mapping[str, float], at: float) -> None:
        """Record gauges sampled at ``at`` in its minute and its hour (the last sample of a
        bucket is the one it shows)."""
        if not gauges:
            return
        fields: HashFields = {f"g|{name}": repr(float(value)) for name, value in gauges.items()}
        async with self.redis.pipeline(transaction=False) as pipe:
            for width in (MINUTE, HOUR):
                key = self.keys.overview(width, bucket_start(at, width))
                pipe.hset(key, mapping=fields)
                pipe.expire(key, width + self._keep(width))
            await pipe.execute()

    async def read(self, width: int, starts: Sequence[int]) -> dict[int, dict[str, str]]:
        """The fields of each bucket of ``starts`` (a missing one is empty)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for start in starts:
                pipe.hgetall(self.keys.overview(width, start))
            found = await pipe.execute()
        return {
            start: {text(k): text(v) for k, v in fields.items()}
            for start, fields in zip(starts, found, strict=True)
        }
