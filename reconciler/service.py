"""The reconciler process: resolves calls whose effect is unknown, and carries out compensations.

Inputs: ``outcomes`` (unknown effects; probe and compensate answers), ``task-resolutions``
(operators), the ledger's lease index (workers that died without any outcome) and its own
schedule of delayed probes. Decisions come from ``reconciler._policy``; this module reads
what they need, and publishes commands, resolved outcomes and human tasks. Its own state
per call (``tf:{tenant}:recon:{call_id}``) makes every input idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Iterator
from typing import Any, Literal, get_args

from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind

from kernel.adapters.background import BackgroundTasks
from kernel.adapters.backoff import TICK, Interrupted, nap
from kernel.adapters.bus import TRANSIENT_ERRORS, Bus, ConsumeLoop, Record
from kernel.adapters.dependencies import DEPENDENCIES
from kernel.adapters.logs import RecurringFailure, ids_of, log_context
from kernel.adapters.metrics import (
    COMMANDS,
    HUMAN_TASKS,
    HUMAN_TASKS_OPEN,
    OUTCOMES,
    UNKNOWN_EFFECTS,
    UNKNOWN_EFFECTS_AGE,
)
from kernel.adapters.topics import command_topic
from kernel.adapters.tracing import (
    consuming,
    context_from_headers,
    context_from_traceparent,
    context_of_trace,
    traceparent,
    tracer,
    within,
)
from kernel.errors import InvalidMessageError, ToolfleetError
from kernel.rules.auth import DecisionAuth
from kernel.rules.effects import probe_answer
from kernel.rules.outcomes import DEFERRAL_EXPIRED, WORKER_LOST, lost
from kernel.rules.state_versions import for_readers
from kernel.rules.texts import COMPENSATED, DEFAULT_ERROR, unknown_outcome_text
from kernel.settings import Settings
from kernel.stores.admitting import Admitter
from kernel.stores.door import Stores
from kernel.stores.ledger import LedgerEntry, NewCall, command_for
from kernel.stores.tasks import new_task_id
from reconciler._policy import (
    Action,
    AskCompensationApproval,
    CallCase,
    Compensate,
    HandOver,
    Probe,
    RecoveryPolicy,
    ResolveApplied,
    ResolveNotApplied,
    Retry,
    decide_probe,
    decide_refused,
    decide_resolution,
    decide_transient,
    decide_unknown,
    decide_wrong_effect,
)
from schemas import (
    CallOutcome,
    ExecutionCommand,
    HumanTask,
    TaskResolution,
    ToolSpec,
)

log = logging.getLogger(__name__)

COMPENSATION_SUFFIX = "#compensate"
"""A compensation is a call of its own in the ledger: ``<call_id>#compensate``."""

DUE_LEASE_S = 60.0
"""How long a scheduled action taken out to be carried out is its reconciler's: unless done by
then, another reconciler carries it out (each action may run again: a probe is answered once,
a retry issues one attempt, a report is idempotent for the turn)."""

REPORT_EVERY_S = 15.0
"""How often the backlog gauges (open human tasks, unresolved unknown effects) are reported:
each report reads every task and up to 1,024 ledger entries."""

TASK_KINDS: tuple[str, ...] = get_args(HumanTask.model_fields["kind"].annotation)
"""Every kind of human task: each gets a series, 0 when none is open."""

_MINE = (
    b'"effect":"unknown"', b'"effect":"wrong_effect"', b'"retry":"transient"',
    b'"resolved":false', b'"kind":"probe"', b'"kind":"compensate"',
)  # fmt: skip
"""How the outcomes the reconciler acts on read on the wire (compact JSON, Message.encode)."""


