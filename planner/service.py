"""The planner process: model responses in, one plan and one command per call out.

The decisions are ``plan_turn`` and ``next_to_release`` (pure); this module only reads what
they need from Redis, writes the ledger before anything is sent, and publishes. Everything
is keyed by run_id, so one planner instance owns all of a run's responses, approvals,
cancellations and outcomes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence

from kernel.adapters.background import BackgroundTasks
from kernel.adapters.backoff import TICK, nap
from kernel.adapters.bus import TRANSIENT_ERRORS, Bus, ConsumeLoop, Record
from kernel.adapters.dependencies import DEPENDENCIES
from kernel.adapters.logs import RecurringFailure, ids_of, log_context
from kernel.adapters.metrics import PLAN_LATENCY
from kernel.adapters.tracing import consuming, phase, trace_id, traceparent, tracer
from kernel.errors import InvalidMessageError
from kernel.rules.auth import DecisionAuth
from kernel.rules.limits import json_depth_exceeds
from kernel.rules.state_versions import for_readers
from kernel.rules.versions import choose_version, circuits_to_check
from kernel.settings import Settings
from kernel.stores.admitting import Admitter
from kernel.stores.door import Stores
from kernel.stores.ledger import CallPolicy, LedgerEntry, NewCall, RunDecision, command_for
from planner._gate import Gate
from planner._planning import (
    ApprovalView,
    Decision,
    Dispatch,
    LedgerUpdate,
    LedgerView,
    PlanResult,
    plan_turn,
)
from schemas import (
    ApprovalDecision,
    CallOutcome,
    CancelRequest,
    ExecutionCommand,
    ModelResponseEvent,
    PlannedCall,
    ToolSpec,
)

log = logging.getLogger(__name__)

Issued = tuple[int, int] | None
"""A dispatched call's (attempt, fencing token); None when no command should be sent."""


