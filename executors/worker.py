"""A worker process of one pool: takes commands off ``commands.<pool>`` and runs the calls.

Per call (admission applied every quota before the command reached Kafka): the ledger gate
(``started`` is written before any user code), the tool itself, the outcome to the ledger and
the call's admission slots freed (one burst; the freeing pass admits what waited for them),
the outcome to Kafka, ``committed`` in the ledger, and only then the offset. Redelivered
commands find the ledger ahead of them: a finished call re-emits its stored outcome, a call
whose holder is alive is waited for, and a call that started and lost its worker is
reported with effect ``unknown`` and is never run again blindly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from asyncio import gather as _gather
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from time import time as _wall_clock
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from opentelemetry import trace

from executors._after_publish import AfterPublish
from executors._progress import ProgressPublisher
from kernel.adapters.background import BackgroundTasks
from kernel.adapters.backoff import STEP, nap
from kernel.adapters.bus import (
    NEVER_FITS,
    TRANSIENT_ERRORS,
    WORK_EPOCH,
    Bus,
    ConsumeLoop,
    Record,
    release_slot,
)
from kernel.adapters.dependencies import DEPENDENCIES
from kernel.adapters.health import HEALTH
from kernel.adapters.logs import RecurringFailure, ids_of, log_context
from kernel.adapters.metrics import (
    CALL_LATENCY,
    COMMANDS,
    HUMAN_TASKS,
    IN_FLIGHT,
    OUTCOMES,
    build_version,
    labelled,
    tool_label,
)
from kernel.adapters.topics import command_topic
from kernel.adapters.tracing import consuming, phase, tracer
from kernel.errors import (
    InvalidMessageError,
    ToolfleetError,
    ToolNotFoundError,
    UnreplicatedWriteError,
)
from kernel.rules.auth import CompletionHandle, DecisionAuth
from kernel.rules.effects import counts_against_circuit, effect_of_probe, fleet_retries
from kernel.rules.outcomes import (
    WORKER_LOST,
    completed,
    ended,
    identity,
    lost,
    missed_schedule_to_start,
    not_started_in_time,
    reported,
)
from kernel.rules.state_versions import carries, spec_for_readers
from kernel.rules.texts import CIRCUIT_OPEN, UNKNOWN_OUTCOME, unknown_outcome_text
from kernel.rules.versions import version_ref
from kernel.settings import Settings
from kernel.stores.admission import WorkerStatus
from kernel.stores.admitting import CREDIT_HEADER, Admitter, paced_scopes
from kernel.stores.circuit import CircuitCall, task_call_ref
from kernel.stores.door import Stores
from kernel.stores.ledger import CallFailure, command_for
from kernel.stores.registry import announce_tools
from kernel.stores.tasks import new_task_id
from kernel.tools import (
    HEARTBEAT_WRITE_S,
    Deferred,
    FailureRecording,
    Tool,
    ToolFailure,
    ToolRegistry,
    accept_completion,
    run_call,
    run_compensate,
    run_probe,
)
from schemas import (
    CallError,
    CallOutcome,
    CancelRequest,
    CompletionMessage,
    ExecutionCommand,
    HumanTask,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

_CallKey = tuple[str, str, str]
"""(tenant, run, call): how the worker knows a call it runs."""


@dataclass(frozen=True)
class WorkerLimits:
    """This process's slots (they count in its pool's capacity) and the ledger lease."""

    per_worker: int = 100
    lease_s: float = 30.0
    """How long a silent holder keeps a call (and its slots); renewed every third of it."""
    heartbeat_write_s: float = HEARTBEAT_WRITE_S
    """The least interval between two ledger writes of one call's heartbeat details."""


class _NotStarted(ToolfleetError):
    """The ledger refused the attempt; carries its verdict (and, for an attempt that never
    starts because it waited too long, the outcome already stored)."""

    def __init__(self, verdict: str, outcome: CallOutcome | None = None) -> None:
        super().__init__(f"ledger verdict {verdict}")
        self.verdict = verdict
        self.outcome = outcome


