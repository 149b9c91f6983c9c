"""A worker process of one pool: takes commands off ``commands.<pool>`` and runs the calls.

Per call: the fleet-wide tenant and tool semaphores, then the ledger gate (``started`` is
written before any user code), the tool itself, the outcome to the ledger, the outcome to
Kafka, ``committed`` in the ledger, and only then the offset. Redelivered commands find the
ledger ahead of them: a finished call re-emits its stored outcome, a call that started and
lost its worker is reported with effect ``unknown`` and is never run again blindly.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

from executors._registry import ToolRegistry
from executors._runner import run_call
from schemas import CallError, CallOutcome, CancelRequest, ExecutionCommand
from toolfleet.bus import TRANSIENT_ERRORS, KafkaBus, Record
from toolfleet.errors import InvalidMessageError, ToolfleetError
from toolfleet.ledger import Ledger
from toolfleet.metrics import CALL_LATENCY, COMMANDS, IN_FLIGHT, OUTCOMES
from toolfleet.offsets import OffsetTracker
from toolfleet.redis import connect_redis
from toolfleet.registry import publish_tools
from toolfleet.semaphore import FleetSemaphores, semaphore_key
from toolfleet.settings import Settings
from toolfleet.texts import unknown_outcome_text
from toolfleet.topics import command_topic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerLimits:
    """Concurrency limits: per process, and fleet-wide per tenant and per tool."""

    per_worker: int = 100
    per_tenant: int | None = None
    per_tool: Mapping[str, int] = field(default_factory=dict)
    lease_s: float = 30.0


class _NotStarted(ToolfleetError):
    """The ledger refused the attempt; carries what to publish instead (if anything)."""

    def __init__(self, verdict: str, stored: CallOutcome | None) -> None:
        super().__init__(f"ledger verdict {verdict}")
        self.verdict = verdict
        self.stored = stored


class Worker:
    """Serves one ToolRegistry as one member of a pool."""

    def __init__(
        self,
        settings: Settings,
        registry: ToolRegistry,
        pool: str = "default",
        limits: WorkerLimits | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.pool = pool
        self.limits = limits or WorkerLimits()
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.bus = KafkaBus(settings, service=f"worker-{pool}")
        self.redis = connect_redis(settings)
        self.ledger = Ledger(self.redis)
        self.semaphores = FleetSemaphores(self.redis, lease_s=self.limits.lease_s)
        self._slots = asyncio.Semaphore(self.limits.per_worker)
        self._offsets = OffsetTracker()
        self._handlers: set[asyncio.Task[None]] = set()
        self._running: dict[tuple[str, str], asyncio.Task[None]] = {}  # (run_id, call_id)
        self._cancelled_runs: set[str] = set()
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Stop taking commands; in-flight calls finish before ``run`` returns."""
        self._stopping.set()

    async def run(self) -> None:
        """Publish the pool's tools, then consume commands and cancellations until stopped."""
        await publish_tools(self.redis, self.registry.specs(self.pool))
        await self.bus.start()
        commands = self.bus.consumer(
            [command_topic(self.pool)], group=f"workers.{self.pool}", max_poll_records=200
        )
        # Every worker must see every cancellation: a group of its own, from now on.
        cancels = self.bus.consumer(
            ["cancellations"],
            group=f"cancel-listeners.{self.worker_id}",
            auto_offset_reset="latest",
        )
        commands.subscribe([self.bus.topic(command_topic(self.pool))], listener=_Revocations(self))
        await commands.start()
        await cancels.start()
        listener = asyncio.create_task(self._listen_for_cancellations(cancels))
        try:
            await self._consume(commands)
        finally:
            listener.cancel()
            if self._handlers:
                await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._commit(commands)
            await commands.stop()
            await cancels.stop()
            await self.bus.stop()
            await self.redis.aclose()

    async def _consume(self, consumer: AIOKafkaConsumer) -> None:
        last_commit = time.monotonic()
        while not self._stopping.is_set():
            batches = await consumer.getmany(timeout_ms=50, max_records=200)
            for tp, records in batches.items():
                for record in records:
                    await self._slots.acquire()
                    self._offsets.started(tp, record.offset)
                    task = asyncio.create_task(self._handle(tp, record))
                    self._handlers.add(task)
                    task.add_done_callback(self._handlers.discard)
            if time.monotonic() - last_commit > 0.2:
                await self._commit(consumer)
                last_commit = time.monotonic()

    async def _commit(self, consumer: AIOKafkaConsumer) -> None:
        offsets = self._offsets.committable()
        if offsets:
            await consumer.commit(offsets)

    async def _handle(self, tp: TopicPartition, record: Record) -> None:
        delay = 0.1
        try:
            while True:
                try:
                    await self._process(record)
                    return
                except InvalidMessageError as exc:
                    await self.bus.dead_letter(record, exc.reason)
                    return
                except TRANSIENT_ERRORS as exc:
                    # Kafka or Redis is away: retry the same command; the ledger makes it safe.
                    log.warning("dependency unavailable", extra={"error": repr(exc)})
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
                except Exception as exc:
                    # A bug that would repeat on every delivery: keep the bytes and the reason.
                    log.exception("command failed", extra={"offset": record.offset})
                    reason = f"worker failed: {type(exc).__name__}: {exc}"
                    await self.bus.dead_letter(record, reason)
                    return
        finally:
            self._offsets.done(tp, record.offset)
            self._slots.release()

    async def _process(self, record: Record) -> None:
        command = ExecutionCommand.decode(record.value or b"")
        COMMANDS.labels(f"worker-{self.pool}", self.pool, command.kind).inc()
        if command.kind != "execute":
            raise InvalidMessageError(
                f"{command.kind} commands are served by the reconciler's pool handlers",
                reason=f"unsupported command kind {command.kind!r} for this worker version",
            )
        tool = self.registry.get(command.tool_name)
        if command.run_id in self._cancelled_runs:
            await self._publish(_skipped(command, self.worker_id))
            return
        limits: list[tuple[str, int]] = []
        if self.limits.per_tenant is not None:
            limits.append((semaphore_key("tenant", command.tenant_id), self.limits.per_tenant))
        tool_limit = self.limits.per_tool.get(command.tool_name)
        if tool_limit is not None:
            limits.append((semaphore_key("tool", command.tool_name), tool_limit))
        holder = f"{self.worker_id}:{command.call_id}:{command.fencing_token}"
        async with self.semaphores.hold(holder, limits):
            outcome = await self._execute(tool, command)
        if outcome is not None:
            await self._publish(outcome)

    async def _execute(self, tool: object, command: ExecutionCommand) -> CallOutcome | None:
        async def gate() -> None:
            verdict, stored = await self.ledger.begin(
                command.tenant_id,
                command.call_id,
                command.fencing_token,
                self.worker_id,
                self.limits.lease_s,
            )
            if verdict != "run":
                raise _NotStarted(verdict, stored)

        key = (command.run_id, command.call_id)
        task = asyncio.current_task()
        assert task is not None
        self._running[key] = task
        IN_FLIGHT.labels(self.pool).inc()
        started = time.monotonic()
        renewer = asyncio.create_task(self._renew_lease(command))
        try:
            outcome = await run_call(tool, command, worker_id=self.worker_id, on_started=gate)  # type: ignore[arg-type]
        except _NotStarted as refused:
            return self._refused(command, refused)
        except asyncio.CancelledError:
            if command.run_id not in self._cancelled_runs:
                raise
            # Parent cancellation: no tool output, only the fact that the call was cancelled.
            outcome = _cancelled(command, self.worker_id)
        finally:
            renewer.cancel()
            IN_FLIGHT.labels(self.pool).dec()
            self._running.pop(key, None)
        CALL_LATENCY.labels(self.pool, command.tool_name).observe(time.monotonic() - started)
        if outcome.status == "pending_approval":
            await self.ledger.set_pending_approval(command.tenant_id, command.call_id)
            return outcome
        verdict = await self.ledger.finish(outcome)
        if verdict == "stale":
            log.info(
                "dropping the outcome of a fenced-off attempt", extra={"call": command.call_id}
            )
            return None
        return outcome

    def _refused(self, command: ExecutionCommand, refused: _NotStarted) -> CallOutcome | None:
        if refused.verdict == "done":
            return refused.stored
        if refused.verdict == "unknown":
            return _lost(command, self.worker_id, self.registry)
        if refused.verdict == "missing":
            raise InvalidMessageError(
                "command for a call the ledger does not know",
                reason="no ledger entry for this call: commands must come from the planner",
            )
        return None  # stale: a newer attempt exists; busy: another worker runs it

    async def _publish(self, outcome: CallOutcome) -> None:
        await self.bus.publish_and_wait("outcomes", outcome.run_id, outcome)
        if outcome.status != "pending_approval":
            await self.ledger.commit(outcome.tenant_id, outcome.call_id)
        OUTCOMES.labels(
            f"worker-{self.pool}", outcome.tool_name, outcome.status, outcome.effect
        ).inc()

    async def _renew_lease(self, command: ExecutionCommand) -> None:
        while True:
            await asyncio.sleep(self.limits.lease_s / 3)
            await self.ledger.renew(
                command.tenant_id,
                command.call_id,
                command.fencing_token,
                self.worker_id,
                self.limits.lease_s,
            )

    async def _listen_for_cancellations(self, consumer: AIOKafkaConsumer) -> None:
        async for record in consumer:
            try:
                request = CancelRequest.decode(record.value or b"")
            except InvalidMessageError:
                continue  # the planner dead-letters it; every worker doing so would spam
            if request.call_id is None:
                self._cancelled_runs.add(request.run_id)
                for (run_id, _call_id), task in list(self._running.items()):
                    if run_id == request.run_id:
                        task.cancel()