class Planner:
    """Consumes model-responses, approvals, cancellations and outcomes (for concurrency caps)."""

    def __init__(self, settings: Settings, *, bus: Bus, stores: Stores) -> None:
        self.settings = settings
        self.bus = bus
        bus.gate = stores.output_gate()
        self.keys = stores.keys
        self.ledger = stores.ledger()
        self.tools = stores.tool_directory(max_age_s=settings.registry_cache_s)
        self.circuits = stores.circuits()
        self._routing: dict[str, str] = {}
        """Lookup key -> why its calls go where they go, as last logged (logged on change)."""
        self.gate = Gate(stores.gates())
        self.admitter = Admitter(stores.admission(), self.bus)
        self.schema = stores.schema()
        self.auth = DecisionAuth.of(settings)
        self._tracer = tracer("planner")
        self._loop: ConsumeLoop | None = None
        self.background = BackgroundTasks("planner", self.stop)
        """Its admission tick: if it ends, the planner stops and ``run`` raises its error."""

    def stop(self) -> None:
        """Finish the current message and return from ``run``."""
        if self._loop is not None:
            self._loop.stop()

    async def run(self) -> None:
        """Serve until stopped."""
        await self.bus.start()
        consumer = self.bus.consumer(
            ["model-responses", "approvals", "cancellations", "outcomes"], group="planner"
        )
        await consumer.start()
        self._loop = ConsumeLoop(
            self.bus,
            consumer,
            self.handle,
            wanted=self.wants,
            cut_off_after_s=self.settings.cut_off_after_s,
        )
        self.background.start("admission tick", self._tick())
        try:
            await self._loop.run()
        finally:
            await self.background.close()
            await consumer.stop()
            await self.bus.stop()
        self.background.raise_failure()

    async def _tick(self) -> None:
        """Admission's periodic pass, in every planner instance (they never conflict).

        A failed pass is tried again with backoff (``TICK``), not every period: against a
        Redis that was away it wrote a traceback every 50 ms. Kafka or Redis away is said by
        the dependency monitor; any other failure once, then once a minute with a count.
        """
        period = self.settings.admission_tick_ms / 1000
        failing = RecurringFailure(log, "admission tick failed; retrying with backoff")
        failures = 0
        while True:
            delay = TICK.delay(failures) if failures else period
            await nap(delay, wake=DEPENDENCIES.back if failures else None)
            try:
                await self.admitter.tick(self._report_never_started)
            except TRANSIENT_ERRORS as exc:
                failures += 1
                DEPENDENCIES.failed(exc)
                log.debug("admission tick failed", extra={"error": repr(exc)})
            except Exception as exc:  # never let the loop die: waiting calls rely on it
                failures += 1
                failing.failed(exc)
            else:
                failures = 0
                failing.succeeded()

    async def _report_never_started(self, outcome: CallOutcome) -> None:
        """A call withdrawn from admission's queue (its turn's deadline passed): settled in
        the ledger, so it does not stay ``dispatched``, then reported to its turn."""
        await self.ledger.settle(outcome)
        await self.bus.publish_and_wait("outcomes", outcome.run_id, outcome)

    def wants(self, record: Record) -> bool:
        """Every record but the outcomes neither admission nor a concurrency cap waits for.

        Those are skipped before decoding; the aggregator, which reads every outcome,
        dead-letters invalid ones.
        """
        if not record.topic.endswith("outcomes"):
            return True
        raw = record.value or b""
        return _CAPPED in raw or _ADMITTED in raw or _FROM_RECONCILER in raw

    async def handle(self, record: Record) -> None:
        """Route one record by topic; invalid bytes raise InvalidMessageError (dead-lettered)."""
        topic = record.topic.removeprefix(self.settings.topic_prefix)
        raw = record.value or b""
        if topic == "model-responses":
            event = ModelResponseEvent.decode(raw)
            with (
                log_context(**ids_of(event)),
                # The turn's span: every call's execution and the aggregation are its children.
                consuming(
                    self._tracer, "toolfleet plan", record, self.settings.group("planner")
                ) as span,
            ):
                if span.is_recording():
                    span.set_attributes(
                        {
                            "toolfleet.tenant_id": event.tenant_id,
                            "toolfleet.run_id": event.run_id,
                            "toolfleet.turn_id": event.turn_id,
                            "toolfleet.calls": len(event.function_calls),
                        }
                    )
                _check_limits(event, self.settings)
                await self.on_response(event, record)
        elif topic == "approvals":
            decision = ApprovalDecision.decode(raw)
            with log_context(**ids_of(decision)):
                self.auth.verify(decision)
                await self.on_approval(decision)
        elif topic == "cancellations":
            request = CancelRequest.decode(raw)
            with log_context(**ids_of(request)):
                self.auth.verify(request)
                await self.on_cancel(request)
        elif topic == "outcomes":
            await self.on_outcome(CallOutcome.decode(raw))

    async def on_response(self, event: ModelResponseEvent, record: Record) -> None:
        """Plan one model response, record it in the ledger, then publish plan and commands."""
        began = time.perf_counter()
        items = event.function_calls
        decisions = _decisions_of(event, self.auth)
        tools, routes = await self._routed([_lookup(c.namespace, c.name) for c in items])
        capped = event.config.max_concurrency is not None
        # A person's decision travelling with the calls it decides is stored first, exactly
        # as one received on `approvals`: no order between the two topics is needed.
        personal = [d for d in decisions if not d.by_policy]
        for decision in personal:
            await self.on_approval(decision)
        unasked = frozenset(d.call_id for d in decisions if d.by_policy)
        with phase(self._tracer, "ledger"):
            fresh = (
                None
                if event.resume or capped or personal
                else await self._plan_fresh(event, tools, routes, unasked)
            )
            result, issued = fresh or await self._plan_from_ledger(
                event, record, tools, routes, unasked
            )
        dispatches = {d.call.call_id: d for d in result.dispatch}
        # The ledger is written; plan and commands may now travel together (the aggregator
        # keeps outcomes that overtake their plan). All acks are awaited before the offset
        # of the response is committed.
        # The aggregator keeps the plan until the turn settles; its span joins this one then.
        plan = result.plan.model_copy(update={"traceparent": traceparent()})
        plan_sent = await self.bus.publish("plans", event.run_id, plan)
        if capped:
            release = await self.gate.open(plan, list(dispatches))
            # Handled again, the gate gives back what it released the first time; what ran
            # since is no longer dispatched (the ledger reads it finished): nothing to send.
            await self._send(event, [dispatches[cid] for cid in release if cid in dispatches])
        elif not result.failed:
            pairs = zip(dispatches.values(), issued, strict=True)
            await self._publish_commands(_commands_for(event, [(d, i) for d, i in pairs if i]))
        await plan_sent
        PLAN_LATENCY.observe(time.perf_counter() - began)

    async def on_outcome(self, outcome: CallOutcome) -> None:
        """Free the slots of a call whose outcome says they are still held (an earlier
        release's worker; the reconciler's report of a lost worker): a worker of this release
        frees them itself. Release the next calls of a capped turn."""
        if outcome.kind == "execute" and (outcome.admitted or outcome.source == "reconciler"):
            await self.admitter.release(outcome)  # a call never admitted: nothing to free
        if outcome.capped:
            await self._on_capped_outcome(outcome)

    async def _on_capped_outcome(self, outcome: CallOutcome) -> None:
        released = await self.gate.on_outcome(outcome)
        for call in released.never_started:
            skipped = _decided_outcome(outcome, call).model_copy(
                update={"status": "skipped", "effect": "not_executed", "output": None}
            )
            await self.bus.publish_and_wait("outcomes", outcome.run_id, skipped)
        if not released.send:
            return
        tenant, run = outcome.tenant_id, outcome.run_id
        entries = await self.ledger.read(tenant, run, (c.call_id for c in released.send))
        commands = []
        for call in released.send:
            entry = entries.get(call.call_id)
            issued = await self.ledger.dispatch(tenant, run, call.call_id) if entry else None
            if entry is None or issued is None:
                continue
            commands.append(
                command_for(
                    tenant,
                    entry,
                    attempt=issued[0],
                    token=issued[1],
                    approved=entry.approval == "approved",
                    tool_version=call.tool_version,
                )
            )
        await self._publish_commands(commands)

    async def on_approval(self, decision: ApprovalDecision) -> None:
        """Store a decision; the runtime resumes the turn with a ``resume: true`` response."""
        sticky = None
        if decision.sticky is not None:
            always = decision.sticky == "always_approve"
            sticky = (decision.tool_name, RunDecision(always, decision.message))
        await self.ledger.record_decision(
            decision.tenant_id,
            decision.run_id,
            decision.call_id,
            RunDecision(decision.approve, decision.message),
            sticky=sticky,
        )
        await self.ledger.append_audit(
            decision.tenant_id,
            decision.run_id,
            decision.call_id,
            "approval_decision",
            approve=decision.approve,
            sticky=decision.sticky,
            by=decision.decided_by,
        )

    async def on_cancel(self, request: CancelRequest) -> None:
        """Parent cancellation: nothing of the run starts from now on."""
        if request.call_id is None:
            await self.ledger.cancel_run(request.tenant_id, request.run_id, request.reason)
            # Its calls waiting for admission are withdrawn by the aggregator, which reports
            # them skipped in the cancelled turn's result.
            await self.gate.cancel_run(request.tenant_id, request.run_id)

    async def _approvals(self, tenant_id: str, run_id: str) -> ApprovalView:
        stored = await self.ledger.decisions(tenant_id, run_id)
        return ApprovalView(
            per_call={c: Decision(d.approve, d.message) for c, d in stored.per_call.items()},
            sticky={t: Decision(d.approve, d.message) for t, d in stored.sticky.items()},
        )

    async def _routed(self, needed: list[str]) -> tuple[dict[str, ToolSpec], dict[str, str]]:
        """The spec each tool is planned with, and the versions dispatched calls must run.

        A tool with several live versions, or a pin, goes where ``choose_version`` says (a
        pin, else the newest healthy version: automatic rollback) and is planned with that
        version's spec (its pool, effect class, approval). The circuits this needs are read
        in one MGET, cached, and only for tools that have a choice to make: the common turn
        costs no read beyond the cached directory.
        """
        catalog = await self.tools.catalog(needed)
        choosing = [
            key
            for key in dict.fromkeys(needed)
            if key in catalog.versions and (len(catalog.versions[key]) > 1 or key in catalog.pins)
        ]
        if not choosing:
            return catalog.specs, {}
        auto = self.settings.auto_rollback
        refs = [
            ref
            for key in choosing
            for ref in circuits_to_check(
                key, catalog.versions[key], pin=catalog.pins.get(key), auto_rollback=auto
            )
        ]
        open_refs = await self.circuits.open_among(refs) if refs else set()
        specs, routes = catalog.specs, {}
        for key in choosing:
            live = catalog.versions[key]
            choice = choose_version(
                key, live, open_refs, pin=catalog.pins.get(key), auto_rollback=auto
            )
            if self._routing.get(key) != (why := choice.describe()):
                self._routing[key] = why
                log.info("tool routing", extra={"tool": key, "routing": why})
            if choice.explicit:
                if specs is catalog.specs:
                    specs = dict(catalog.specs)  # the directory's cache is shared: copy once
                specs[key], routes[key] = live[choice.version], choice.version
        return specs, routes

    async def _plan_from_ledger(
        self,
        event: ModelResponseEvent,
        record: Record,
        tools: Mapping[str, ToolSpec],
        routes: Mapping[str, str],
        unasked: frozenset[str] = frozenset(),
    ) -> tuple[PlanResult, list[Issued]]:
        """Plan from what the ledger and the approval state hold, then record the plan; with
        each call dispatched now, its attempt and token (None when no command is due)."""
        items = event.function_calls
        # Both reads in one round trip.
        entries, approvals, held = await asyncio.gather(
            self.ledger.read(
                event.tenant_id, event.run_id, (c.call_id for c in items if c.call_id)
            ),
            self._approvals(event.tenant_id, event.run_id),
            self.ledger.held(event.tenant_id, event.run_id),
        )
        # A resumed turn gets a newer plan epoch; the offset keeps it stable on redelivery.
        epoch = record.offset + 1 if event.resume else 0
        result = plan_turn(
            event,
            tools=tools,
            ledger={cid: _view(e) for cid, e in entries.items()},
            approvals=approvals,
            now=time.time(),
            epoch=epoch,
            routes=routes,
            identity_scope=self.keys.identity_scope,
            held=held,
            unasked=unasked,
        )
        if result.failed:
            return result, []
        # Without a cap every call is dispatched now, in the same round trip.
        capped = event.config.max_concurrency is not None
        now = [] if capped else [d.call.call_id for d in result.dispatch]
        return result, await self._record(event, result.ledger_updates, dispatch=now)

    async def _plan_fresh(
        self,
        event: ModelResponseEvent,
        tools: Mapping[str, ToolSpec],
        routes: Mapping[str, str],
        unasked: frozenset[str] = frozenset(),
    ) -> tuple[PlanResult, list[Issued]] | None:
        """The plan of a turn whose calls are all new and dispatched at once, recorded in one
        round trip without reading the ledger first, with each dispatch's attempt and
        token; None (nothing written) when the turn
        is not that simple, or when the ledger knows one of its calls or the run has
        approval decisions: then it is planned from what the ledger holds.

        With no entry, no decision and no wrong-effect hold stored, planning from an empty
        ledger is exactly planning from the stored state, and the script checks that before
        writing.
        """
        result = plan_turn(
            event,
            tools=tools,
            ledger={},
            approvals=ApprovalView(),
            now=time.time(),
            epoch=0,
            routes=routes,
            identity_scope=self.keys.identity_scope,
            unasked=unasked,
        )
        updates = result.ledger_updates
        simple = (
            not result.failed
            and bool(updates)
            and [u.call.call_id for u in updates] == [d.call.call_id for d in result.dispatch]
            and all(u.create and not u.pending_approval and u.approval is None for u in updates)
        )
        if not simple:
            return None
        issued = await self.ledger.create_fresh(
            event.tenant_id, event.run_id, _new_calls(event, updates)
        )
        return None if issued is None else (result, list(issued))

    async def _record(
        self, event: ModelResponseEvent, updates: list[LedgerUpdate], dispatch: list[str]
    ) -> list[Issued]:
        """Write the plan's decisions to the ledger, dispatching ``dispatch`` (attempt and
        token per call, None when none should be sent); nothing is sent before this is durable.
        """
        new_calls = _new_calls(event, [u for u in updates if u.create])
        issued = await self.ledger.create(
            event.tenant_id, event.run_id, new_calls, dispatch=dispatch
        )
        for update in updates:
            call = update.call
            if update.pending_approval:
                await self.ledger.set_pending_approval(event.tenant_id, event.run_id, call.call_id)
            if update.approval is not None:
                await self.ledger.set_approval(
                    event.tenant_id,
                    event.run_id,
                    call.call_id,
                    approve=update.approval == "approved",
                    message=update.approval_message,
                    by="planner",
                )
            if call.disposition in ("reject", "not_found"):
                await self.ledger.settle(_decided_outcome(event, call))
        return issued

    async def _send(self, event: ModelResponseEvent, dispatches: list[Dispatch]) -> None:
        attempts = await self.ledger.dispatch_many(
            event.tenant_id, event.run_id, [d.call.call_id for d in dispatches]
        )
        # None: already running or finished; its outcome is (or will be) on its way.
        pairs = zip(dispatches, attempts, strict=True)
        await self._publish_commands(_commands_for(event, [(d, i) for d, i in pairs if i]))

    async def _publish_commands(self, commands: list[ExecutionCommand]) -> None:
        """Every command goes through admission: it reaches Kafka when it can run. It
        carries what the workers of the state version in force read (an earlier release's
        may still run)."""
        in_force = await self.schema.in_force()
        await self.admitter.submit([for_readers(c, in_force) for c in commands])


