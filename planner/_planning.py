"""Turn planning: the pure decision of what happens to each call of one model response.

No I/O: the caller reads the ledger, approval state and tool registry, passes them in, and
applies the result (ledger writes, then commands). The whole response is judged before any
decision is acted on, so a bad response never has a partial side effect (lifecycle items 1-5,
15, 17; see docs/sdk-lifecycle.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Literal

from kernel.errors import ToolfleetError
from kernel.rules.approvals import approval_arguments
from kernel.rules.texts import (
    TOOL_DISABLED,
    TOOL_NOT_FOUND,
    TOOL_NOT_IN_AGENT,
    unknown_outcome_text,
)
from planner._identity import (
    EMPTY_CALL_ID,
    EXECUTED_NOT_COMMITTED,
    REUSED_COMPLETED,
    REUSED_IN_FLIGHT,
    REUSED_IN_RESPONSE,
    fingerprint,
    idempotency_key,
    lookup_key,
)
from schemas import (
    CallStatus,
    Disposition,
    Effect,
    FunctionCallItem,
    ModelResponseEvent,
    PlannedCall,
    ToolSpec,
    TurnError,
    TurnPlan,
)

LedgerState = Literal["planned", "dispatched", "started", "deferred", "finished", "committed"]
"""Where a call stands in the Redis call ledger."""

ApprovalState = Literal["approved", "rejected"]
"""A resolved approval, as recorded in the ledger."""

FailurePolicy = Literal["error_as_output", "fail_turn"]
"""TurnConfig.failure_policy."""

DEFAULT_REJECTION_MESSAGE = "Tool execution was not approved."
"""What the model sees for a rejected call without a message (the SDK's default)."""


@dataclass(frozen=True)
class LedgerView:
    """What the planner needs to know about one call_id already in the ledger."""

    call_id: str
    fingerprint: str
    state: LedgerState
    output: str | None = None
    """The committed output (state == "committed")."""
    status: CallStatus | None = None
    """Status of the committed outcome; None reads as "succeeded"."""
    effect: Effect | None = None
    """Effect of the committed outcome; None reads as "applied"."""
    approval: ApprovalState | None = None
    """The decision recorded for this call: authoritative once set, never asked again."""
    approval_message: str | None = None
    pending_approval: bool = False
    """The call was reported pending_approval (by a worker or by the planner)."""
    run_id: str | None = None
    """The run the call was first planned for (None: unknown, taken to be this one)."""
    resolved: bool = True
    """False: the committed outcome is still the reconciler's to settle (an attempt's effect
    unknown, or a retry that did nothing), and the model was told the effect is unknown."""

    @property
    def awaiting_approval(self) -> bool:
        """Asked for approval and not decided yet."""
        return self.pending_approval and self.approval is None


@dataclass(frozen=True)
class Decision:
    """One approval decision: approve or reject, with the message the model sees on rejection."""

    approve: bool
    message: str | None = None

    @property
    def state(self) -> ApprovalState:
        """How the ledger records this decision."""
        return "approved" if self.approve else "rejected"


@dataclass(frozen=True)
class ApprovalView:
    """Approval decisions received so far for the run: per call_id, and sticky per tool."""

    per_call: Mapping[str, Decision] = field(default_factory=dict)
    sticky: Mapping[str, Decision] = field(default_factory=dict)
    """Keyed by tool lookup key (namespace.name or name)."""


@dataclass(frozen=True)
class Dispatch:
    """A call to send an execute command for (the I/O layer releases them in model order)."""

    call: PlannedCall
    fingerprint: str
    idempotency_key: str
    approved: bool
    """ExecutionCommand.approved: a decision already granted; never evaluate needs_approval."""


@dataclass(frozen=True)
class LedgerUpdate:
    """What to write to the ledger for one call before sending any command.

    For reject / not_found, ``call.output`` (with ``call.status`` and ``call.effect``) is
    decided without execution: commit it now.
    """

    call: PlannedCall
    fingerprint: str
    idempotency_key: str
    create: bool
    """No entry existed: create one in state "planned"."""
    pending_approval: bool
    """The call now waits for an approval decision (disposition interrupt)."""
    approval: ApprovalState | None = None
    """The decision this plan acts on: record it with the dispatch or the rejection."""
    approval_message: str | None = None


@dataclass(frozen=True)
class PlanResult:
    """The plan of one turn, and what the I/O layer must write and send for it."""

    plan: TurnPlan
    dispatch: list[Dispatch]
    """Commands to send, in model order; empty when the plan failed."""
    ledger_updates: list[LedgerUpdate]
    """One per call decided by this plan (not for reuse/attach); empty when the plan failed."""

    @property
    def failed(self) -> bool:
        """True when planning failed the turn (plan.error is set; nothing may be dispatched)."""
        return self.plan.error is not None

    @property
    def interruptions(self) -> list[PlannedCall]:
        """Calls waiting for approval, in model order."""
        return [c for c in self.plan.calls if c.disposition == "interrupt"]


@dataclass(frozen=True)
class _Call:
    item: FunctionCallItem
    index: int
    key: str
    fingerprint: str


class _TurnFailed(ToolfleetError):
    """Internal: the first turn error stops planning. All are ModelBehaviorError in SDK 0.24."""

    def __init__(self, message: str, call_id: str | None) -> None:
        super().__init__(message)
        self.error = TurnError(type="ModelBehaviorError", message=message, call_id=call_id)


def plan_turn(
    event: ModelResponseEvent,
    *,
    tools: Mapping[str, ToolSpec],
    ledger: Mapping[str, LedgerView],
    approvals: ApprovalView,
    now: float,
    epoch: int = 0,
    routes: Mapping[str, str] | None = None,
    held: Set[str] = frozenset(),
    unasked: Set[str] = frozenset(),
    identity_scope: Literal["run", "tenant"] = "run",
) -> PlanResult:
    """Decide every call of ``event``; a turn error leaves nothing to dispatch or write.

    ``routes`` (lookup key -> version) names the version dispatched calls of a tool must run
    (an operator's pin or an automatic rollback, see ``kernel.rules.versions``); ``tools`` then
    holds that version's spec. Other calls run the newest version their worker serves.

    ``tools`` is keyed by lookup key, ``ledger`` by call_id (entries of this tenant). A resumed
    event (``resume=True``) goes through the same path: the ledger is consulted first for every
    call, which is what resumption needs and what a redelivered response needs too. ``held``
    names the run's calls with a wrong effect not yet compensated: while there is one, every
    new call of a tool that is not read_only waits for a human (an approval releases it).
    ``unasked`` names the calls whose agent runtime evaluated the tool's approval policy and
    asked no one (signed ``by_policy`` decisions): they are dispatched pre-approved, so the
    worker does not evaluate the policy a second time, unless the fleet itself wants a person.
    ``identity_scope`` is the deployment's (``Settings.identity_scope``): the idempotency keys
    of the run's calls name the run unless identity is scoped to the tenant.
    """
    agent = event.agent.name
    decided: list[tuple[PlannedCall, bool, Decision | None]] = []
    error: TurnError | None = None
    calls: list[_Call] = []
    try:
        calls = _identify(event, ledger)
        for c in calls if event.config.tool_not_found == "raise_error" else []:
            # A call the ledger settles needs no tool: its output exists or its run is under way.
            entry = ledger.get(c.item.call_id)
            if c.key not in tools and not _settled_by_ledger(entry, event.run_id):
                raise _TurnFailed(TOOL_NOT_IN_AGENT.format(name=c.key, agent=agent), c.item.call_id)
        decided = [
            _plan_call(c, event, tools, ledger, approvals, held=held, unasked=unasked)
            for c in calls
        ]
        for planned, _, _ in decided:  # the SDK re-checks is_enabled right before invoking
            tool = tools.get(planned.tool_name)
            if planned.disposition == "dispatch" and tool is not None and not tool.enabled:
                # The SDK names the tool by its bare name here (function_tool.name).
                text = TOOL_DISABLED.format(name=tool.name, agent=agent)
                raise _TurnFailed(text, planned.call_id)
    except _TurnFailed as failure:
        error, decided = failure.error, []
    if routes:
        decided = [(_routed(planned, routes), ok, applied) for planned, ok, applied in decided]
    plan = TurnPlan(
        tenant_id=event.tenant_id,
        run_id=event.run_id,
        turn_id=event.turn_id,
        response_id=event.response_id,
        agent_name=agent,
        epoch=epoch,
        calls=[planned for planned, _, _ in decided],
        config=event.config,
        error=error,
        planned_at=now,
    )
    dispatch: list[Dispatch] = []
    updates: list[LedgerUpdate] = []
    if error is not None:
        return PlanResult(plan, dispatch, updates)  # plan before side effects: nothing at all
    for call, (planned, approved, applied) in zip(calls, decided, strict=True):
        if planned.disposition in ("reuse", "attach"):
            continue  # the ledger already holds this call; nothing to write or send
        scope = event.run_id if identity_scope == "run" else ""
        key = idempotency_key(event.tenant_id, scope, planned.call_id, call.fingerprint)
        if planned.disposition == "dispatch":
            dispatch.append(Dispatch(planned, call.fingerprint, key, approved))
        updates.append(
            LedgerUpdate(
                planned,
                call.fingerprint,
                key,
                create=planned.call_id not in ledger,
                # A held call is not asked for approval: once the run is no longer held it
                # is planned as usual again.
                pending_approval=planned.disposition == "interrupt" and planned.reason is None,
                approval=applied.state if applied is not None else None,
                approval_message=applied.message if applied is not None else None,
            )
        )
    return PlanResult(plan, dispatch, updates)


def _routed(planned: PlannedCall, routes: Mapping[str, str]) -> PlannedCall:
    """A dispatched call of a routed tool, naming the version its command must run."""
    version = routes.get(planned.tool_name)
    if planned.disposition != "dispatch" or version is None:
        return planned
    return planned.model_copy(update={"tool_version": version})


def next_to_release(
    calls: Sequence[PlannedCall],
    in_flight: Set[str],
    finished: Set[str],
    *,
    limit: int | None,
    failed: bool,
    policy: FailurePolicy,
) -> list[str]:
    """The queued dispatch calls to start now, in model order (lifecycle item 9).

    At most ``limit`` calls in flight (None: no limit); after a failure under "fail_turn"
    nothing new starts, while calls already in flight keep running to their outcome.
    """
    if failed and policy == "fail_turn":
        return []
    queued = [
        c.call_id
        for c in calls
        if c.disposition == "dispatch" and c.call_id not in in_flight and c.call_id not in finished
    ]
    if limit is None:
        return queued
    running = len(set(in_flight) - set(finished))
    return queued[: max(0, limit - running)]


def _identify(event: ModelResponseEvent, ledger: Mapping[str, LedgerView]) -> list[_Call]:
    """Dedupe the response by invocation identity; the first problem in model order fails it."""
    seen: dict[str, _Call] = {}
    for index, item in enumerate(event.function_calls):
        if not item.call_id:
            raise _TurnFailed(EMPTY_CALL_ID, None)
        key = lookup_key(item)
        call = _Call(item, index, key, fingerprint(key, item.arguments))
        first = seen.get(item.call_id)
        if first is not None:
            if first.fingerprint != call.fingerprint:
                raise _TurnFailed(REUSED_IN_RESPONSE, item.call_id)
            continue  # merged: the invocation runs once, at its first position
        entry = ledger.get(item.call_id)
        if entry is not None and entry.fingerprint != call.fingerprint:
            text = REUSED_COMPLETED if entry.state == "committed" else REUSED_IN_FLIGHT
            raise _TurnFailed(text, item.call_id)
        if entry is not None and entry.state == "committed" and entry.output is None:
            # It ran, but its outcome gave the model nothing (it failed the turn, or its run
            # was cancelled while it ran): there is no committed output to reuse, and running
            # it again is not ours to decide (lifecycle item 4).
            raise _TurnFailed(EXECUTED_NOT_COMMITTED, item.call_id)
        seen[item.call_id] = call
    return list(seen.values())


def _settled_by_ledger(entry: LedgerView | None, run_id: str) -> bool:
    """Committed, or user code may be running: the ledger decides; nothing is sent again.

    A planned/dispatched call of this run is decided again (its command may be lost, or it
    waits for approval); resending is safe: dispatch is idempotent and only one worker starts
    a call. One dispatched for another run (the same call_id and arguments submitted in
    several runs at once, under tenant identity scope) is that run's to send: this turn
    attaches to its outcome.
    """
    if entry is None:
        return False
    if entry.state in ("started", "deferred", "finished", "committed"):
        return True  # a deferred call's completion settles it
    return entry.state == "dispatched" and entry.run_id not in (None, run_id)


def _plan_call(
    call: _Call,
    event: ModelResponseEvent,
    tools: Mapping[str, ToolSpec],
    ledger: Mapping[str, LedgerView],
    approvals: ApprovalView,
    *,
    held: Set[str],
    unasked: Set[str] = frozenset(),
) -> tuple[PlannedCall, bool, Decision | None]:
    """One call's disposition, whether its command is pre-approved, and the decision applied."""
    tool, entry = tools.get(call.key), ledger.get(call.item.call_id)
    disposition: Disposition = "dispatch"
    output: str | None = None
    reason: str | None = None
    status: CallStatus | None = None
    effect: Effect | None = None
    approved, applied = False, None
    if entry is not None and entry.state == "committed":
        disposition, output = "reuse", entry.output
        status, effect = entry.status or "succeeded", entry.effect or "applied"
        if not entry.resolved:
            # What the reconciler told the model of it: unknown (a retry's "not executed"
            # says nothing of the attempt before it), until it settles the call.
            effect = "unknown"
            output = unknown_outcome_text(tool) if tool is not None else output
    elif _settled_by_ledger(entry, event.run_id):
        disposition = "attach"
    elif tool is None:  # only under return_error_to_model: raise_error failed the turn already
        disposition, output = "not_found", TOOL_NOT_FOUND.format(name=call.key)
        status, effect = "failed", "not_executed"
    else:
        by_policy = call.item.call_id in unasked
        disposition, approved, applied = _partition(
            call, event, tool, entry, approvals, by_policy=by_policy
        )
        # A policy's "no approval needed" is not a person's: it does not release a held run.
        released = approved and applied is not None
        if disposition == "reject" and applied is not None:
            output, status, effect = applied.message, "rejected", "not_executed"
        elif held and not released and tool.effect_class != "read_only":
            disposition, reason, approved = "interrupt", held_reason(held), False
    planned = PlannedCall(
        call_id=call.item.call_id,
        tool_name=call.key,
        index=call.index,
        arguments=call.item.arguments,
        disposition=disposition,
        pool=tool.pool if tool is not None else None,
        output=output,
        status=status,
        effect=effect,
        effect_class=tool.effect_class if tool is not None else "non_idempotent",
        on_unknown=tool.on_unknown if tool is not None else "reconcile_then_report",
        reason=reason,
    )
    return planned, approved, applied


def held_reason(held: Set[str]) -> str:
    """Why a held run's call waits: which calls' wrong effects are not compensated yet."""
    calls = ", ".join(sorted(held))
    return (
        f"held for a human: call {calls} of this run had a wrong effect that is not "
        "compensated yet; an operator approves this call, or it runs once the compensation "
        "is resolved"
    )


def _partition(
    call: _Call,
    event: ModelResponseEvent,
    tool: ToolSpec,
    entry: LedgerView | None,
    approvals: ApprovalView,
    *,
    by_policy: bool = False,
) -> tuple[Disposition, bool, Decision | None]:
    """The approval partition: a stored decision first, and never ask twice (lifecycle item 5).

    ``by_policy``: the agent runtime evaluated the tool's own policy and asked no one; the
    call runs pre-approved unless the fleet's spec wants a person for every call.
    """
    decision, rejection = _stored_decision(call, entry, approvals)
    if decision is not None:
        if decision.approve:
            return "dispatch", True, decision
        return "reject", False, Decision(False, rejection)
    if entry is not None and entry.awaiting_approval:
        return "interrupt", False, None  # already asked: wait for the decision
    if by_policy:
        if tool.needs_approval == "always":
            return "interrupt", False, None  # the fleet wants a person for every call
        return "dispatch", True, None
    if _needs_approval(tool, call.item.arguments) is not True:
        return "dispatch", False, None  # "callable" (None): the worker evaluates it
    if event.config.pre_approval_guardrails and tool.needs_approval != "never":
        # The worker runs input guardrails, then reports pending_approval (its registry agrees).
        return "dispatch", False, None
    return "interrupt", False, None


def _stored_decision(
    call: _Call, entry: LedgerView | None, approvals: ApprovalView
) -> tuple[Decision | None, str]:
    """The decision already taken for this call, if any, and the rejection text to use.

    Per-call decisions (the ledger's, then the approval state's) beat the sticky one for the
    tool; the rejection text is per-call message > sticky rejection message > default.
    """
    sticky = approvals.sticky.get(call.key)
    sticky_message = sticky.message if sticky is not None and not sticky.approve else None
    per_call = (
        Decision(entry.approval == "approved", entry.approval_message)
        if entry is not None and entry.approval is not None
        else approvals.per_call.get(call.item.call_id)
    )
    if per_call is not None:
        return per_call, per_call.message or sticky_message or DEFAULT_REJECTION_MESSAGE
    if sticky is not None:
        return sticky, sticky.message or DEFAULT_REJECTION_MESSAGE
    return None, DEFAULT_REJECTION_MESSAGE


def _needs_approval(tool: ToolSpec, arguments: str) -> bool | None:
    """True: ask before running. False: run. None: the worker evaluates the callable."""
    if tool.needs_approval == "always":
        return True
    if tool.needs_approval == "callable":
        # Fail closed: a callable checker cannot judge arguments it cannot read for certain.
        return True if approval_arguments(arguments) is None else None
    # "never" is explicit here: the registry already publishes irreversible tools as "always"
    # unless their author opted out (the release gate: irreversible needs approval by default).
    return False
