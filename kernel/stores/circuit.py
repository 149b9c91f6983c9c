"""Circuit breakers per tool version: stop dispatching a version whose error rate spiked.

Workers record every executed call's result in a sliding window per tool version (Redis,
counted in buckets);
when the error rate over the window passes the threshold, the circuit opens: later calls of
that version end ``not_executed`` with a clear message, an alert metric is raised and the
opener files a human task listing the calls that ran while the version was failing (one
task per tenant, each call named by run and call: ``task_call_ref``). It closes by operator
action (``toolfleet tools resume NAME@VERSION``) or, when configured, after a half-open trial
call succeeds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote

from redis.asyncio import Redis

from kernel.adapters.metrics import CIRCUIT_OPEN, labelled
from kernel.adapters.redis import text
from kernel.rules.versions import version_ref
from kernel.settings import Settings
from kernel.stores.keys import Keys
from kernel.stores.registry import ToolDirectory
from kernel.stores.scripts import script

_COUNT = script("circuit/count")
"""Count executed calls in a tool version's window; the call ids of the window when they
opened its circuit (``kernel/stores/lua/circuit/count.lua``)."""

_BUCKETS = 12
"""Buckets per window: a bucket leaves the window as a whole, so the window is exact to 1/12."""

CircuitCall = tuple[str, str, str]
"""A call counted in a circuit's window: (tenant, run, call id). A call counted by a worker of
an earlier release, which kept call ids alone, reads ('', '', call id)."""

_SEP = "\x1f"


def task_call_ref(run_id: str, call_id: str) -> str:
    """How a ``circuit_open`` task names one of its calls (``HumanTask.calls``): ``RUN/CALL``,
    a ``%`` or ``/`` in either written ``%25`` or ``%2F`` (the task's tenant is the call's)."""
    return f"{_escaped(run_id)}/{_escaped(call_id)}"


def parse_task_call_ref(ref: str) -> tuple[str | None, str]:
    """(run, call id) of a ``task_call_ref``; (None, ref) for a task filed by an earlier
    release, which listed bare call ids."""
    if "/" not in ref:
        return None, ref
    run, call = ref.split("/", 1)
    return unquote(run), unquote(call)


def _escaped(part: str) -> str:
    return part.replace("%", "%25").replace("/", "%2F")


@dataclass(frozen=True)
class Verdict:
    """Whether a call of a version may run now."""

    state: Literal["closed", "open", "trial"]
    reason: str = ""


class CircuitBreaker:
    """The fleet's circuits, shared through Redis."""

    def __init__(self, redis: Redis, settings: Settings) -> None:
        self.redis = redis
        self.settings = settings
        self.cache_s = settings.circuit_cache_s
        self.keys = Keys.of(settings)
        self._cache: dict[str, tuple[float, dict[str, float] | None]] = {}
        self._count = _COUNT.register(redis)

    async def count(
        self, ref: str, calls: Sequence[CircuitCall], *, failed: int, now: float
    ) -> list[CircuitCall]:
        """Count executed calls of the version ``ref`` in its sliding window, ``failed`` of
        them failed: the window's calls when these calls opened its circuit (the caller files
        the human tasks listing them, and calls ``opened``), else []. A call is named by its
        full identity: a call id is unique only within its run, and a run within its tenant."""
        s = self.settings
        keys = [self.keys.circuit(part, ref) for part in ("window", "state", "calls")]
        args: list[Any] = [now, s.circuit_window_s, s.circuit_min_calls, s.circuit_error_rate]
        args += [_BUCKETS, failed, *(_SEP.join(call) for call in calls)]
        return [_call_of(text(m)) for m in await self._count(keys=keys, args=args)]

    def opened(self, ref: str) -> None:
        """Counting calls opened the circuit of ``ref``: forget its cached verdict."""
        self._cache.pop(ref, None)
        CIRCUIT_OPEN.labels(ref).set(1)

    async def check(self, ref: str) -> Verdict:
        """May a call of this version run? Cached briefly: this is on every call's path."""
        now = time.time()
        cached = self._cache.get(ref)
        if cached is None or now - cached[0] >= self.cache_s:
            raw = await self.redis.get(self.keys.circuit("state", ref))
            cached = (now, json.loads(raw) if raw else None)
            self._cache[ref] = cached
        state = cached[1]
        labelled(CIRCUIT_OPEN, ref).set(0 if state is None else 1)  # on every call's path
        if state is None:
            return Verdict("closed")
        half_open = self.settings.circuit_half_open_after_s
        if half_open is not None and now - state["opened_at"] >= half_open:
            # One trial call per half-open period: whoever sets the marker runs it.
            trial = self.keys.circuit("trial", ref)
            if await self.redis.set(trial, 1, nx=True, ex=max(1, int(half_open))):
                return Verdict("trial")
        failed, calls = int(state["failed"]), int(state["calls"])
        return Verdict("open", f"{failed} of its last {calls} calls failed")

    async def trial_result(self, ref: str, failed: bool) -> None:
        """A half-open trial ended: close on success, re-open (from now) on failure."""
        state_key = self.keys.circuit("state", ref)
        if failed:
            raw = await self.redis.get(state_key)
            if raw:
                state = json.loads(raw) | {"opened_at": time.time()}
                await self.redis.set(state_key, json.dumps(state))
        else:
            await self.close(ref)
        self._cache.pop(ref, None)

    async def close(self, ref: str) -> bool:
        """Operator action: close the circuit and forget the failures that opened it."""
        removed = await self.redis.delete(
            *(self.keys.circuit(part, ref) for part in ("window", "state", "trial", "calls"))
        )
        self._cache.pop(ref, None)
        CIRCUIT_OPEN.labels(ref).set(0)
        return bool(removed)

    async def open_among(self, refs: Iterable[str]) -> set[str]:
        """Which of ``refs`` have an open circuit (half-open ones count as open).

        The planner asks on every turn that has versions to choose between: states are
        cached like ``check``'s, and those not cached are read in one MGET (``open_circuits``
        scans the whole keyspace, far too slow for that path).
        """
        now = time.time()
        wanted = list(dict.fromkeys(refs))
        stale = [
            ref
            for ref in wanted
            if (cached := self._cache.get(ref)) is None or now - cached[0] >= self.cache_s
        ]
        if stale:
            async with self.redis.pipeline(transaction=False) as pipe:  # a slot per ref
                for ref in stale:
                    pipe.get(self.keys.circuit("state", ref))
                raw = await pipe.execute()
            for ref, state in zip(stale, raw, strict=True):
                self._cache[ref] = (now, json.loads(state) if state else None)
        return {ref for ref in wanted if self._cache[ref][1] is not None}

    async def open_circuits(self) -> dict[str, dict[str, float]]:
        """Every open circuit and its state. A circuit opens only for a version that ran,
        which its workers published: the circuits of every version the tool registry knows
        are read in one round trip (never a scan of the keyspace, which holds every call)."""
        catalog = await ToolDirectory(self.redis, self.keys, max_age_s=0).catalog()
        refs = [
            version_ref(name, v) for name, versions in catalog.versions.items() for v in versions
        ]
        return {ref: state for ref, state in (await self.states(refs)).items() if state}

    async def states(self, refs: list[str]) -> dict[str, dict[str, float] | None]:
        """Each ref's circuit state now (None: closed), in one round trip, without touching
        half-open trials (``check`` may claim one)."""
        async with self.redis.pipeline(transaction=False) as pipe:  # one slot per ref: no MGET
            for ref in refs:
                pipe.get(self.keys.circuit("state", ref))
            raw = await pipe.execute()
        return {ref: json.loads(s) if s else None for ref, s in zip(refs, raw, strict=True)}


def _call_of(member: str) -> CircuitCall:
    """A call of a window's list: tenant, run and call id (a bare call id: an earlier
    release's worker counted it)."""
    parts = member.split(_SEP, 2)
    if len(parts) != 3:
        return ("", "", member)
    return (parts[0], parts[1], parts[2])