_CAPPED = b'"capped":true'
"""How a capped turn's outcome reads on the wire (compact JSON, as Message.encode writes it)."""
_ADMITTED = b'"admitted":true'
"""How the outcome of an admitted call whose worker did not free its slots reads on the wire
(an earlier release's worker, or one stored by it and re-emitted later)."""
_FROM_RECONCILER = b'"source":"reconciler"'
"""The reconciler's outcomes (a lost worker's call, say) free an admitted call's slots too:
it builds them from the ledger, which does not record admission."""


def _commands_for(
    event: ModelResponseEvent, dispatches: list[tuple[Dispatch, tuple[int, int]]]
) -> list[ExecutionCommand]:
    """The commands of ``dispatches``, each with its (attempt, fencing token), the run context
    the response carries and its call item's other fields (payload for the tool: the ledger
    does not keep them)."""
    calls = _new_calls(event, [d for d, _ in dispatches])
    commands = [
        command_for(
            event.tenant_id,
            call,
            attempt=attempt,
            token=token,
            approved=d.approved,
            tool_version=d.call.tool_version,
        )
        for call, (d, (attempt, token)) in zip(calls, dispatches, strict=True)
    ]
    items = {c.call_id: dict(c.model_extra) for c in event.function_calls if c.model_extra}
    if event.run_context is None and not items:
        return commands
    return [
        command.model_copy(
            update={"run_context": event.run_context, "tool_call": items.get(command.call_id)}
        )
        for command in commands
    ]


