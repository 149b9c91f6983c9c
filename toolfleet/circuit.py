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
from dataclasses import dataclass
from typing import Literal

from redis.asyncio import Redis

from toolfleet.keys import Keys
from toolfleet.metrics import CIRCUIT_OPEN
from toolfleet.redis import text
from toolfleet.settings import Settings

_BUCKETS = 12
"""The window is counted in this many buckets, so recording a call is O(1)."""

# KEYS: bucket counts (hash), state, recent calls (list); ARGV: now, call_id, failed (0/1),
# window_s, min_calls, rate, buckets. Returns the window's call ids when this call opened
# the circuit, else {}. The window is summed only when a failure is recorded.
_RECORD = """
local now, window, nb = tonumber(ARGV[1]), tonumber(ARGV[4]), tonumber(ARGV[7])
local b = math.floor(now / (window / nb))
local n = redis.call('HINCRBY', KEYS[1], b .. ':n', 1)
if ARGV[3] == '1' then redis.call('HINCRBY', KEYS[1], b .. ':f', 1) end
local listed = redis.call('LPUSH', KEYS[3], now .. '|' .. ARGV[2])
if listed > 1100 then redis.call('LTRIM', KEYS[3], 0, 999) end
if n == 1 then
  -- A new bucket (once per window / buckets, not on every call): forget the one that left
  -- the window and keep both keys alive for another window.
  local ttl = math.ceil(window) + 60
  redis.call('HDEL', KEYS[1], (b - nb) .. ':n', (b - nb) .. ':f')
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('EXPIRE', KEYS[3], ttl)
end
-- A success never raises the error rate: the window is evaluated when a failure comes in
-- (a success that only brings it up to min_calls leaves the decision to the next failure).
if ARGV[3] ~= '1' or redis.call('EXISTS', KEYS[2]) == 1 then return {} end
local n, f = 0, 0
for i = 0, nb - 1 do
  n = n + tonumber(redis.call('HGET', KEYS[1], (b - i) .. ':n') or '0')
  f = f + tonumber(redis.call('HGET', KEYS[1], (b - i) .. ':f') or '0')
end
if n < tonumber(ARGV[5]) or f / n < tonumber(ARGV[6]) then return {} end
redis.call('SET', KEYS[2], cjson.encode({opened_at=now, failed=f, calls=n}))
local ids = {}
for _, entry in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  local sep = string.find(entry, '|', 1, true)
  if tonumber(string.sub(entry, 1, sep - 1)) >= now - window then
    ids[#ids + 1] = string.sub(entry, sep + 1)
  end
end
return ids
"""


def version_ref(tool: str, version: str) -> str:
    """How operators name a tool version: ``NAME@VERSION``."""
    return f"{tool}@{version}"


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
        self._record = redis.register_script(_RECORD)
        self._cache: dict[str, tuple[float, dict[str, float] | None]] = {}

    async def record(self, ref: str, call_id: str, failed: bool) -> list[str]:
        """Add one executed call; the window's call ids when this call opened the circuit."""
        s = self.settings
        opened = await self._record(
            keys=[self.keys.circuit(part, ref) for part in ("window", "state", "calls")],
            args=[time.time(), call_id, int(failed), s.circuit_window_s, s.circuit_min_calls,
                  s.circuit_error_rate, _BUCKETS],
        )  # fmt: skip
        if opened:
            self._cache.pop(ref, None)
            CIRCUIT_OPEN.labels(ref).set(1)
        return [text(m) for m in opened]

    async def check(self, ref: str) -> Verdict:
        """May a call of this version run? Cached briefly: this is on every call's path."""
        now = time.time()
        cached = self._cache.get(ref)
        if cached is None or now - cached[0] >= self.cache_s:
            raw = await self.redis.get(self.keys.circuit("state", ref))
            cached = (now, json.loads(raw) if raw else None)
            self._cache[ref] = cached
        state = cached[1]
        CIRCUIT_OPEN.labels(ref).set(0 if state is None else 1)
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

    async def open_circuits(self) -> dict[str, dict[str, float]]:
        """Every open circuit and its state."""
        found = {}
        prefix = self.keys.circuit("state", "")
        async for key in self.redis.scan_iter(f"{prefix}*"):
            raw = await self.redis.get(key)
            if raw:
                found[text(key).removeprefix(prefix)] = json.loads(raw)
        return found
