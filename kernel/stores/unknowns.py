"""The calls whose effect is unknown and not resolved yet: how many, and since when.

One sorted set per slot group (``Keys.unknowns``), scored by when the reconciler first saw
the call's unknown effect. The reconciler adds a call when it starts reconciling an unknown
effect and removes it when its own verdict (or a human's) replaces the effect. A retry's new
outcome settles a call without passing the reconciler, which reads only the outcomes that
need it; so ``sweep`` checks a window of each index against the ledger and drops the calls
whose effect is known by now, a different window each time.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from redis.asyncio import Redis

from kernel.adapters.redis import text
from kernel.stores.keys import SLOT_GROUPS, Keys
from kernel.stores.ledger import Ledger, LedgerEntry, lease_member

SWEEP_PER_GROUP = 16
"""Calls of one slot group checked against the ledger per sweep (1,024 in all)."""


def still_unknown(entry: LedgerEntry | None) -> bool:
    """Whether a call's effect is still unknown: its latest outcome says so, or it has none
    yet (a retry under way, a worker that died). A call gone from the ledger (expired) is
    nobody's backlog."""
    return entry is not None and (entry.outcome is None or entry.outcome.effect == "unknown")


class UnknownEffects:
    """The index of unresolved unknown effects, over the connection it is given."""

    def __init__(self, redis: Redis, keys: Keys, ledger: Ledger) -> None:
        self.redis = redis
        self.keys = keys
        self.ledger = ledger
        self._offsets = [0] * SLOT_GROUPS

    def _key(self, tenant_id: str, run_id: str) -> str:
        return self.keys.unknowns(self.keys.group(tenant_id, run_id))

    async def add(self, tenant_id: str, run_id: str, call_id: str, since: float) -> None:
        """Count a call in; a call already in keeps its first time (a redelivery, a probe
        that came back unknown, another unknown attempt)."""
        member = lease_member(tenant_id, run_id, call_id)
        await self.redis.zadd(self._key(tenant_id, run_id), {member: since}, nx=True)

    async def discard(self, tenant_id: str, run_id: str, call_id: str) -> None:
        """Count a call out: its effect is known now."""
        await self.redis.zrem(
            self._key(tenant_id, run_id), lease_member(tenant_id, run_id, call_id)
        )

    async def backlog(self, now: float) -> tuple[int, float]:
        """How many calls are in, and how long the oldest has been (0 when none)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for group in range(SLOT_GROUPS):
                pipe.zcard(self.keys.unknowns(group))
                pipe.zrange(self.keys.unknowns(group), 0, 0, withscores=True)
            replies = await pipe.execute()
        count = sum(int(n) for n in replies[0::2])
        firsts = [float(oldest[0][1]) for oldest in replies[1::2] if oldest]
        return count, max(0.0, now - min(firsts)) if firsts else 0.0

    async def sweep(self) -> int:
        """Drop the calls of this pass's window whose effect is known; returns how many."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for group, start in enumerate(self._offsets):
                pipe.zrange(self.keys.unknowns(group), start, start + SWEEP_PER_GROUP - 1)
            windows = await pipe.execute()
        runs: defaultdict[tuple[str, str], list[str]] = defaultdict(list)
        for members in windows:
            for member in members:
                tenant, run, call_id = text(member).split("\x1f", 2)
                runs[(tenant, run)].append(call_id)
        entries = await asyncio.gather(
            *(self.ledger.read(tenant, run, calls) for (tenant, run), calls in runs.items())
        )
        known = [
            (tenant, run, call_id)
            for ((tenant, run), calls), found in zip(runs.items(), entries, strict=True)
            for call_id in calls
            if not still_unknown(found.get(call_id))
        ]
        for tenant, run, call_id in known:
            await self.discard(tenant, run, call_id)
        dropped: defaultdict[int, int] = defaultdict(int)
        for tenant, run, _ in known:
            dropped[self.keys.group(tenant, run)] += 1
        for group, members in enumerate(windows):
            # A full window moves on past what stays; a short one reached the end: start over.
            full = len(members) == SWEEP_PER_GROUP
            self._offsets[group] = (
                self._offsets[group] + len(members) - dropped[group] if full else 0
            )
        return len(known)