class Reconciler:
    """Consumes outcomes and task resolutions; runs the schedule and the lease scan."""

    def __init__(
        self,
        settings: Settings,
        *,
        bus: Bus,
        stores: Stores,
        policy: RecoveryPolicy | None = None,
        tick_s: float = 0.2,
    ) -> None:
        self.settings = settings
        self.policy = policy or RecoveryPolicy.of(settings)
        self.bus = bus
        bus.gate = stores.output_gate()
        self.keys = stores.keys
        self.ledger = stores.ledger()
        self.admitter = Admitter(stores.admission(), self.bus)
        self.tools = stores.tool_directory()
        self.tasks = stores.tasks()
        self.unknowns = stores.unknowns(self.ledger)
        self.auth = DecisionAuth.of(settings)
        self.tick_s = tick_s
        self._tracer = tracer("reconciler")
        self.recon = stores.reconciling()
        self.schema = stores.schema()
        self._loop: ConsumeLoop | None = None
        self._stopping = asyncio.Event()
        self.background = BackgroundTasks("reconciler", self.stop, stopping=self._stopping)
        """Its tick: if it ends, the reconciler stops and ``run`` raises its error."""

    def stop(self) -> None:
        """Finish the current message and return from ``run``."""
        self._stopping.set()
        if self._loop is not None:
            self._loop.stop()

    async def run(self) -> None:
        """Serve until stopped."""
        await self.bus.start()
        # The reconciler reads every outcome for the few whose effect is unknown, and nothing
        # it does is urgent to the millisecond: letting the broker gather records for up to
        # 100 ms makes its fetches few and large instead of one per new record under load.
        consumer = self.bus.consumer(
            ["outcomes", "task-resolutions"],
            group="reconciler",
            fetch_min_bytes=1 << 20,
            fetch_max_wait_ms=100,
        )
        await consumer.start()
        self._loop = ConsumeLoop(
            self.bus,
            consumer,
            self.handle,
            wanted=self.wants,
            cut_off_after_s=self.settings.cut_off_after_s,
        )
        self.background.start("tick", self._tick_forever())
        try:
            await self._loop.run()
        finally:
            await self.background.close()
            await consumer.stop()
            await self.bus.stop()
        self.background.raise_failure()

    def wants(self, record: Record) -> bool:
        """Task resolutions, and the outcomes that are the reconciler's business.

        Most outcomes are settled: they are skipped before decoding (the aggregator, which
        reads every outcome, dead-letters invalid ones).
        """
        raw = record.value or b""
        return record.topic.endswith("task-resolutions") or any(m in raw for m in _MINE)

    async def handle(self, record: Record) -> None:
        """Route one record; invalid bytes raise InvalidMessageError (dead-lettered)."""
        raw = record.value or b""
        if record.topic.endswith("task-resolutions"):
            resolution = TaskResolution.decode(raw)
            self.auth.verify(resolution)
            await self.on_resolution(resolution, record)
        else:
            outcome = CallOutcome.decode(raw)
            group = self.settings.group("reconciler")
            with (
                log_context(**ids_of(outcome)),
                # In the call's trace: the probes, retries and compensations it sends are its
                # children, and the workers' runs of them theirs.
                consuming(
                    self._tracer, f"toolfleet reconcile {outcome.tool_name}", record, group
                ) as span,
            ):
                if span.is_recording():
                    span.set_attributes(
                        {
                            **_ids(outcome.tenant_id, outcome.run_id, outcome.call_id),
                            "toolfleet.attempt": outcome.attempt,
                            "toolfleet.kind": outcome.kind,
                            "toolfleet.status": outcome.status,
                            "toolfleet.effect": outcome.effect,
                        }
                    )
                await self.on_outcome(
                    outcome, claimant=f"{record.topic}:{record.partition}:{record.offset}"
                )

    # --- inputs -----------------------------------------------------------------------------
    async def on_outcome(self, outcome: CallOutcome, claimant: str = "") -> None:
        """Start reconciling an unknown or wrong effect or a not-executed attempt left to
        it, or take a probe's or compensation's answer. ``claimant`` names the record (the
        same record handled again may go on with the reconciliation it started)."""
        if outcome.kind == "probe":
            await self._on_probe(outcome, claimant)
        elif outcome.kind == "compensate":
            await self._on_compensated(outcome)
        elif outcome.source == "human" or (outcome.resolved and outcome.effect != "unknown"):
            return
        elif outcome.effect in ("unknown", "wrong_effect") or not outcome.resolved:
            where = (outcome.tenant_id, outcome.run_id, outcome.call_id)
            if not await self.recon.claim(*where, outcome.fencing_token, claimant):
                return
            case, entry, _spec = await self._case(
                outcome.tenant_id, outcome.run_id, outcome.call_id
            )
            if entry is not None and entry.fencing_token > outcome.fencing_token:
                # A later attempt exists: this outcome was acted on already (the record handled
                # again, after a lost reply or a read from the committed offsets). Deciding
                # again, with the later attempt counted, would decide something else; but the
                # retry it decided may never have been sent (its reply lost, a failover): sent
                # again while it waits for a worker (the same attempt: it runs once).
                if entry.state == "dispatched":
                    await self._retry(*where, "sent again", outcome.fencing_token)
                return
            if outcome.effect == "unknown":
                await self.unknowns.add(
                    outcome.tenant_id, outcome.run_id, outcome.call_id, time.time()
                )
                # Whatever later attempts prove about themselves, this one may have applied.
                await self.recon.set_maybe_applied(*where, True)
                case = dataclasses.replace(case, maybe_applied=True)
                await self._act(outcome, decide_unknown(case, self.policy))
            elif outcome.effect == "wrong_effect":
                await self._act(outcome, decide_wrong_effect(case, "an output guardrail"))
            elif outcome.retry == "transient":
                action = decide_transient(
                    case, self.policy, output=outcome.output,
                    retry_after_s=outcome.retry_after_s, jitter=random.random(),
                )  # fmt: skip
                await self._act(outcome, action)
            else:  # refused for good, after an attempt whose effect is unknown
                await self._act(outcome, decide_refused(case, output=outcome.output))

    async def on_resolution(self, resolution: TaskResolution, record: Record | None = None) -> None:
        """An operator's answer: resolve the call, or run / refuse its compensation (in the
        call's trace, linked to the operator's when ``record`` carries one)."""
        stored = await self.tasks.get(resolution.task_id)
        if stored is None or stored.task.call_id is None:
            log.warning("resolution of an unknown task", extra={"task": resolution.task_id})
            return
        if stored.task.tenant_id != resolution.tenant_id:
            # Never act on another tenant's task; the operator sees why in the dead letter.
            reason = f"task {resolution.task_id} belongs to another tenant; resolution ignored"
            raise InvalidMessageError(reason, reason=reason)
        if not await self.tasks.close(resolution.task_id, resolution):
            return  # already resolved: a redelivery
        task = stored.task
        call_id, run_id = task.call_id, task.run_id or ""
        assert call_id is not None
        entry = (await self.ledger.read(resolution.tenant_id, run_id, [call_id])).get(call_id)
        operator = trace.get_current_span(context_from_headers(record.headers if record else None))
        links = [Link(operator.get_span_context())] if operator.get_span_context().is_valid else []
        with (
            log_context(tenant_id=resolution.tenant_id, run_id=run_id, call_id=call_id),
            self._in_call_trace(
                f"toolfleet resolution {task.tool_name}",
                resolution.tenant_id,
                run_id,
                call_id,
                entry.trace_id if entry else None,
                links=links,
                attributes={
                    "toolfleet.task_id": task.task_id,
                    "toolfleet.resolution": resolution.resolution,
                },
            ),
        ):
            await self._resolved_by_human(resolution, task, run_id, call_id)

    async def _resolved_by_human(
        self, resolution: TaskResolution, task: HumanTask, run_id: str, call_id: str
    ) -> None:
        await self.ledger.append_audit(
            resolution.tenant_id,
            run_id,
            call_id,
            "human_resolution",
            task_id=task.task_id,
            resolution=resolution.resolution,
            by=resolution.decided_by,
            note=resolution.note,
        )
        case, entry, _spec = await self._case(resolution.tenant_id, run_id, call_id)
        action = decide_resolution(case, resolution.resolution, resolution.output)
        await self._act(self._latest(entry), action, source="human")

    async def _on_probe(self, answer: CallOutcome, taker: str = "") -> None:
        taken = await self.recon.take_probe(answer.tenant_id, answer.run_id, answer.call_id, taker)
        if taken is None:
            return  # a duplicate answer, or one for a reconciliation that moved on
        state = probe_answer(answer.effect)
        detail = answer.error.message if answer.error else None
        if state == "not_applied":  # asked by the call's key: no attempt so far applied
            await self.recon.set_maybe_applied(
                answer.tenant_id, answer.run_id, answer.call_id, False
            )
        await self.ledger.append_audit(
            answer.tenant_id, answer.run_id, answer.call_id, "probe", answer=state, detail=detail
        )
        case, entry, _spec = await self._case(answer.tenant_id, answer.run_id, answer.call_id)
        action = decide_probe(case, state, answer.output, detail, self.policy)
        await self._act(self._latest(entry), action)

    async def _on_compensated(self, answer: CallOutcome) -> None:
        original_id = answer.call_id.removesuffix(COMPENSATION_SUFFIX)
        tenant = answer.tenant_id
        entry = (await self.ledger.read(tenant, answer.run_id, [original_id])).get(original_id)
        if entry is None or entry.outcome is None or entry.outcome.effect == "compensated":
            return
        if answer.status != "succeeded":
            reason = f"compensation failed: {answer.error.message if answer.error else '?'}"
            await self._hand_over(entry.outcome, reason, kind="unknown_effect")
            return
        compensated = entry.outcome.model_copy(
            update={"effect": "compensated", "source": "reconciler", "finished_at": time.time()}
        )
        await self.ledger.resolve(
            compensated, "compensated", compensation=answer.call_id, output=answer.output
        )
        await self.ledger.release_hold(tenant, entry.run_id, original_id)
        # A turn still waiting for this call learns what happened; a reported one ignores it.
        told = compensated.model_copy(
            update={"resolved": True, "output": COMPENSATED.format(name=entry.tool_name)}
        )
        await self.bus.publish_and_wait("outcomes", told.run_id, told)
        OUTCOMES.labels("reconciler", entry.tool_name, "succeeded", "compensated").inc()

    # --- actions ----------------------------------------------------------------------------
    async def _act(self, about: CallOutcome, action: Action, source: str = "reconciler") -> None:
        tenant, run, call_id = about.tenant_id, about.run_id, about.call_id
        name = type(action).__name__
        log.info(
            "reconciling",
            extra={"tenant_id": tenant, "run_id": run, "call_id": call_id, "action": name,
                   **vars(action)},
        )  # fmt: skip
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute("toolfleet.action", name)
        if isinstance(action, Probe):
            if action.delay_s > 0:
                due: dict[str, Any] = {"tenant": tenant, "run": run, "call_id": call_id,
                                       "do": "probe"}  # fmt: skip
                await self.recon.schedule(_traced(due), time.time() + action.delay_s)
            else:
                await self._send_probe(tenant, run, call_id)
        elif isinstance(action, ResolveApplied):
            await self._resolve(
                about, status="succeeded", effect="applied", output=action.output,
                source=source, why="applied",
            )  # fmt: skip
        elif isinstance(action, ResolveNotApplied):
            await self._resolve(
                about, status="failed", effect="not_executed",
                output=action.output or DEFAULT_ERROR, source=source, why=action.reason,
            )  # fmt: skip
        elif isinstance(action, Retry) and action.delay_s > 0:
            due = {"tenant": tenant, "run": run, "call_id": call_id, "do": "retry",
                   "why": action.reason, "after": about.fencing_token}  # fmt: skip
            await self.recon.schedule(_traced(due), time.time() + action.delay_s)
        elif isinstance(action, Retry):
            await self._retry(tenant, run, call_id, action.reason, about.fencing_token)
        elif isinstance(action, HandOver):
            await self._hand_over(about, action.reason, kind="unknown_effect")
        elif isinstance(action, AskCompensationApproval):
            await self._record_wrong_effect(about)
            await self._hand_over(about, action.reason, kind="compensation_approval")
        elif isinstance(action, Compensate):
            await self._send_compensation(tenant, run, call_id)

    async def _record_wrong_effect(self, about: CallOutcome) -> None:
        """The ledger keeps what was wrong; the compensation will be linked to it. Until it
        is compensated, the run's later side-effecting calls wait for a human (planner)."""
        wrong = about.model_copy(update={"effect": "wrong_effect", "source": "reconciler"})
        await self.ledger.resolve(wrong, "wrong_effect", output=about.output)
        await self.unknowns.discard(about.tenant_id, about.run_id, about.call_id)
        await self.ledger.hold(about.tenant_id, about.run_id, about.call_id)

    async def _send_probe(self, tenant: str, run: str, call_id: str) -> None:
        entry = (await self.ledger.read(tenant, run, [call_id])).get(call_id)
        if entry is None:
            return
        command = _command(entry, "probe", entry.fencing_token)
        with self._sending(f"toolfleet probe {entry.tool_name}", command):
            await self.recon.await_probe(tenant, run, call_id)
            await self._send(command)

    async def _retry(
        self, tenant: str, run: str, call_id: str, reason: str, after: int | None
    ) -> None:
        """A new attempt after the one with fencing token ``after`` (None: a retry an older
        reconciler scheduled, after whatever attempt is the latest); carried out again (its
        reconciler died, or an outcome was read again), it sends the same attempt, or none."""
        if after is None:
            entry = (await self.ledger.read(tenant, run, [call_id])).get(call_id)
            if entry is None:
                return
            after = entry.fencing_token
        issued = await self.ledger.dispatch(tenant, run, call_id, reason, retry_after=after)
        entry = (await self.ledger.read(tenant, run, [call_id])).get(call_id)
        if issued is None or entry is None:
            return
        # A retry is a new attempt at the upstream: admitted like a first one (quotas, rate
        # limits, a 429's slow-down), so it reaches Kafka when it can run.
        command = _command(entry, "execute", issued[1], attempt=issued[0])
        # The span is current when admission keeps the command: the attempt's run on a worker
        # is its child, whenever it is admitted.
        with self._sending(f"toolfleet retry {entry.tool_name}", command, reason=reason):
            # It carries the earlier attempt's heartbeat details once workers all read them.
            await self.admitter.submit([for_readers(command, await self.schema.in_force())])
            await self.admitter.confirm()

    async def _send_compensation(self, tenant: str, run: str, call_id: str) -> None:
        entry = (await self.ledger.read(tenant, run, [call_id])).get(call_id)
        if entry is None or entry.outcome is None:
            return
        command = _command(entry, "compensate", entry.fencing_token)
        with self._sending(f"toolfleet compensate {entry.tool_name}", command):
            await self._dispatch_compensation(entry, tenant, run, call_id)

    async def _dispatch_compensation(
        self, entry: LedgerEntry, tenant: str, run: str, call_id: str
    ) -> None:
        assert entry.outcome is not None
        comp_id = f"{call_id}{COMPENSATION_SUFFIX}"
        await self.ledger.create(
            tenant,
            run,
            [
                NewCall(
                    comp_id,
                    entry.fingerprint,
                    entry.idempotency_key,
                    entry.run_id,
                    entry.turn_id,
                    entry.tool_name,
                    entry.pool,
                    arguments=entry.arguments,
                    index=entry.index,
                    policy=entry.policy,
                )
            ],
        )
        issued = await self.ledger.dispatch(tenant, run, comp_id, reason=f"compensates {call_id}")
        if issued is None:
            return
        await self.ledger.append_audit(
            tenant, run, call_id, "compensation_dispatched", link=comp_id
        )
        command = _command(entry, "compensate", issued[1], attempt=issued[0])
        await self._send(
            command.model_copy(
                update={"call_id": comp_id, "original_output": entry.outcome.output or ""}
            )
        )

    async def _resolve(
        self, about: CallOutcome, *, status: str, effect: str, output: str, source: str, why: str
    ) -> None:
        resolved = about.model_copy(
            update={
                "kind": "execute", "status": status, "effect": effect, "output": output,
                "resolved": True, "source": source, "error": None, "finished_at": time.time(),
                "retry": None, "retry_after_s": None,
            }
        )  # fmt: skip
        await self.ledger.resolve(resolved, f"resolved_{effect}", reason=why, by=source)
        await self.unknowns.discard(about.tenant_id, about.run_id, about.call_id)
        await self.recon.set_status(about.tenant_id, about.run_id, about.call_id, "resolved")
        await self.bus.publish_and_wait("outcomes", resolved.run_id, resolved)
        OUTCOMES.labels("reconciler", resolved.tool_name, status, effect).inc()

    async def _hand_over(self, about: CallOutcome, reason: str, *, kind: str) -> None:
        task = HumanTask(
            tenant_id=about.tenant_id,
            task_id=new_task_id(),
            kind=kind,
            tool_name=about.tool_name,
            run_id=about.run_id,
            turn_id=about.turn_id,
            call_id=about.call_id,
            idempotency_key=await self._idempotency_key(about),
            reason=reason,
            created_at=time.time(),
        )
        await self.tasks.add(task)
        await self.bus.publish_and_wait("human-tasks", about.run_id, task)
        HUMAN_TASKS.labels(kind).inc()
        tenant, run, call_id = about.tenant_id, about.run_id, about.call_id
        await self.ledger.append_audit(
            tenant, run, call_id, "handed_over", task_id=task.task_id, reason=reason
        )
        await self.recon.set_status(tenant, run, call_id, "handed_over")
        if kind != "circuit_open" and not about.resolved:
            # The turn waits for this call: tell the model after a while, and keep the task.
            due = {"tenant": tenant, "run": run, "call_id": call_id, "do": "report"}
            await self.recon.schedule(_traced(due), time.time() + self.policy.report_after_s)

    async def _report_unknown(self, tenant: str, run: str, call_id: str) -> None:
        status = await self.recon.status(tenant, run, call_id)
        _case, entry, spec = await self._case(tenant, run, call_id)
        if status != "handed_over" or entry is None or spec is None:
            return  # resolved in the meantime
        latest = self._latest(entry)
        # Unknown, whatever the latest attempt proved about itself: a retry that never ran
        # says nothing of an earlier attempt that may have applied (why a person was asked).
        reported = latest.model_copy(
            update={
                "resolved": True,
                "effect": "unknown",
                "output": unknown_outcome_text(spec),
                "source": "reconciler",
            }
        )
        await self.ledger.append_audit(tenant, run, call_id, "reported_unknown_to_model")
        await self.bus.publish_and_wait("outcomes", reported.run_id, reported)

    async def _send(self, command: ExecutionCommand) -> None:
        await self.bus.publish_and_wait(command_topic(command.pool), command.call_id, command)
        COMMANDS.labels("reconciler", command.pool, command.kind).inc()

    # --- background -------------------------------------------------------------------------
    async def _tick_forever(self) -> None:
        """Ticks every ``tick_s``; a failed tick is tried again with backoff (``TICK``).
        Kafka or Redis away is said by the dependency monitor; any other failure once, then
        once a minute with a count."""
        reported_at = -REPORT_EVERY_S
        failing = RecurringFailure(log, "reconciler tick failed; retrying with backoff")
        failures = 0
        while not self._stopping.is_set():
            try:
                await self.tick()
                if time.monotonic() - reported_at >= REPORT_EVERY_S:
                    reported_at = time.monotonic()
                    await self.report()
            except TRANSIENT_ERRORS as exc:
                failures += 1
                DEPENDENCIES.failed(exc)
                log.debug("reconciler tick failed", extra={"error": repr(exc)})
            except Exception as exc:
                failures += 1
                failing.failed(exc)
            else:
                failures = 0
                failing.succeeded()
            delay = TICK.delay(failures) if failures else self.tick_s
            with contextlib.suppress(Interrupted):
                await nap(delay, until=self._stopping, wake=DEPENDENCIES.back if failures else None)

    async def report(self) -> None:
        """Set the backlog gauges: open human tasks by kind, and the unresolved unknown
        effects (after dropping those a retry's outcome settled) with the oldest one's age."""
        open_tasks = await self.tasks.open_by_kind()
        for kind in {*TASK_KINDS, *open_tasks}:
            HUMAN_TASKS_OPEN.labels(kind).set(open_tasks.get(kind, 0))
        await self.unknowns.sweep()
        count, oldest_s = await self.unknowns.backlog(time.time())
        UNKNOWN_EFFECTS.set(count)
        UNKNOWN_EFFECTS_AGE.set(oldest_s)

    async def tick(self) -> None:
        """Run due actions, and report calls whose worker died without any outcome."""
        now = time.time()
        for due in await self.recon.pop_due(now, DUE_LEASE_S):
            action = due.action
            where = (action["tenant"], action["run"], action["call_id"])
            # In the trace of the decision that scheduled it, naming its call.
            with (
                within(context_from_traceparent(action.get("traceparent"))),
                log_context(tenant_id=where[0], run_id=where[1], call_id=where[2]),
            ):
                if action["do"] == "probe":
                    await self._send_probe(*where)
                elif action["do"] == "retry":
                    await self._retry(*where, action["why"], action.get("after"))
                else:
                    await self._report_unknown(*where)
            await self.recon.done(due)
        for tenant, run, call_id in await self.ledger.expired_leases(now):
            with log_context(tenant_id=tenant, run_id=run, call_id=call_id):
                await self._lease_expired(tenant, run, call_id)

    async def _lease_expired(self, tenant: str, run: str, call_id: str) -> None:
        """A started call whose holder stopped renewing its lease: its lost-worker outcome is
        published (in the call's trace: the reconciliation it starts follows it there)."""
        entry = (await self.ledger.read(tenant, run, [call_id])).get(call_id)
        cause = WORKER_LOST
        if entry is not None and entry.state == "deferred":
            # Its completion is overdue: from now on a started call whose holder is gone.
            if not await self.ledger.expire_deferral(tenant, run, call_id):
                return  # completed meanwhile, or its deadline was moved: not due
            entry, cause = dataclasses.replace(entry, state="started"), DEFERRAL_EXPIRED
        if entry is not None and entry.state == "started":
            with self._in_call_trace(
                f"toolfleet lease expired {entry.tool_name}", tenant, run, call_id,
                entry.trace_id, attributes={"toolfleet.attempt": entry.attempts,
                                            "toolfleet.cause": cause.type},
            ):  # fmt: skip
                spec = (await self.tools.specs(needed=[entry.tool_name])).get(entry.tool_name)
                lost_call = lost(_command(entry, "execute", entry.fencing_token), spec,
                                 worker_id=entry.worker_id, source="reconciler",
                                 cause=cause)  # fmt: skip
                await self.bus.publish_and_wait("outcomes", entry.run_id, lost_call)
        await self.ledger.drop_lease(tenant, run, call_id)

    # --- spans ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _sending(self, name: str, command: ExecutionCommand, **extra: str) -> Iterator[None]:
        """A producer span around sending ``command`` (a probe, a retry, a compensation): a
        child of the reconciliation that decided it, the parent of the worker's run of it."""
        attributes: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "send",
            "messaging.destination.name": self.settings.topic(command_topic(command.pool)),
            **_ids(command.tenant_id, command.run_id, command.call_id),
            "toolfleet.kind": command.kind,
            "toolfleet.attempt": command.attempt,
            **{f"toolfleet.{key}": value for key, value in extra.items()},
        }
        with self._tracer.start_as_current_span(
            name, kind=SpanKind.PRODUCER, attributes=attributes
        ):
            yield

    @contextlib.contextmanager
    def _in_call_trace(
        self,
        name: str,
        tenant: str,
        run: str,
        call_id: str,
        trace_id: str | None,
        *,
        links: list[Link] | None = None,
        attributes: dict[str, Any] | None = None,
    ) -> Iterator[None]:
        """A span in the call's trace (``trace_id``, the ledger's) for work that no record of
        the call carries the context of; what it publishes carries it on."""
        with (
            within(context_of_trace(trace_id)),
            self._tracer.start_as_current_span(
                name, links=links, attributes={**_ids(tenant, run, call_id), **(attributes or {})}
            ),
        ):
            yield

    # --- reading ----------------------------------------------------------------------------
    async def _case(
        self, tenant: str, run: str, call_id: str
    ) -> tuple[CallCase, LedgerEntry | None, ToolSpec | None]:
        entry = (await self.ledger.read(tenant, run, [call_id])).get(call_id)
        name = entry.tool_name if entry else ""
        spec = (await self.tools.specs(needed=[name])).get(name)
        probes = await self.recon.probes(tenant, run, call_id)
        maybe_applied = await self.recon.maybe_applied(tenant, run, call_id)
        case = CallCase(
            effect_class=spec.effect_class if spec else "non_idempotent",
            has_probe=bool(spec and spec.has_probe),
            has_compensate=bool(spec and spec.has_compensate),
            attempts=entry.attempts if entry else 0,
            probes=probes,
            maybe_applied=maybe_applied,
        )
        return case, entry, spec

    def _latest(self, entry: LedgerEntry | None) -> CallOutcome:
        """The call's stored outcome (or, if its worker died first, a lost-worker one)."""
        if entry is None:
            raise ToolfleetError("reconciling a call that is not in the ledger")
        if entry.outcome is not None:
            return entry.outcome
        return lost(_command(entry, "execute", entry.fencing_token), None,
                    worker_id=entry.worker_id, source="reconciler")  # fmt: skip

    async def _idempotency_key(self, about: CallOutcome) -> str:
        entries = await self.ledger.read(about.tenant_id, about.run_id, [about.call_id])
        entry = entries.get(about.call_id)
        return entry.idempotency_key if entry else ""


def _ids(tenant: str, run: str, call_id: str) -> dict[str, Any]:
    """A span's names for a call: its full identity."""
    return {"toolfleet.tenant_id": tenant, "toolfleet.run_id": run, "toolfleet.call_id": call_id}


def _traced(due: dict[str, Any]) -> dict[str, Any]:
    """A scheduled action, with the trace it was decided in (its span's parent when due)."""
    parent = traceparent()
    return {**due, "traceparent": parent} if parent else due


def _command(
    entry: LedgerEntry,
    kind: Literal["execute", "probe", "compensate"],
    token: int,
    attempt: int | None = None,
) -> ExecutionCommand:
    """A command for an existing call, rebuilt from its ledger entry: retries, probes and
    compensations go to the version that ran, with the turn's policy."""
    return command_for(
        entry.tenant_id,
        entry,
        attempt=attempt or max(entry.attempts, 1),
        token=max(token, 1),
        kind=kind,
        tool_version=entry.tool_version,
        upstream_ref=entry.upstream_ref,
    )
