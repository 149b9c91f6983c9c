"""What follows an outcome onto Kafka, for every outcome published in one loop turn at once.

Once an outcome is on Kafka its ledger entry becomes ``committed`` and, when the call ran, it
is counted in its tool version's circuit window. Per call these were two scripts and two
waits; here the outcomes handed in during one event-loop turn share one commit script (per
slot group on a Redis Cluster) and one count per tool version (the scripts of one turn share
a round trip too, see ``kernel.adapters.redis``), so the step costs Redis and the worker a
fraction of a command per call. Commit and count are separate scripts because their keys live
in different hash slots: a failure between them fails the batch's callers, and a caller that
retries its outcome may be counted twice in the window (the window is a rate over a minute;
the ledger stays exact).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from typing import Any

from kernel.rules.effects import counts_against_circuit
from kernel.stores.circuit import CircuitBreaker, CircuitCall
from kernel.stores.ledger import Ledger
from schemas import CallOutcome

_Entry = tuple[CallOutcome, bool | None, "asyncio.Future[list[CircuitCall]]"]
"""An outcome, whether its call is counted as failed (None: not counted), its caller's reply."""


class AfterPublish:
    """Commits published outcomes and counts executed calls, a loop turn's worth at a time."""

    def __init__(self, ledger: Ledger, circuits: CircuitBreaker) -> None:
        self.ledger = ledger
        """Commits the outcomes, a plain run kept its retention after (``Ledger.commit``)."""
        self.circuits = circuits
        self._pending: dict[str | None, list[_Entry]] = {}
        self._writes: set[asyncio.Task[None]] = set()

    def __call__(self, outcome: CallOutcome, ref: str | None) -> asyncio.Future[list[CircuitCall]]:
        """Commit ``outcome``; with ``ref`` (its tool version), count its call as well.

        The reply is the window's calls (tenant, run, call id) when these calls opened the
        circuit (given to one caller, the last failed call of the batch, which files the
        tasks), else []. A failed write fails every caller of its batch: each retries its
        own outcome.
        """
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[list[CircuitCall]] = loop.create_future()
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
        # The ledger's commit (one script per slot group on a cluster, one for all on a
        # single server) and one count for the tool version: issued together, they share one
        # round trip.
        calls = [(o.tenant_id, o.run_id, o.call_id) for o, _, _ in entries]
        steps: list[Awaitable[Any]] = [self.ledger.commit(calls)]
        counted = [
            ((outcome.tenant_id, outcome.run_id, outcome.call_id), failed)
            for outcome, failed, _ in entries
            if failed is not None
        ]
        if ref is not None and counted:
            # The wall clock: the window's buckets are shared by every worker's clock.
            steps.append(
                self.circuits.count(
                    ref,
                    [call for call, _ in counted],
                    failed=sum(failed for _, failed in counted),
                    now=time.time(),
                )
            )
        try:
            replies = await asyncio.gather(*steps)
        except BaseException as exc:
            for _, _, reply in entries:
                if not reply.done():
                    reply.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        opened: list[CircuitCall] = replies[-1] if ref is not None and counted else []
        if opened and ref is not None:
            self.circuits.opened(ref)
        opener = max((i for i, (_, f, _) in enumerate(entries) if f), default=None)
        for i, (_, _, reply) in enumerate(entries):
            if not reply.done():
                reply.set_result(opened if i == opener else [])
