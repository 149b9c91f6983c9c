"""The reconciler's own state in Redis: one hash per call it reconciles, and its schedule.

A call's hash (``Keys.recon``) says which attempt is being reconciled (its fencing token),
how many probes answered, whether a probe answer is awaited, and where the reconciliation
stands (``reconciling``, ``handed_over``, ``resolved``): every input of the reconciler is
idempotent against it. The schedule holds delayed actions (a probe, a retry, telling the
model about an unknown effect), one sorted set per slot group, by when they are due; an action
taken out is leased, not removed, until it was carried out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from kernel.adapters.redis import text
from kernel.stores.keys import SLOT_GROUPS, Keys
from kernel.stores.scripts import script

_CLAIM = script("reconciling/claim")
_TAKE_PROBE = script("reconciling/take_probe")
_POP_DUE = script("reconciling/pop_due")
_DONE_DUE = script("reconciling/done_due")


@dataclass(frozen=True)
class DueAction:
    """An action taken from the schedule (``ReconcileState.pop_due``), leased until ``until``:
    due again then, unless ``ReconcileState.done`` removed it first."""

    action: dict[str, Any]
    """Its ``tenant``, ``run``, ``call_id``, what to ``do`` and what that needs."""
    member: str
    """Its entry in the schedule."""
    until: float
    """When its lease ends."""


class ReconcileState:
    """Reconciliations of calls and the reconciler's schedule of delayed actions."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._claim = _CLAIM.register(redis)
        self._take_probe = _TAKE_PROBE.register(redis)
        self._pop_due = _POP_DUE.register(redis)
        self._done_due = _DONE_DUE.register(redis)

    async def claim(
        self, tenant_id: str, run_id: str, call_id: str, token: int, claimant: str = ""
    ) -> bool:
        """Start reconciling the attempt with fencing token ``token`` (no probes answered,
        none awaited); False when that attempt or a later one already is, unless by the same
        ``claimant`` (the record asking: its claim's reply was lost, or its reconciler died
        before acting, and it is handled again)."""
        key = self.keys.recon(tenant_id, run_id, call_id)
        return bool(await self._claim(keys=[key], args=[token, claimant]))

    async def await_probe(self, tenant_id: str, run_id: str, call_id: str) -> None:
        """A probe was sent: its answer is awaited (``take_probe``)."""
        await self.redis.hset(self.keys.recon(tenant_id, run_id, call_id), "awaiting_probe", 1)

    async def take_probe(
        self, tenant_id: str, run_id: str, call_id: str, taker: str = ""
    ) -> int | None:
        """Take a probe's answer: how many probes have answered now, or None when no answer
        was awaited (a duplicate, or an answer for a reconciliation that moved on). ``taker``
        names the record: the one that took the last answer may take it again."""
        key = self.keys.recon(tenant_id, run_id, call_id)
        probes = int(await self._take_probe(keys=[key], args=[taker]))
        return None if probes < 0 else probes

    async def probes(self, tenant_id: str, run_id: str, call_id: str) -> int:
        """How many probes of the call have answered (0 when it is not reconciled)."""
        raw = await self.redis.hget(self.keys.recon(tenant_id, run_id, call_id), "probes")
        return int(raw or 0)

    async def maybe_applied(self, tenant_id: str, run_id: str, call_id: str) -> bool:
        """Whether an attempt of the call ended with its effect unknown, and no probe has
        since found the call's idempotency key unused upstream."""
        key = self.keys.recon(tenant_id, run_id, call_id)
        return bool(await self.redis.hget(key, "maybe_applied"))

    async def set_maybe_applied(
        self, tenant_id: str, run_id: str, call_id: str, maybe: bool
    ) -> None:
        """Record that an attempt's effect became unknown (True), or that a probe by the
        call's idempotency key found nothing applied by any attempt so far (False)."""
        key = self.keys.recon(tenant_id, run_id, call_id)
        await self.redis.hset(key, "maybe_applied", int(maybe))

    async def set_status(self, tenant_id: str, run_id: str, call_id: str, status: str) -> None:
        """Where the call's reconciliation stands: ``handed_over``, ``resolved``."""
        await self.redis.hset(self.keys.recon(tenant_id, run_id, call_id), "status", status)

    async def status(self, tenant_id: str, run_id: str, call_id: str) -> str | None:
        """Where the call's reconciliation stands (None when it is not reconciled)."""
        raw = await self.redis.hget(self.keys.recon(tenant_id, run_id, call_id), "status")
        return None if raw is None else text(raw)

    async def schedule(self, due: dict[str, Any], at: float) -> None:
        """Run the action ``due`` (its ``tenant``, ``run``, ``call_id`` and what to ``do``) at
        ``at``, from the schedule of the run's slot group."""
        group = self.keys.group(due["tenant"], due["run"])
        await self.redis.zadd(self.keys.due(group), {json.dumps(due): at})

    async def pop_due(self, now: float, lease_s: float) -> list[DueAction]:
        """Take the actions due by ``now`` from the schedule (at most 100 per slot group,
        every group in one round trip), each leased for ``lease_s``: no other reconciler takes
        it meanwhile, and unless ``done`` removes it, it is due again when the lease ends (its
        reconciler died carrying it out, or never heard this answer)."""
        until = now + lease_s
        async with self.redis.pipeline(transaction=False) as pipe:
            for group in range(SLOT_GROUPS):  # one script per group, all in one round trip
                await self._pop_due(keys=[self.keys.due(group)], args=[now, until], client=pipe)
            popped = await pipe.execute()
        return [DueAction(json.loads(raw), text(raw), until) for items in popped for raw in items]

    async def done(self, due: DueAction) -> None:
        """``due`` was carried out: out of the schedule (unless scheduled again since)."""
        group = self.keys.group(due.action["tenant"], due.action["run"])
        await self._done_due(keys=[self.keys.due(group)], args=[due.member, due.until])
