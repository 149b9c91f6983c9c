"""Circuit breakers per tool version: stop dispatching a version whose error rate spiked.

Workers record every executed call's result in a sliding window per tool version (Redis,
counted in buckets);
when the error rate over the window passes the threshold, the circuit opens: later calls of
that version end ``not_executed`` with a clear message, an alert metric is raised and the
opener files a human task listing the calls that ran while the version was failing. It
closes by operator action (``toolfleet tools resume NAME@VERSION``) or, when configured,
after a half-open trial call succeeds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from redis.asyncio import Redis

from kernel.adapters.metrics import CIRCUIT_OPEN, labelled
from kernel.rules.versions import version_ref
from kernel.settings import Settings
from kernel.stores.keys import Keys
from kernel.stores.registry import ToolDirectory

COUNT_FUNCTION = """
local function count_calls(window, state, recent, now, ids, failed, window_s, min_calls, rate, nb)
  local b = math.floor(now / (window_s / nb))
  local n = redis.call('HINCRBY', window, b .. ':n', #ids)
  if failed > 0 then redis.call('HINCRBY', window, b .. ':f', failed) end
  local listed = 0
  for first = 1, #ids, 500 do  -- unpack has a stack limit: push in slices
    local slice = {}
    for i = first, math.min(#ids, first + 499) do slice[#slice + 1] = now .. '|' .. ids[i] end
    listed = redis.call('LPUSH', recent, unpack(slice))
  end
  if listed > 1100 then redis.call('LTRIM', recent, 0, 999) end
  if n == #ids then
    -- A new bucket (once per window / buckets, not on every call): forget the one that left
    -- the window and keep both keys alive for another window.
    local ttl = math.ceil(window_s) + 60
    redis.call('HDEL', window, (b - nb) .. ':n', (b - nb) .. ':f')
    redis.call('EXPIRE', window, ttl)
    redis.call('EXPIRE', recent, ttl)
  end
  -- Successes never raise the error rate: the window is evaluated when failures come in
  -- (successes that only bring it up to min_calls leave the decision to the next failure).
  if failed == 0 or redis.call('EXISTS', state) == 1 then return {} end
  local calls, fails = 0, 0
  for i = 0, nb - 1 do
    calls = calls + tonumber(redis.call('HGET', window, (b - i) .. ':n') or '0')
    fails = fails + tonumber(redis.call('HGET', window, (b - i) .. ':f') or '0')
  end
  if calls < min_calls or fails / calls < rate then return {} end
  redis.call('SET', state, cjson.encode({opened_at=now, failed=fails, calls=calls}))
  local opened = {}
  for _, entry in ipairs(redis.call('LRANGE', recent, 0, -1)) do
    local sep = string.find(entry, '|', 1, true)
    if tonumber(string.sub(entry, 1, sep - 1)) >= now - window_s then
      opened[#opened + 1] = string.sub(entry, sep + 1)
    end
  end
  return opened
end
"""
"""Lua: count executed calls (``ids``, ``failed`` of them failed) in a tool version's sliding
window (KEYS ``window_keys``: bucket counts, state, recent calls); returns the window's call
ids when they opened the circuit, else {}. Counting a call is O(1): the window is counted in
``_BUCKETS`` buckets and summed only when failures come in."""

_BUCKETS = 12
"""Buckets per window: a bucket leaves the window as a whole, so the window is exact to 1/12."""


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

    def window_keys(self, ref: str) -> list[str]:
        """The keys ``COUNT_FUNCTION`` takes for one tool version."""
        return [self.keys.circuit(part, ref) for part in ("window", "state", "calls")]

    def window_args(self) -> list[float]:
        """``COUNT_FUNCTION``'s window_s, min_calls, rate and bucket count, as configured."""
        s = self.settings
        return [s.circuit_window_s, s.circuit_min_calls, s.circuit_error_rate, _BUCKETS]

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