def _new_calls(
    event: ModelResponseEvent, planned: Sequence[LedgerUpdate | Dispatch]
) -> list[NewCall]:
    """What the ledger records of each planned call, with its turn's policy and trace
    (computed once for the turn)."""
    policy, trace = CallPolicy.of(event.config), trace_id() or ""
    return [
        NewCall(
            p.call.call_id,
            p.fingerprint,
            p.idempotency_key,
            event.run_id,
            event.turn_id,
            p.call.tool_name,
            p.call.pool,
            arguments=p.call.arguments,
            index=p.call.index,
            policy=policy,
            trace_id=trace,
        )
        for p in planned
    ]


def _lookup(namespace: str | None, name: str) -> str:
    return f"{namespace}.{name}" if namespace else name


def _view(entry: LedgerEntry) -> LedgerView:
    outcome = entry.outcome
    return LedgerView(
        call_id=entry.call_id,
        fingerprint=entry.fingerprint,
        state=entry.state,
        output=outcome.output if outcome else None,
        status=outcome.status if outcome else None,
        effect=outcome.effect if outcome else None,
        approval=entry.approval,
        approval_message=entry.approval_message,
        pending_approval=entry.pending_approval,
        run_id=entry.run_id or None,
        resolved=outcome.resolved if outcome else True,
    )