class Worker:
    """Serves one ToolRegistry as one member of a pool."""

    def __init__(
        self,
        settings: Settings,
        registry: ToolRegistry,
        pool: str = "default",
        limits: WorkerLimits | None = None,
        worker_id: str | None = None,
        *,
        bus: Bus,
        stores: Stores,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.pool = pool
        self.limits = limits or WorkerLimits()
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.service = f"worker-{pool}"
        self.bus = bus
        bus.gate = stores.output_gate()
        self.stores = stores
        self.keys = stores.keys
        self.ledger = stores.ledger()
        self.admission = stores.admission()
        # Frees the slots of the admitted calls it is done with, and its passes admit the
        # calls waiting for them: no planner on a call's path once it was admitted.
        self._credits = _Credits(self)
        self.admitter = Admitter(
            self.admission, bus, service=self.service, scan=False, credits=self._credits
        )
        self.circuits = stores.circuits()
        self.tasks = stores.tasks()
        self.schema = stores.schema()
        self.auth = DecisionAuth.of(settings)
        self._after_publish = AfterPublish(self.ledger, self.circuits)
        self.progress = ProgressPublisher(bus)
        """Sends the running calls' progress events on ``progress``, in the background."""
        self._loop: ConsumeLoop | None = None
        """The consume loop of the pool's commands, while serving."""
        self._owned: set[TopicPartition] = set()
        """Partitions of the pool's topic this worker owns: with none, it adds no capacity."""
        self._assignment_changed = asyncio.Event()
        # Keyed by (tenant, run, call): two tenants may use the same run and call ids, and a
        # cancellation must never reach another tenant's call.
        self._running: dict[_CallKey, tuple[asyncio.Task[None], asyncio.Future[None]]] = {}
        self._leases: dict[_CallKey, ExecutionCommand] = {}
        """Calls past the ledger gate, whose leases ``_renew_leases`` keeps alive."""
        self._tracer = tracer("worker")
        self._recording = FailureRecording.of(settings)
        """The secrets taken out of what user code raised, and the console its lines link to."""
        self._cancelled_runs: dict[tuple[str, str], str] = {}
        """(tenant, run) of runs cancelled while this worker lives, with the reason given."""
        self._stopping = asyncio.Event()
        self._started_at = time.time()
        self.background = BackgroundTasks(
            f"worker {self.worker_id}", self.stop, stopping=self._stopping
        )
        """Its loops beside the commands' (capacity, leases, cancellations, completions): one
        that ends stops the worker, whose ``run`` then raises its error."""

    def stop(self) -> None:
        """Stop taking commands; in-flight calls finish before ``run`` returns."""
        self._stopping.set()
        if self._loop is not None:
            self._loop.stop()

    @property
    def owned_partitions(self) -> frozenset[TopicPartition]:
        """The partitions of the pool's topic this worker owns now (none: it runs nothing)."""
        return frozenset(self._owned)

    async def run(self) -> None:
        """Publish the pool's tools, then consume commands and cancellations until stopped."""
        await self.registry.open()
        try:
            await self._serve()
        finally:
            await self.registry.close()

    async def _serve(self) -> None:
        # What the version in force lets the registry's readers read (the earlier release's
        # planners may still run); the tools' own timeouts hold here whatever is published.
        in_force = await self.stores.schema().in_force(fresh_read=True)
        specs = [spec_for_readers(spec, in_force) for spec in self.registry.specs(self.pool)]
        await self.stores.publish_tools(specs)
        await self.bus.start()
        self.progress.start()
        await announce_tools(self.bus, specs)  # the clients' directory (release gates)
        commands = self.bus.consumer([], group=f"workers.{self.pool}", max_poll_records=200)
        # The one consume loop, with the worker's numbers: a slot per running tool (given
        # back when the tool ends, ``release_slot``), outcomes still being written and
        # published bounded too (Kafka refusing writes, say), so a worker stops taking
        # commands; commands of one call are not held back behind each other (the ledger
        # decides); a command that raises is a bug that repeats on every delivery: it is
        # dead-lettered at once; a step is retried by the STEP backoff.
        self._loop = ConsumeLoop(
            self.bus,
            commands,
            self._process,
            max_attempts=1,
            backoff_s=STEP.first_s,
            max_backoff_s=STEP.cap_s,
            concurrency=self.limits.per_worker,
            in_hand=4 * self.limits.per_worker,
            ordered=False,
            poll_ms=50,
            max_records=200,
            cut_off_after_s=self.settings.cut_off_after_s,
        )
        if self._stopping.is_set():
            self._loop.stop()
        commands.subscribe([self.bus.topic(command_topic(self.pool))], listener=_Ownership(self))
        # Every worker must see every cancellation: a group of its own, from now on.
        cancels = self.bus.consumer(
            ["cancellations"],
            group=f"cancel-listeners.{self.worker_id}",
            auto_offset_reset="latest",
        )
        # Completions of the pool's deferred calls: one group per pool, so any worker of it
        # takes them, the one that started the call long gone or not.
        completions = self.bus.consumer(["completions"], group=f"completions.{self.pool}")
        await commands.start()
        await cancels.start()
        await completions.start()
        background = self.background
        background.start("cancellation listener", self._listen_for_cancellations(cancels))
        background.start("completion taker", self._take_completions(completions))
        background.start("lease renewal", self._renew_leases())
        registrar = background.start("capacity registration", self._register_capacity())
        leaving = asyncio.create_task(self._leave_pool_when_stopping(registrar))
        try:
            # In-flight calls finish before it returns (or raises CutOffError: the commands
            # go to a peer, and the ledger makes that safe). A background loop that ends
            # stops it too (``background``), and its error is raised below.
            await self._loop.run()
        finally:
            self._stopping.set()
            await leaving
            await background.close()
            with contextlib.suppress(*TRANSIENT_ERRORS):
                await self.admitter.drain()  # what its last passes admitted is on Kafka
            await commands.stop()
            await cancels.stop()
            await completions.stop()
            await self.progress.stop()  # the last progress reports, before the producer goes
            await self.bus.stop()
        background.raise_failure()

    async def _leave_pool_when_stopping(self, registrar: asyncio.Task[None]) -> None:
        """Once the worker stops taking commands, its slots leave the pool's capacity (before
        its in-flight calls end), so admission sends it nothing more."""
        await self._stopping.wait()
        registrar.cancel()
        with contextlib.suppress(*TRANSIENT_ERRORS):
            await self.admission.unregister_worker(self.pool, self.worker_id)

    async def _register_capacity(self) -> None:
        """Keep this worker's slots in its pool's capacity (admission admits up to it), and
        only while it owns a partition of the pool's topic: a worker beyond the partition
        count (autoscaled past it, say) would get no command, and its slots must not let
        admission send more than the others can run. Re-registered at once when the
        assignment changes.

        It waits and reads the clock through functions bound at import (``nap``,
        ``_wall_clock``): a test sharing the loop with an in-process fleet may patch asyncio's
        or time's module-wide, and a patched ``wait_for`` that never timed out stopped every
        registration for good (the pool's capacity expired: every call waited)."""
        ttl = self.settings.worker_capacity_ttl_s
        failing = RecurringFailure(log, "could not register capacity")
        while True:
            self._assignment_changed.clear()
            slots = self.limits.per_worker if self._owned else 0
            try:
                await self.admission.register_worker(
                    self.pool, self.worker_id, slots, ttl, _wall_clock(), status=self._status()
                )
            except TRANSIENT_ERRORS as exc:  # said once by the dependency monitor
                DEPENDENCIES.failed(exc)
                log.debug("could not register capacity", extra={"error": repr(exc)})
            except Exception as exc:  # never let the loop die: the pool would lose our slots
                failing.failed(exc)
            else:
                failing.succeeded()
            await nap(ttl / 3, wake=self._assignment_changed.wait)

    def _status(self) -> WorkerStatus:
        """What operators see of this worker (the console's pools page)."""
        return WorkerStatus(
            in_flight=len(self._running),
            build=build_version(),
            host=socket.gethostname(),
            started_at=self._started_at,
            tools={spec.lookup_key: spec.version for spec in self.registry.specs(self.pool)},
        )

    async def _process(self, record: Record) -> None:
        self._credits.arrived(record)
        command = ExecutionCommand.decode(record.value or b"")
        labelled(COMMANDS, self.service, self.pool, command.kind).inc()
        with (
            log_context(**ids_of(command)),
            consuming(
                self._tracer,
                f"toolfleet call {command.tool_name}",
                record,
                self.settings.group(f"workers.{self.pool}"),
            ) as span,
        ):
            if span.is_recording():
                span.set_attributes(
                    {
                        "rpc.system": "toolfleet",
                        "rpc.service": self.pool,
                        "rpc.method": command.tool_name,
                        "toolfleet.tenant_id": command.tenant_id,
                        "toolfleet.run_id": command.run_id,
                        "toolfleet.call_id": command.call_id,
                        "toolfleet.kind": command.kind,
                        "toolfleet.attempt": command.attempt,
                        "toolfleet.worker_id": self.worker_id,
                    }
                )
            slots = _Slots(self.admitter, command, paced_scopes(record.headers))
            if slots.held:
                # This worker frees them: its outcomes say so, and no planner reads them.
                command = command.model_copy(update={"admitted": False})
            try:
                await self._process_command(command, slots)
            except InvalidMessageError:
                await slots.free()  # dead-lettered: the command never comes back
                raise
            await slots.free()  # done with no outcome to tell (a fenced-off attempt)

    async def _process_command(self, command: ExecutionCommand, slots: _Slots) -> None:
        try:
            # No version: the newest this worker serves (older planners, the reconciler).
            tool = self.registry.get(command.tool_name, command.tool_version)
        except ToolNotFoundError as missing:
            # The planner saw the tool (or version) in the registry, this worker does not
            # serve it: a deployment mismatch. Nothing ran; say so instead of hiding the command.
            await self._publish(_not_served(command, self.worker_id, str(missing)), slots)
            return
        if command.kind == "probe":
            await self._publish(await self._probe(tool, command), slots)
            return
        if command.kind == "compensate":
            compensated = await self._compensate(tool, command)
            if compensated is not None:
                await self._publish(compensated, slots)
            return
        run = (command.tenant_id, command.run_id)
        if run in self._cancelled_runs:
            # The ledger's begin refuses it (skipped) unless it began already: a command
            # delivered again after its call ran is answered by its stored outcome, never by
            # "not executed". Marked first: begin refuses it whichever service marks first.
            await self._mark_cancelled(*run, self._cancelled_runs[run])
        ref = version_ref(tool.lookup_key, tool.version)
        circuit = await self.circuits.check(ref)
        if circuit.state == "open" and not await self._began(command):
            await self._publish(_circuit_open(command, self.worker_id, tool, circuit.reason), slots)
            return
        # Tenant and tool quotas were applied by admission before the command reached
        # Kafka: a slot here is only ever taken by a call that can run now.
        outcome = await self._execute(tool, command, slots)
        if outcome is None:
            return
        _describe_span(outcome)
        ran = outcome.status != "pending_approval" and outcome.started_at is not None
        trial = ran and circuit.state == "trial"
        await slots.free(throttled=outcome.throttled)  # freed with finish, unless refused
        with phase(self._tracer, "publish"):
            await _persist(lambda: self.bus.publish_and_wait("outcomes", outcome.run_id, outcome))
            opened = await _persist(
                lambda: self._mark_published(outcome, counted_in=ref if ran and not trial else None)
            )
        if trial:
            failed = counts_against_circuit(outcome.status)
            await _persist(lambda: self.circuits.trial_result(ref, failed))
        if opened:
            tasks = _circuit_tasks(ref, tool, outcome, opened, self.settings.circuit_window_s)
            await _persist(lambda: self._file_circuit_tasks(ref, tasks))

    async def _file_circuit_tasks(self, ref: str, tasks: list[HumanTask]) -> None:
        """The circuit of ``ref`` opened: ask each tenant's operators to reconcile its calls
        that ran (tasks made once: a retry files the same ones again)."""
        for task in tasks:
            await self.tasks.add(task)
            await self.bus.publish_and_wait("human-tasks", ref, task)
        HUMAN_TASKS.labels("circuit_open").inc(len(tasks))
        log.error(
            "circuit opened",
            extra={
                "tool_version": ref,
                "calls": sum(len(t.calls) for t in tasks),
                "tasks": {t.tenant_id: t.task_id for t in tasks},
            },
        )

    async def _execute(
        self, tool: Tool, command: ExecutionCommand, slots: _Slots
    ) -> CallOutcome | None:
        key = (command.tenant_id, command.run_id, command.call_id)
        task = asyncio.current_task()
        assert task is not None
        cancel_call: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # A copy of a command delivered again (a duplicate, a rebalance) can be handled here
        # while the first copy runs the call: it waits in ``_begin`` and must not take over
        # the entries the cancellation listener and the lease renewal go by. The handler that
        # begins the call holds them; the others only fill a gap.
        self._running.setdefault(key, (task, cancel_call))
        started_here = False
        labelled(IN_FLIGHT, self.pool).inc()
        began = time.monotonic()

        async def gate() -> None:
            with phase(self._tracer, "gate"):
                if slots.paced:
                    stopping = self._stopping
                    await _persist(lambda: self.admitter.pace(command, slots.paced, until=stopping))
                late = await self._not_started_in_time(tool, command)
                if late is not None:
                    raise _NotStarted("not_started_in_time", late)
                verdict = await self._begin(command, tool.version)
            if verdict != "run":
                raise _NotStarted(verdict)
            nonlocal started_here
            started_here = True
            self._hold(key, (task, cancel_call), command)
            if slots.paced:
                await _persist(lambda: self.admitter.started(command, slots.paced))

        async def record_upstream(ref: str) -> None:
            await _persist(lambda: self.ledger.record_upstream_ref(command, ref))

        # A call is deferred only once every worker knows the ledger state (version 3).
        deferrals: list[Deferred] = []
        can_defer = carries(await self.schema.in_force(), "long_running")
        raised: list[ToolFailure] = []  # what user code raised (logged by the runner)
        try:
            outcome = await run_call(
                tool,
                command,
                worker_id=self.worker_id,
                hooks=self.registry.hooks,
                on_started=gate,
                cancel_call=cancel_call,
                record_upstream=record_upstream,
                max_output_bytes=self.settings.max_output_bytes,
                phase=self._phase,
                on_failure=raised.append,
                recording=self._recording,
                progress=self.progress.offer,
                progress_interval_s=self.settings.progress_min_interval_s,
                heartbeat=partial(self._heartbeat, command),
                heartbeat_interval_s=self.limits.heartbeat_write_s,
                completion_handle=partial(self._completion_handle, command) if can_defer else None,
                on_deferred=deferrals.append if can_defer else None,
            )
        except _NotStarted as refused:
            if refused.outcome is not None:
                return refused.outcome  # stored as finished: published and committed next
            return await self._refused(command, refused.verdict)
        except asyncio.CancelledError:
            if (command.tenant_id, command.run_id) not in self._cancelled_runs:
                raise
            if not started_here:
                return await self._cancelled_before_it_began(command)
            # Parent cancellation: no tool output, only the fact that the call was cancelled.
            outcome = ended(command, self.worker_id, "cancelled")
        finally:
            # The tool is done: its slot runs the next call while this one's outcome is
            # written and published (the limit is on running tools, not on bookkeeping).
            release_slot()
            self._let_go(key, task, started=started_here)
            labelled(IN_FLIGHT, self.pool).dec()
        latency = labelled(CALL_LATENCY, self.pool, tool_label(command.tool_name))
        latency.observe(time.monotonic() - began)
        if deferrals:
            await self._defer(command, deferrals[0], slots)
            return None
        return await self._end(tool, command, outcome, raised, slots)

    async def _end(
        self,
        tool: Tool,
        command: ExecutionCommand,
        outcome: CallOutcome,
        raised: list[ToolFailure],
        slots: _Slots,
    ) -> CallOutcome | None:
        """The call ran (or waits for approval): its end in the ledger, its slots freed; the
        outcome to publish, None for a fenced-off attempt's."""
        if outcome.status == "pending_approval":
            await asyncio.gather(
                _persist(
                    lambda: self.ledger.set_pending_approval(
                        command.tenant_id, command.run_id, command.call_id
                    )
                ),
                slots.free(),
            )
            return outcome
        outcome = self._as_reported(tool, command, outcome)
        final = outcome
        failure = _call_failure(raised, command, self.worker_id)
        # One burst: the call's end in the ledger and its slots freed (both idempotent), so
        # a waiting call starts on the slot as soon as this one's end is durable.
        verdict, _ = await asyncio.gather(
            _persist(lambda: self.ledger.finish(final, failure)),
            slots.free(throttled=final.throttled),
        )
        if verdict == "stale":
            log.info("dropping a fenced-off attempt's outcome", extra={"attempt": command.attempt})
            return None
        return outcome

    async def _heartbeat(self, command: ExecutionCommand, details: str) -> None:
        """Keep a running call's newest heartbeat details (best-effort: the next one retries)."""
        try:
            await self.ledger.heartbeat(
                command, details, worker_id=self.worker_id, lease_s=self.limits.lease_s
            )
        except TRANSIENT_ERRORS as exc:
            DEPENDENCIES.failed(exc)

    def _completion_handle(self, command: ExecutionCommand) -> str:
        """The signed handle that completes the running attempt of ``command`` later."""
        handle = CompletionHandle(
            command.tenant_id, command.run_id, command.call_id, command.attempt,
            command.fencing_token, command.pool,
        )  # fmt: skip
        return handle.encode(self.auth.handle_key(command.tenant_id))

    async def _defer(self, command: ExecutionCommand, deferred: Deferred, slots: _Slots) -> None:
        """The body handed its work over: the call waits in the ledger for its completion,
        holding no slot; nothing is published until the completion comes."""
        until = time.time() + deferred.complete_within_s
        held = await _persist(
            lambda: self.ledger.defer(command, worker_id=self.worker_id, until=until)
        )
        await slots.free()
        if not held:
            log.info("a fenced-off attempt deferred; its call is another's now")
            return
        log.info("call deferred", extra={"complete_within_s": deferred.complete_within_s})

    async def _take_completions(self, consumer: AIOKafkaConsumer) -> None:
        """End deferred calls of this pool with the completions that arrive for them."""
        async for record in consumer:
            try:
                await self._complete(CompletionMessage.decode(record.value or b""))
            except InvalidMessageError as refused:
                log.warning("completion refused", extra={"reason": refused.reason})
            except ToolfleetError as refused:  # no key for its tenant, say: said, not fatal
                log.warning("completion refused", extra={"reason": str(refused)})
            except Exception:  # a bug must not stop this pool's completions for good
                log.exception("completion not handled")
            tp = TopicPartition(record.topic, record.partition)
            try:
                await consumer.commit({tp: record.offset + 1})
            except Exception as exc:  # a rebalance: the next owner takes it again (once)
                log.info("completion offset not committed", extra={"error": repr(exc)})

    async def _complete(self, message: CompletionMessage) -> None:
        """One completion: verified by its handle, stored once, then published."""
        named = CompletionHandle.read(message.handle)
        if named.pool != self.pool:
            return  # another pool's workers take it
        if named.tenant_id != message.tenant_id:
            reason = "a completion whose handle names another tenant"
            raise InvalidMessageError(reason, reason=reason)
        handle = CompletionHandle.verify(message.handle, self.auth.handle_key(named.tenant_id))
        tenant, run, call = handle.tenant_id, handle.run_id, handle.call_id
        entry = (await _persist(lambda: self.ledger.read(tenant, run, [call]))).get(call)
        if entry is None:
            return
        command = command_for(
            tenant, entry, attempt=handle.attempt, token=handle.fencing_token,
            tool_version=entry.tool_version,
        )  # fmt: skip
        outcome = completed(command, self.worker_id, message.effect, message.output)
        try:
            tool = self.registry.get(entry.tool_name, entry.tool_version)
        except ToolNotFoundError:
            pass  # not served here any more: the completion's word, unchecked
        else:
            if message.effect == "applied":  # as the body's return: output guardrails, hooks
                outcome = await accept_completion(
                    tool, command, message.output or "", worker_id=self.worker_id,
                    hooks=self.registry.hooks,
                )  # fmt: skip
            outcome = self._as_reported(tool, command, outcome)
        verdict = await _persist(lambda: self.ledger.complete(outcome, message.completed_by))
        if verdict == "done" and entry.state == "finished" and entry.outcome is not None:
            outcome = entry.outcome  # stored by a worker that crashed before publishing it
        elif verdict != "ok":
            log.info(
                "completion ignored",
                extra={"verdict": verdict, "tenant_id": tenant, "run_id": run, "call_id": call},
            )
            return
        await _persist(lambda: self.bus.publish_and_wait("outcomes", outcome.run_id, outcome))
        await _persist(lambda: self._mark_published(outcome))

    async def _not_started_in_time(
        self, tool: Tool, command: ExecutionCommand
    ) -> CallOutcome | None:
        """The outcome of an attempt that waited past its tool's schedule-to-start timeout,
        stored as finished without the call ever starting; None when it may start (in time,
        or another worker's verdict on the call decides: ``begin`` then says what)."""
        seconds = tool.schedule_to_start
        if seconds is None or not missed_schedule_to_start(command, seconds, time.time()):
            return None
        outcome = not_started_in_time(command, self.worker_id, seconds)
        if await _persist(lambda: self.ledger.never_started(outcome, seconds)) != "ok":
            return None
        log.info(
            "call not started: past its schedule-to-start timeout",
            extra={"schedule_to_start_s": seconds},
        )
        return outcome

    def _as_reported(
        self, tool: Tool, command: ExecutionCommand, outcome: CallOutcome
    ) -> CallOutcome:
        """What the turn is told now: a retry the fleet will make is not final; neither is a
        later attempt that did not run (an earlier one may have: the reconciler, which knows,
        decides); and an unknown effect is never worded as a failure to try again (the SDK's
        own texts stay for SDK tools under report_now)."""
        if fleet_retries(
            outcome.effect,
            outcome.retry,
            tool.effect,
            attempt=command.attempt,
            max_attempts=self.settings.recovery_max_attempts,
            retry_after_s=outcome.retry_after_s,
        ):
            return outcome.model_copy(update={"resolved": False})
        if outcome.effect == "not_executed":
            return reported(outcome)
        if outcome.effect != "unknown":
            return outcome
        if tool.on_unknown == "reconcile_then_report":
            return outcome.model_copy(
                update={"output": unknown_outcome_text(tool.spec(self.pool)), "resolved": False}
            )
        if outcome.status == "failed" and not tool.serves_sdk_tool:
            return outcome.model_copy(update={"output": UNKNOWN_OUTCOME.format(name=tool.name)})
        return outcome

    async def _probe(self, tool: Tool, command: ExecutionCommand) -> CallOutcome:
        """Look the call's effect up upstream; probes are read-only and run without a gate."""
        result = await run_probe(tool, command, worker_id=self.worker_id, recording=self._recording)
        effect = effect_of_probe(result.state)
        detail = CallError(type="ProbeResult", message=result.detail) if result.detail else None
        return CallOutcome(
            **identity(command, self.worker_id),
            kind="probe",
            status="succeeded",
            effect=effect,
            output=result.output,
            error=detail,
        )

    async def _compensate(self, tool: Tool, command: ExecutionCommand) -> CallOutcome | None:
        """Run the compensate action once: it is a side effect, gated by its own ledger entry."""
        verdict = await self._begin(command)
        if verdict != "run":
            return await self._refused(command, verdict)
        raised: list[ToolFailure] = []  # what the action raised, kept with its attempt
        try:
            text = await run_compensate(
                tool, command, worker_id=self.worker_id, recording=self._recording,
                on_failure=raised.append,
            )  # fmt: skip
            outcome = CallOutcome(
                **identity(command, self.worker_id),
                kind="compensate",
                status="succeeded",
                effect="compensated",
                output=text,
            )
        except Exception as exc:
            outcome = CallOutcome(
                **identity(command, self.worker_id),
                kind="compensate",
                status="failed",
                effect="unknown",
                error=CallError(type=type(exc).__name__, message=str(exc)),
            )
        failure = _call_failure(raised, command, self.worker_id)
        if await self.ledger.finish(outcome, failure) == "stale":
            return None
        return outcome

    async def _begin(self, command: ExecutionCommand, tool_version: str | None = None) -> str:
        """The ledger's verdict; while another live worker holds the call, wait for it.

        A ``started`` that no replica confirmed is ``unreplicated``: the call never runs here (a
        failover could lose the write and let another worker run it), and the reconciler
        resolves it as any call whose worker was lost.
        """
        while True:
            try:
                verdict, _stored = await self.ledger.begin(
                    command.tenant_id,
                    command.run_id,
                    command.call_id,
                    token=command.fencing_token,
                    worker_id=self.worker_id,
                    lease_s=self.limits.lease_s,
                    # An approved compensation runs even if its run was cancelled since.
                    unless_cancelled=command.kind == "execute",
                    tool_version=tool_version,
                )
            except UnreplicatedWriteError as exc:
                log.error(
                    "started not replicated; the call will not run", extra={"error": str(exc)}
                )
                return "unreplicated"
            if verdict != "busy":
                return verdict
            # A redelivery (rebalance) while the holder still runs: its outcome or its lease
            # expiry will settle the call; poll well within one lease period. A stopping
            # worker does not wait for another's call (it may run for hours): the command
            # stays uncommitted for the partition's next owner (``Interrupted``).
            await nap(self.limits.lease_s / 10, until=self._stopping)

    async def _refused(self, command: ExecutionCommand, verdict: str) -> CallOutcome | None:
        if verdict == "done":
            entries = await self.ledger.read(command.tenant_id, command.run_id, [command.call_id])
            entry = entries.get(command.call_id)
            return entry.outcome if entry else None
        if verdict == "cancelled":  # queued when its run was cancelled: never starts
            return reported(ended(command, self.worker_id, "skipped"))
        if verdict in ("unknown", "unreplicated"):
            spec = self.registry.get(command.tool_name, command.tool_version).spec(self.pool)
            cause = _UNREPLICATED if verdict == "unreplicated" else WORKER_LOST
            return lost(command, spec, worker_id=self.worker_id, source="executor", cause=cause)
        if verdict == "missing":
            raise InvalidMessageError(
                "command for a call the ledger does not know",
                reason="no ledger entry for this call: commands must come from the planner",
            )
        return None  # stale: a newer attempt of this call exists and will report

    def _hold(
        self,
        key: _CallKey,
        running: tuple[asyncio.Task[None], asyncio.Future[None]],
        command: ExecutionCommand,
    ) -> None:
        """The handler that began a call holds its entries: cancellations reach its task,
        and its lease is renewed."""
        self._running[key] = running
        self._leases[key] = command

    def _let_go(self, key: _CallKey, task: asyncio.Task[None], *, started: bool) -> None:
        """Drop a handler's entries for a call (a copy that never began holds no lease, and
        the running entry only if nobody took it over)."""
        if started:
            self._leases.pop(key, None)
        if self._running.get(key, (None,))[0] is task:
            del self._running[key]

    async def _cancelled_before_it_began(self, command: ExecutionCommand) -> CallOutcome | None:
        """A call its run's cancellation stopped before it began here (pacing, its begin): its
        body never ran here. If it began all the same (another copy of the command, another
        worker), its holder reports it, never "not executed"; else it is skipped."""
        if await self._began(command):
            return None
        return reported(ended(command, self.worker_id, "skipped"))

    async def _began(self, command: ExecutionCommand) -> bool:
        """Whether the call went past dispatch already (a command delivered again): then the
        ledger's begin answers for it (its stored outcome, or unknown), never a refusal that
        says it did not run."""
        entries = await self.ledger.read(command.tenant_id, command.run_id, [command.call_id])
        entry = entries.get(command.call_id)
        return entry is not None and entry.state not in ("planned", "dispatched")

    async def _publish(self, outcome: CallOutcome, slots: _Slots) -> None:
        outcome = reported(outcome)
        _describe_span(outcome)
        await slots.free(throttled=outcome.throttled)
        with phase(self._tracer, "publish"):
            await self.bus.publish_and_wait("outcomes", outcome.run_id, outcome)
            await self._mark_published(outcome)

    def _phase(self, name: str) -> AbstractContextManager[None]:
        """A phase of a call inside the tool runner, as a child span of the call's."""
        return phase(self._tracer, name)

    async def _mark_published(
        self, outcome: CallOutcome, counted_in: str | None = None
    ) -> list[CircuitCall]:
        """``committed`` in the ledger: the outcome is on Kafka. With ``counted_in`` (a tool
        version) the call is counted in its circuit window too: the window's calls, if that
        opened the circuit."""
        opened = []
        if outcome.status != "pending_approval":
            opened = await self._after_publish(outcome, counted_in)
        labelled(OUTCOMES, self.service, outcome.tool_name, outcome.status, outcome.effect).inc()
        return opened

    async def _renew_leases(self) -> None:
        """Every third of a lease, renew the lease of every call this worker is running.

        One loop for the whole worker (its renewals go out as one burst) instead of a timer
        per call; a renewal that fails is retried on the next round, well within the lease.
        It waits through functions bound at import (``nap``, ``_gather``), as
        ``_register_capacity`` does.
        """
        failing = RecurringFailure(log, "leases not renewed")
        while True:
            await nap(self.limits.lease_s / 3)
            held = list(self._leases.values())
            renewals = (
                self.ledger.renew(
                    c.tenant_id,
                    c.run_id,
                    c.call_id,
                    token=c.fencing_token,
                    worker_id=self.worker_id,
                    lease_s=self.limits.lease_s,
                )
                for c in held
            )
            errors = [
                failed
                for failed in await _gather(*renewals, return_exceptions=True)
                if isinstance(failed, Exception)
            ]
            # One line per round at most, not one per call held (and none for an outage,
            # which the dependency monitor says once).
            other = [e for e in errors if not isinstance(e, TRANSIENT_ERRORS)]
            if errors and len(other) < len(errors):
                DEPENDENCIES.failed(errors[0])
            if other:
                failing.failed(other[0])
            elif not errors:
                failing.succeeded()

    async def _listen_for_cancellations(self, consumer: AIOKafkaConsumer) -> None:
        async for record in consumer:
            try:
                request = CancelRequest.decode(record.value or b"")
                self.auth.verify(request)  # unsigned, forged or another tenant's: ignored
            except InvalidMessageError:
                continue  # the planner dead-letters it; every worker doing so would spam
            if request.call_id is not None:
                running = self._running.get((request.tenant_id, request.run_id, request.call_id))
                if running is not None and not running[1].done():
                    running[1].set_result(None)  # tool-local: a failure of the call, per its policy
                continue
            run = (request.tenant_id, request.run_id)
            self._cancelled_runs[run] = request.reason
            mine = [task for (t, r, _c), (task, _) in list(self._running.items()) if (t, r) == run]
            if mine:
                # Mark the ledger before the slots free: a sibling the freed slot admits may
                # start on a worker that has not read this cancellation, and the planner may
                # not have marked the run yet. ``begin`` then refuses it (skipped).
                await self._mark_cancelled(*run, request.reason)
            for task in mine:
                task.cancel()

    async def _mark_cancelled(self, tenant_id: str, run_id: str, reason: str) -> None:
        try:
            await self.ledger.cancel_run(tenant_id, run_id, reason)
        except TRANSIENT_ERRORS as exc:  # the planner marks it too; cancel regardless
            DEPENDENCIES.failed(exc)
            log.debug("could not mark the run cancelled", extra={"error": str(exc)})


class _Slots:
    """An admitted command's hold on its tenant's, tool's and pool's counts in admission,
    freed by the worker once it is done with the call: before its outcome is published, so a
    crash in between leaves the command to a peer, which frees them again (a no-op then).
    Commands that admission never counted (probes, compensations, an earlier planner's
    unadmitted ones) hold nothing."""

    def __init__(
        self, admitter: Admitter, command: ExecutionCommand, paced: tuple[str, ...] = ()
    ) -> None:
        self._admitter = admitter
        self._command = command
        self.held = command.kind == "execute" and command.admitted
        self.paced = paced if command.kind == "execute" else ()
        """The rate scopes the call's start must pass (its admission took their tokens)."""

    async def free(self, *, throttled: bool = False) -> None:
        """Free them (once; retried until durable)."""
        if not self.held:
            return
        command = self._command
        await _persist(lambda: self._admitter.free(command, throttled=throttled))
        self.held = False


class _Credits:
    """This worker's free slots for the commands its own admission passes admit (see
    ``Credits``): at most its consume loop's free slots, less the credits sent and not
    started yet, each to one of its partitions of the pool's topic in turn."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.worker_id = worker.worker_id
        self._marker = worker.worker_id.encode()
        self._outstanding = 0
        """Credits on Kafka not started yet (they take free slots when they arrive)."""
        self._turn = 0

    def room(self) -> int:
        """Free slots not promised yet: what this worker's pass may admit (none while it
        owns no partition or stops: a planner's pass admits those calls then)."""
        loop = self.worker._loop
        if loop is None or not self.worker._owned or self.worker._stopping.is_set():
            return 0
        return max(0, loop.free_slots - self._outstanding)

    def claim(self, pool: str) -> int | None:
        """One of this worker's partitions for a command of its pool its pass admitted
        (counted as promised until it arrives); None for another pool's (by key)."""
        owned = [int(tp.partition) for tp in self.worker._owned]
        if pool != self.worker.pool or not owned:
            return None
        self._outstanding += 1
        self._turn += 1
        return owned[self._turn % len(owned)]

    def arrived(self, record: Record) -> None:
        """A command started: if it is one of this worker's credits, its slot is taken now."""
        for name, value in record.headers or ():
            if name == CREDIT_HEADER and value == self._marker and self._outstanding:
                self._outstanding -= 1

    def forget(self) -> None:
        """The assignment changed: credits sent to a partition no longer ours never arrive."""
        self._outstanding = 0


class _Ownership(ConsumerRebalanceListener):  # type: ignore[misc]
    """Keeps what the worker owns current: revoked partitions' offsets are forgotten, and
    capacity is registered again whenever the assignment changes."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """Their unfinished commands will be redelivered to the new owner."""
        if self.worker._loop is not None:
            self.worker._loop.forget(set(revoked))
        self.worker._owned -= revoked
        self.worker._credits.forget()
        self.worker._assignment_changed.set()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """Positions come from the committed offsets; log the assignment for operators."""
        partitions = sorted(tp.partition for tp in assigned)
        log.info("partitions assigned", extra={"partitions": partitions})
        HEALTH.set("assigned", True)  # the group has taken the worker in (/readyz)
        self.worker._owned |= assigned
        self.worker._assignment_changed.set()


_UNREPLICATED = CallError(
    type="UnreplicatedWriteError",
    message="no Redis replica confirmed the call's start in time; it was not run",
)


async def _persist(step: Callable[[], Awaitable[T]]) -> T:
    """Retry one step after the tool ran, on Kafka or Redis errors, until it succeeds.

    Re-running the command would find this worker's own lease and end as an unknown effect;
    the call did finish, so only the failed step is repeated, with the same outcome.
    """
    # What is published from here depends on the call's end, which the ledger stores durably
    # (it waits for the replicas), not on the command's earlier writes: no epoch to check.
    WORK_EPOCH.set(None)
    attempt = 0
    while True:
        try:
            return await step()
        except NEVER_FITS:
            raise  # retrying never helps: the command is dead-lettered with the reason
        except TRANSIENT_ERRORS as exc:
            DEPENDENCIES.failed(exc)  # said once by the dependency monitor
            log.debug("dependency unavailable after the call ran", extra={"error": repr(exc)})
            attempt += 1
            await nap(STEP.delay(attempt), wake=DEPENDENCIES.back)


def _call_failure(
    raised: list[ToolFailure], command: ExecutionCommand, worker_id: str
) -> CallFailure | None:
    """What the call's ledger entry keeps of the first thing user code raised (the root
    cause: a failure formatter that raised too comes after the body's exception)."""
    if not raised:
        return None
    first = raised[0]
    return CallFailure(
        type=first.type,
        message=first.message,
        traceback=first.traceback,
        attempt=command.attempt,
        worker_id=worker_id,
        at=time.time(),
    )


def _circuit_tasks(
    ref: str, tool: Tool, outcome: CallOutcome, ran: list[CircuitCall], window_s: float
) -> list[HumanTask]:
    """The human tasks of a circuit that opened: one per tenant whose calls ran while the
    version was failing, listing them by run and call (a call id alone names a call only
    within its run). A call an earlier release counted, with no tenant, is the opener's."""
    calls: dict[str, dict[str, None]] = {}
    for tenant, run, call in ran:
        named = task_call_ref(run, call) if run else call
        calls.setdefault(tenant or outcome.tenant_id, {})[named] = None
    reason = (
        f"circuit of {ref} opened: too many failures in the last {window_s:g} s; reconcile "
        f"the listed calls (run/call), then `toolfleet tools resume {ref}`"
    )
    return [
        HumanTask(
            tenant_id=tenant,
            task_id=new_task_id(),
            kind="circuit_open",
            tool_name=tool.lookup_key,
            tool_version=tool.version,
            reason=reason,
            calls=list(named),
            created_at=time.time(),
        )
        for tenant, named in calls.items()
    ]


def _describe_span(outcome: CallOutcome) -> None:
    """What the call's span says of its outcome (the current span is the call's)."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attributes(
        {
            "toolfleet.status": outcome.status,
            "toolfleet.effect": outcome.effect,
            "toolfleet.started": outcome.started_at is not None,
        }
    )


def _circuit_open(
    command: ExecutionCommand, worker_id: str, tool: Tool, reason: str
) -> CallOutcome:
    return CallOutcome(
        **identity(command, worker_id),
        status="failed",
        effect="not_executed",
        output=CIRCUIT_OPEN.format(name=tool.name, reason=reason),
        error=CallError(type="CircuitOpen", message=f"{tool.lookup_key}@{tool.version}: {reason}"),
    )


def _not_served(command: ExecutionCommand, worker_id: str, text: str) -> CallOutcome:
    return CallOutcome(
        **identity(command, worker_id),
        status="failed",
        effect="not_executed",
        output=text,
        error=CallError(type="ToolNotFoundError", message=f"pool {command.pool}: {text}"),
    )
