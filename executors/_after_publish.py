"""What follows an outcome onto Kafka, for every outcome published in one loop turn at once.

Once an outcome is on Kafka its ledger entry becomes ``committed`` and, when the call ran, it
is counted in its tool version's circuit window. Per call these were two scripts and two
waits; here the outcomes handed in during one event-loop turn share one script per tool
version (the scripts of one turn share a round trip too, see ``kernel.adapters.redis``), so the
step costs Redis and the worker a fraction of a command per call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis

from kernel.adapters.redis import text
from kernel.rules.effects import counts_against_circuit
from kernel.stores.circuit import COUNT_FUNCTION, CircuitBreaker
from kernel.stores.keys import Keys
from kernel.stores.ledger import COMMIT_FUNCTION
from schemas import CallOutcome

# KEYS: each of the n ledger entries and its audit chain, then the tool version's window
# keys (none: commit only). ARGV: n, retention_s, now, window_s, min_calls, rate, buckets,
# then per entry its call id and whether it is counted ('-' no, '0' succeeded, '1' failed).
# Returns what count_calls returns.
_COMMIT_AND_COUNT = (
    COMMIT_FUNCTION
    + COUNT_FUNCTION
    + """
local n, retention_s = tonumber(ARGV[1]), tonumber(ARGV[2])
local ids, failed = {}, 0
for i = 1, n do
  commit(KEYS[2 * i - 1], KEYS[2 * i], retention_s)
  local counted = ARGV[7 + 2 * i]
  if counted ~= '-' then
    ids[#ids + 1] = ARGV[6 + 2 * i]
    if counted == '1' then failed = failed + 1 end
  end
end
if #ids == 0 then return {} end
return count_calls(KEYS[2 * n + 1], KEYS[2 * n + 2], KEYS[2 * n + 3], tonumber(ARGV[3]), ids,
  failed, tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]))
"""
)

_Entry = tuple[CallOutcome, bool | None, "asyncio.Future[list[str]]"]
"""An outcome, whether its call is counted as failed (None: not counted), its caller's reply."""


class AfterPublish:
    """Commits published outcomes and counts executed calls, a loop turn's worth at a time."""

    def __init__(
        self, redis: Redis, keys: Keys, circuits: CircuitBreaker, retention_s: int
    ) -> None:
        self.keys = keys
        self.circuits = circuits
        self.retention_s = retention_s
        self._script = redis.register_script(_COMMIT_AND_COUNT)
        self._pending: dict[str | None, list[_Entry]] = {}
        self._writes: set[asyncio.Task[None]] = set()

    def __call__(self, outcome: CallOutcome, ref: str | None) -> asyncio.Future[list[str]]:
        """Commit ``outcome``; with ``ref`` (its tool version), count its call as well.

        The reply is the window's call ids when these calls opened the circuit (given to one
        caller, the last failed call of the batch, which files the task), else []. A failed
        write fails every caller of its batch: each retries its own outcome.
        """
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[list[str]] = loop.create_future()
        failed = None if ref is None else counts_against_circuit(outcome.status)
        if not self._pending:
            loop.call_soon(self._write_pending)
        self._pending.setdefault(ref, []).append((outcome, failed, reply))
        return reply

    def _write_pending(self) -> None:
        pending, self._pending = self._pending, {}
        for ref, entries in pending.items():
            task = asyncio.create_task(self._write(ref, entries))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)

    async def _write(self, ref: str | None, entries: Sequence[_Entry]) -> None:
        keys = []
        for outcome, _, _ in entries:
            tenant, run, call = outcome.tenant_id, outcome.run_id, outcome.call_id
            keys += [self.keys.call(tenant, run, call), self.keys.audit(tenant, run, call)]
        # The wall clock: the window's buckets are shared by every worker's clock.
        args: list[Any] = [len(entries), self.retention_s, time.time()]
        args += self.circuits.window_args()
        if ref is not None:
            keys += self.circuits.window_keys(ref)
        for outcome, failed, _ in entries:
            args += [outcome.call_id, "-" if failed is None else str(int(failed))]
        try:
            opened = [text(m) for m in await self._script(keys=keys, args=args)]
        except BaseException as exc:
            for _, _, reply in entries:
                if not reply.done():
                    reply.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        if opened and ref is not None:
            self.circuits.opened(ref)
        opener = max((i for i, (_, f, _) in enumerate(entries) if f), default=None)
        for i, (_, _, reply) in enumerate(entries):
            if not reply.done():
                reply.set_result(opened if i == opener else [])