def _decided_outcome(turn: ModelResponseEvent | CallOutcome, call: PlannedCall) -> CallOutcome:
    """The outcome of a call the planner decided without running it (rejected, not found)."""
    return CallOutcome(
        tenant_id=turn.tenant_id,
        run_id=turn.run_id,
        turn_id=turn.turn_id,
        call_id=call.call_id,
        tool_name=call.tool_name,
        index=call.index,
        attempt=1,
        fencing_token=0,
        status=call.status or "rejected",
        effect=call.effect or "not_executed",
        output=call.output,
        source="planner",
        finished_at=time.time(),
    )


def _decisions_of(event: ModelResponseEvent, auth: DecisionAuth) -> list[ApprovalDecision]:
    """The verified decisions a response carries; a forged one, or one that decides anything
    but a call of this response, refuses the whole response (dead-lettered with the reason)."""
    decisions = event.decisions or []
    calls = {c.call_id for c in event.function_calls}
    for decision in decisions:
        auth.verify(decision)
        if (decision.tenant_id, decision.run_id) != (event.tenant_id, event.run_id) or (
            decision.call_id not in calls
        ):
            reason = (
                f"decision on {decision.call_id[:64]!r} travels with a response it does not "
                "decide: a response's decisions name its own tenant, run and calls"
            )
            raise InvalidMessageError(reason, reason=reason)
        if decision.by_policy and (not decision.approve or decision.sticky is not None):
            reason = (
                f"decision on {decision.call_id[:64]!r}: a by_policy decision only says that "
                "the tool's policy asked for no approval (approve, never sticky)"
            )
            raise InvalidMessageError(reason, reason=reason)
    return decisions


