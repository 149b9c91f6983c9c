"""The aggregator's turn state in Redis: one hash per turn, every write a compare-and-set.

The hash holds a version field (``v``) and the turn's fields (its plan, one field per
outcome, the marker of the result emitted); ``aggregator`` decides what they hold. A write
names the version it read and changes only the fields that changed: two aggregator
instances that briefly handle the same run (a rebalance) never lose each other's updates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from redis.asyncio import Redis

from kernel.stores.scripts import script

_WRITE = script("turns/write")
"""The compare-and-set write (``kernel/stores/lua/turns/write.lua``)."""


class TurnHashes:
    """Reads and compare-and-set writes of turn hashes, each kept ``ttl_s`` after its last
    write."""

    def __init__(self, redis: Redis, *, ttl_s: int) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self._write = _WRITE.register(redis)

    async def read(self, key: str) -> dict[bytes, bytes]:
        """Every field of the turn's hash, its version (``v``) among them ({} when absent)."""
        raw = await self.redis.hgetall(key)  # the client keeps replies as bytes
        return cast(dict[bytes, bytes], raw)

    async def write(
        self, key: str, version: str, *, deletes: Sequence[str], sets: Sequence[str | bytes]
    ) -> int:
        """Delete the fields ``deletes`` and set ``sets`` (name, value, name, value, ...), if
        the turn is still at ``version`` (the ``v`` read; '' for a turn without state): the
        new version, or 0 when the turn changed meanwhile (nothing written)."""
        args = [version, self.ttl_s, len(deletes), *deletes, *sets]
        return int(await self._write(keys=[key], args=args))
