"""The aggregator's turn state in Redis: one hash per turn, every write a compare-and-set.

The hash holds a version field (``v``) and the turn's fields (its plan, one field per
outcome, the marker of the result emitted); ``aggregator`` decides what they hold. A write
names the version it read and changes only the fields that changed: two aggregator
instances that briefly handle the same run (a rebalance) never lose each other's updates.

Beside the hashes (``RunTurns``): each run's list of its turns (a cancellation ends them
all) and, per call that runs for one turn, the other turns attached to it (they get a copy of
its outcome).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from redis.asyncio import Redis

from kernel.adapters.redis import add_to_set, text
from kernel.stores.keys import Keys
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


TurnRef = tuple[str, int]
"""A turn of a tenant's run: (run_id, turn_id)."""


class RunTurns:
    """The turns of each run the aggregator has seen, and the turns attached to a call."""

    def __init__(self, redis: Redis, keys: Keys, *, ttl_s: int) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl_s = ttl_s
        """How long a run's list of turns lives after its last turn joined it."""

    async def add(self, tenant_id: str, run_id: str, turn_id: int) -> None:
        """Count ``turn_id`` among the run's turns, kept ``ttl_s`` from now."""
        await add_to_set(self.redis, self.keys.turns(tenant_id, run_id), turn_id, self.ttl_s)

    async def of_run(self, tenant_id: str, run_id: str) -> list[int]:
        """The run's turns seen so far (any order)."""
        return [int(t) for t in await self.redis.smembers(self.keys.turns(tenant_id, run_id))]

    async def attach(self, tenant_id: str, call_id: str, turn: TurnRef) -> None:
        """``turn`` waits for ``call_id``, which runs for another turn: it gets a copy of the
        call's outcome (``attached``)."""
        run_id, turn_id = turn
        key = self.keys.attached(tenant_id, run_id, call_id)
        await self.redis.sadd(key, f"{run_id}\x1f{turn_id}")

    async def attached(self, calls: Sequence[tuple[str, str, str]]) -> list[list[TurnRef]]:
        """For each (tenant, run, call_id), the turns attached to that call, in one round
        trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for tenant_id, run_id, call_id in calls:
                pipe.smembers(self.keys.attached(tenant_id, run_id, call_id))
            replies = await pipe.execute()
        found: list[list[TurnRef]] = []
        for members in replies:
            turns: list[TurnRef] = []
            for member in members:
                run_id, _, turn_id = text(member).partition("\x1f")
                turns.append((run_id, int(turn_id)))
            found.append(turns)
        return found