class _Revocations(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.worker._offsets.forget(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        return None


def _base(command: ExecutionCommand, worker_id: str) -> dict[str, object]:
    return {
        "tenant_id": command.tenant_id,
        "run_id": command.run_id,
        "turn_id": command.turn_id,
        "call_id": command.call_id,
        "tool_name": command.tool_name,
        "index": command.index,
        "attempt": command.attempt,
        "fencing_token": command.fencing_token,
        "worker_id": worker_id,
        "finished_at": time.time(),
    }


def _skipped(command: ExecutionCommand, worker_id: str) -> CallOutcome:
    return CallOutcome(**_base(command, worker_id), status="skipped", effect="not_executed")


def _cancelled(command: ExecutionCommand, worker_id: str) -> CallOutcome:
    return CallOutcome(
        **_base(command, worker_id),
        status="cancelled",
        effect="unknown",
        resolved=True,
        error=CallError(type="CancelledError", message="run cancelled", severity="cancellation"),
    )


def _lost(command: ExecutionCommand, worker_id: str, registry: ToolRegistry) -> CallOutcome:
    """A previous holder started the call and vanished: nobody knows whether it applied."""
    spec = registry.get(command.tool_name).spec(command.pool)
    return CallOutcome(
        **_base(command, worker_id),
        status="failed",
        effect="unknown",
        resolved=False,
        output=unknown_outcome_text(spec),
        error=CallError(
            type="WorkerLost",
            message="the worker running this call stopped before reporting an outcome",
        ),
    )
