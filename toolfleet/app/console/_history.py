"""The console's history recorder: fills the history (``kernel.stores.history``) from the
fleet's topics, inside ``toolfleet console``.

It reads ``turn-results``, ``approvals``, ``human-tasks``, ``task-resolutions`` and
``cancellations`` with one consumer group shared by every console replica (``console-history``;
a one-tenant console's group is its tenant's), through the services' own consume loop: each
record is handled once per group, offsets are committed once written, a redelivered record
rewrites the same entry, and a record that does not decode, or a decision whose signature
does not check out, is dead-lettered as every service does. A new group starts from the
oldest records the topics keep, so a console started on a running fleet fills the history
with what Kafka still has; records older than the history's retention are skipped.

It runs in the console because the history is the console's: it needs no deployment of its
own (the chart's console Deployment is unchanged), the replicas share the work through their
group, and a console that is down leaves its records to the others, or to itself when it is
back (the topics keep them). While no console runs, nothing is recorded: the gap is filled
from the topics when one starts, within the topics' retention.

A turn's tool versions and trace ids are read from the ledger entries of its calls (one round
trip); an entry that expired leaves them unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from typing import Literal

from redis.asyncio import Redis

from kernel.adapters.backoff import RECONNECT
from kernel.adapters.bus import TRANSIENT_ERRORS, ConsumeLoop, KafkaBus, Record
from kernel.errors import ConfigurationError
from kernel.rules.auth import DecisionAuth
from kernel.settings import Settings
from kernel.stores.door import Stores
from kernel.stores.history import (
    History,
    cancellation_entry,
    decision_entry,
    seq_of,
    task_entry,
    turn_entry,
)
from schemas import ApprovalDecision, CancelRequest, HumanTask, TaskResolution, TurnResult

log = logging.getLogger(__name__)

TOPICS = ("turn-results", "approvals", "human-tasks", "task-resolutions", "cancellations")
"""The logical topics the recorder reads."""
GROUP = "console-history"
"""The consumer group every console for every tenant shares."""
CONCURRENCY = 64
"""Records written at once (each a few Redis round trips)."""

RecorderState = Literal["connecting", "recording", "down"]


class HistoryRecorder:
    """Consumes the fleet's topics into the history, in the background of a console.

    ``tenant``: a one-tenant console's recorder records that tenant only, in a group of its
    own (consoles for every tenant record it too: the same entries, written the same way).
    """

    def __init__(self, settings: Settings, redis: Redis, *, tenant: str | None = None) -> None:
        self.settings = settings
        self.tenant = tenant
        stores = Stores(redis, settings)
        self.history: History = stores.history()
        self.ledger = stores.ledger()
        self.auth = DecisionAuth.of(settings)
        self.group = GROUP if tenant is None else f"{GROUP}.{tenant}"
        self.state: RecorderState = "connecting"
        self.error: str | None = None
        self.written = 0
        """Entries written since the console started (a redelivery counts again)."""
        self._loop: ConsumeLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        """Start recording in the background."""
        self._task = asyncio.create_task(self._run(), name="console-history")

    async def stop(self) -> None:
        """Finish the records in hand, commit, and stop."""
        self._stopping.set()
        if self._loop is not None:
            self._loop.stop()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 10.0)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task

    async def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            bus = KafkaBus(self.settings, service="console")
            consumer = None
            try:
                await bus.start()
                consumer = bus.consumer(TOPICS, group=self.group)
                await consumer.start()
                self._loop = ConsumeLoop(
                    bus,
                    consumer,
                    self.handle,
                    concurrency=CONCURRENCY,
                    cut_off_after_s=self.settings.cut_off_after_s,
                )
                self.state, self.error, failures = "recording", None, 0
                await self._loop.run()
            except TRANSIENT_ERRORS as exc:  # CutOffError among them
                self.state, self.error = "down", f"Kafka or Redis unavailable: {exc!r}"[:300]
                log.warning("console history: unavailable", extra={"error": repr(exc)})
            except Exception as exc:  # a bug: said on the API, and recording starts again
                self.state, self.error = "down", f"recorder failed: {exc!r}"[:300]
                log.exception("console history recorder failed")
            finally:
                self._loop = None
                with contextlib.suppress(*TRANSIENT_ERRORS):
                    if consumer is not None:
                        await consumer.stop()
                    await bus.stop()
            if not self._stopping.is_set():
                failures += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), RECONNECT.delay(failures))
                self.state = "connecting"

    def _mine(self, tenant_id: str, at: float) -> bool:
        """Whether to record an entry of ``tenant_id`` from ``at``: of this console's tenant,
        and not older than the retention (it would be trimmed at once)."""
        if self.tenant is not None and tenant_id != self.tenant:
            return False
        return at >= time.time() - self.history.retention_s

    async def handle(self, record: Record) -> None:
        """Write one record's entry; InvalidMessageError (dead-lettered) for bad bytes or a
        decision that is not its tenant's."""
        topic = record.topic.removeprefix(self.settings.topic_prefix)
        raw = record.value or b""
        stamp = getattr(record, "timestamp", None)
        ms = stamp if isinstance(stamp, int) and stamp > 0 else int(time.time() * 1000)
        at, seq = ms / 1000, seq_of(ms, record.offset)
        if topic == "turn-results":
            result = TurnResult.decode(raw)
            if self._mine(result.tenant_id, at):
                await self._turn(result, at, seq)
        elif topic == "approvals":
            decision = ApprovalDecision.decode(raw)
            self.auth.verify(decision)
            if self._mine(decision.tenant_id, at):
                await self._put(self.history.put(decision_entry(decision, at=at, seq=seq)))
        elif topic == "human-tasks":
            task = HumanTask.decode(raw)
            if self._mine(task.tenant_id, task.created_at):
                await self._put(self.history.put(task_entry(task)))
        elif topic == "task-resolutions":
            resolution = TaskResolution.decode(raw)
            self.auth.verify(resolution)
            if self._mine(resolution.tenant_id, at):
                await self._put(self.history.resolve_task(resolution, at=at))
        elif topic == "cancellations":
            cancel = CancelRequest.decode(raw)
            self.auth.verify(cancel)
            if self._mine(cancel.tenant_id, at):
                await self._put(self.history.put(cancellation_entry(cancel, at=at, seq=seq)))

    async def _put(self, writing: Awaitable[object]) -> None:
        await writing
        self.written += 1

    async def _turn(self, result: TurnResult, at: float, seq: str) -> None:
        calls = [c.call_id for c in result.calls] + [i.call_id for i in result.interruptions]
        try:
            entries = await self.ledger.read(result.tenant_id, result.run_id, calls)
        except ConfigurationError:  # an entry of a newer state version: shown without
            entries = {}
        versions = {c: e.tool_version for c, e in entries.items() if e.tool_version}
        traces = {c: e.trace_id for c, e in entries.items() if e.trace_id}
        entry = turn_entry(
            result,
            at=at,
            seq=seq,
            versions=versions,
            traces=traces,
            output_max_bytes=self.settings.history_output_max_bytes,
        )
        await self._put(self.history.put(entry))