def _check_limits(event: ModelResponseEvent, settings: Settings) -> None:
    """Refuse a response over the configured limits before anything is planned (a dead
    letter with the reason; nesting deeper than pydantic's JSON limit never decodes)."""
    carried = event.run_context
    for what, copied in (
        ("context", carried.value if carried else None),
        ("tool input", carried.tool_input if carried else None),
    ):
        if copied is not None and len(copied.encode()) > settings.max_argument_bytes:
            reason = (
                f"run {what} of {len(copied.encode())} bytes, more than "
                f"TOOLFLEET_MAX_ARGUMENT_BYTES={settings.max_argument_bytes}"
            )
            raise InvalidMessageError(reason, reason=reason)
        if copied is not None and json_depth_exceeds(copied, settings.max_json_depth):
            reason = f"run {what} nested deeper than TOOLFLEET_MAX_JSON_DEPTH"
            raise InvalidMessageError(reason, reason=reason)
    calls = event.function_calls
    if len(calls) > settings.max_items_per_response:
        reason = (
            f"{len(calls)} function calls in one response, more than "
            f"TOOLFLEET_MAX_ITEMS_PER_RESPONSE={settings.max_items_per_response}"
        )
        raise InvalidMessageError(reason, reason=reason)
    for call in calls:
        size = len(call.arguments.encode())
        if size > settings.max_argument_bytes:
            reason = (
                f"call {call.call_id[:64]!r}: arguments of {size} bytes, more than "
                f"TOOLFLEET_MAX_ARGUMENT_BYTES={settings.max_argument_bytes}"
            )
            raise InvalidMessageError(reason, reason=reason)
        if json_depth_exceeds(call.arguments, settings.max_json_depth):
            reason = (
                f"call {call.call_id[:64]!r}: arguments nested deeper than "
                f"TOOLFLEET_MAX_JSON_DEPTH={settings.max_json_depth}"
            )
            raise InvalidMessageError(reason, reason=reason)
