"""The concurrency gates of turns with ``max_concurrency``, in Redis: one JSON value per turn.

The planner decides what a gate holds and which calls it releases (``planner``); this store
keeps each gate, the set of a run's gated turns, and changes a gate only by compare-and-set
(``update_json``), so a redelivered outcome or a planner taking over a partition during a
rebalance can never release a call twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from kernel.adapters.redis import add_to_set
from kernel.stores.keys import Keys
from kernel.stores.scripts import script

T = TypeVar("T")

JsonState = dict[str, Any]
"""A JSON object as ``update_json`` reads and writes it."""

_CAS = script("gates/cas")
"""Compare-and-set of one value by the SHA-1 of what was read (``gates/cas.lua``)."""


async def update_json(
    redis: Redis,
    key: str,
    change: Callable[[JsonState | None], tuple[JsonState | None, T]],
    *,
    ttl_s: int,
    cas: AsyncScript | None = None,
) -> tuple[JsonState | None, T]:
    """Read-modify-write one JSON value atomically (compare-and-set), retrying on a conflict.

    ``change`` gets the current value (None when absent) and returns the new value (None
    leaves the key as it is) and a result; it must be pure, because it may run again.
    Two round trips: GET, then a script that sets the value only if it did not change.
    ``cas``: that script registered on ``redis`` already (a store keeps its own: a cache of
    them by client would keep every client alive, since each script holds its client).
    """
    if cas is None:
        cas = _CAS.register(redis)
    while True:
        raw = await redis.get(key)
        current = raw.encode() if isinstance(raw, str) else raw or b""
        state, result = change(orjson.loads(current) if current else None)
        if state is None:
            return state, result
        read = hashlib.sha1(current, usedforsecurity=False).hexdigest()
        if await cas(keys=[key], args=[read, orjson.dumps(state), ttl_s]):
            return state, result


class GateStore:
    """Each capped turn's gate (a JSON value), and the turns of a run that have one."""

    def __init__(self, redis: Redis, keys: Keys, *, ttl_s: int) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl_s = ttl_s
        """How long a turn's gate lives after its last change (as long as its ledger
        entries)."""
        self._cas = _CAS.register(redis)

    async def add_turn(self, tenant_id: str, run_id: str, turn_id: int) -> None:
        """Count the turn among its run's gated turns (``turns``), kept ``ttl_s`` from now."""
        await add_to_set(self.redis, self.keys.gates(tenant_id, run_id), turn_id, self.ttl_s)

    async def turns(self, tenant_id: str, run_id: str) -> list[int]:
        """The run's turns that have a gate."""
        return [int(t) for t in await self.redis.smembers(self.keys.gates(tenant_id, run_id))]

    async def exists(self, tenant_id: str, run_id: str, turn_id: int) -> bool:
        """Whether the turn has a gate (a turn without ``max_concurrency`` has none)."""
        return bool(await self.redis.exists(self.keys.gate(tenant_id, run_id, turn_id)))

    async def update(
        self,
        tenant_id: str,
        run_id: str,
        turn_id: int,
        change: Callable[[JsonState | None], tuple[JsonState | None, T]],
    ) -> tuple[JsonState | None, T]:
        """Change the turn's gate by compare-and-set (``update_json``): ``change`` gets the
        gate (None when it has none) and returns the new one (None: leave it) and a result."""
        key = self.keys.gate(tenant_id, run_id, turn_id)
        return await update_json(self.redis, key, change, ttl_s=self.ttl_s, cas=self._cas)
