"""Turn assembly: the pure part of the aggregator (no I/O, deterministic).

Outcomes arrive in any order, possibly twice, possibly late; the state of a turn only ever
moves forward, and the result is built in model order whatever the finish order, with the
failure reported chosen the way the SDK chooses it (items 8, 10, 11, 12, 16).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from kernel.errors import ToolfleetError
from kernel.rules.effects import fails_turn, parent_cancellation, settles_call
from kernel.rules.texts import RUN_ERROR
from schemas import (
    CallOutcome,
    CallRecord,
    CallStatus,
    Effect,
    FunctionCallOutput,
    Interruption,
    PlannedCall,
    TurnError,
    TurnPlan,
    TurnResult,
)

TurnStatus = Literal["completed", "interrupted", "failed", "cancelled"]
"""TurnResult.status."""

_DECIDED_BY_PLAN = frozenset({"reuse", "reject", "not_found", "interrupt"})
_SEVERITY_RANK = {"cancellation": 0, "error": 1, "base_exception": 2}

# The SDK re-raises its own exceptions as they are and wraps every other Exception in
# UserError("Error running tool {name}: {e}") (tool_execution.py, 0.24.0); these are the
# AgentsException subclasses a tool call can raise, from agents/exceptions.py.
_AGENTS_EXCEPTIONS = frozenset(
    {
        "AgentsException",
        "MaxTurnsExceeded",
        "ModelBehaviorError",
        "ModelRefusalError",
        "ModelTimeoutError",
        "UserError",
        "MCPToolCancellationError",
        "ToolTimeoutError",
        "InputGuardrailTripwireTriggered",
        "OutputGuardrailTripwireTriggered",
        "ToolInputGuardrailTripwireTriggered",
        "ToolOutputGuardrailTripwireTriggered",
    }
)


@dataclass
class TurnState:
    """Everything the aggregator keeps for one turn (one plan epoch); JSON-serialisable."""

    plan: TurnPlan
    outcomes: dict[str, CallOutcome] = field(default_factory=dict)
    """The latest accepted outcome per call_id (settling or not)."""
    cancelled: bool = False
    """Set by the I/O layer on a parent cancellation (CancelRequest without call_id)."""


def accept_outcome(state: TurnState, outcome: CallOutcome) -> bool:
    """Record ``outcome`` if it can still change the turn; False when it changes nothing.

    Accepted only for a dispatch/attach call of this plan, with a fencing token at least the
    recorded one, while the call is not finally settled. Duplicates and late outcomes (of a
    settled call, or of an older attempt) are ignored: delivery is at-least-once.

    A resumed plan (epoch > 0) ignores ``pending_approval`` outcomes of its dispatch calls: the
    planner dispatches a call that asked for approval only once a decision is recorded (the
    command then says approved and the worker never asks again), so such an outcome is the
    previous epoch's question (carried over, or redelivered) and must not settle the call
    before its real outcome arrives.
    """
    plan = state.plan
    if plan.error is not None or outcome.kind != "execute":
        return False  # probe and compensate outcomes are the reconciler's, never a turn's
    if (outcome.tenant_id, outcome.run_id, outcome.turn_id) != (
        plan.tenant_id,
        plan.run_id,
        plan.turn_id,
    ):
        return False
    call = _planned(state, outcome.call_id)
    if call is None or call.disposition not in ("dispatch", "attach"):
        return False
    if outcome.status == "pending_approval" and plan.epoch > 0 and call.disposition == "dispatch":
        return False
    recorded = state.outcomes.get(outcome.call_id)
    if recorded is not None and (
        _settles(call, recorded)
        or outcome.fencing_token < recorded.fencing_token
        or outcome == recorded
    ):
        return False
    state.outcomes[outcome.call_id] = outcome
    return True


def keep_early(early: dict[str, CallOutcome], outcome: CallOutcome) -> None:
    """Keep ``outcome`` in ``early`` (one per call) for a plan still to come, as that plan
    would take it had it been there: only the call's execution outcomes (a probe's or a
    compensation's is the reconciler's, never a turn's, and must not replace the one the
    plan needs), the latest attempt's, and of one attempt a final outcome over any other (a
    record of the attempt read again, or delivered late, must not bring back an unsettled
    outcome the reconciler has since resolved)."""
    if outcome.kind != "execute":
        return
    known = early.get(outcome.call_id)
    if (
        known is None
        or outcome.fencing_token > known.fencing_token
        or (outcome.fencing_token == known.fencing_token and not _final(known))
    ):
        early[outcome.call_id] = outcome


def _final(outcome: CallOutcome) -> bool:
    """Whether an outcome is its attempt's last word: resolved, and not the question of a
    call waiting for approval (its attempt's execution, once approved, comes after it)."""
    return outcome.resolved and outcome.status != "pending_approval"


def for_a_resumed_plan(state: TurnState, outcome: CallOutcome) -> bool:
    """Whether ``outcome``, which this plan does not take, is for a resumed plan still to come:
    its call waits for approval here (``interrupt``), and once approved a resumed plan
    dispatches it. The planner sends the command before the plan, and outcomes travel on
    another topic: the outcome can come first, and must wait for that plan (``early``)."""
    plan = state.plan
    call = _planned(state, outcome.call_id)
    return (
        outcome.kind == "execute"
        and outcome.status != "pending_approval"
        and (outcome.tenant_id, outcome.run_id, outcome.turn_id)
        == (plan.tenant_id, plan.run_id, plan.turn_id)
        and call is not None
        and call.disposition == "interrupt"
    )


def unsettled_calls(state: TurnState) -> list[str]:
    """call_ids still waiting for a settling outcome, in model order."""
    return [
        c.call_id
        for c in _in_model_order(state)
        if c.disposition not in _DECIDED_BY_PLAN and _settled(state, c) is None
    ]


def turn_error(state: TurnState) -> TurnError | None:
    """Why the turn failed, if it did: the plan's error, or the chosen call failure.

    Among settled outcomes that fail the turn (fails_turn, or a resolved status "failed" under
    failure_policy "fail_turn"), the choice is deterministic whatever the arrival order:
    base_exception > error > cancellation, ties by lowest model index (lifecycle item 11).
    """
    if state.plan.error is not None:
        return state.plan.error
    failures = [
        (call, outcome)
        for call in state.plan.calls
        if (outcome := _settled(state, call)) is not None and _fails_turn(state, outcome)
    ]
    if not failures:
        return None
    call, outcome = min(failures, key=lambda f: (-_SEVERITY_RANK[_severity(f[1])], f[0].index))
    return _error_of(call, outcome)


def is_settled(state: TurnState) -> bool:
    """True when the result can be built: every call decided, or the turn already ended.

    A turn ends early on a planning error or a parent cancellation (calls still queued or
    running are then reported skipped or cancelled). A failure does not end it early: the
    failure reported must not depend on which outcome arrived first, so the turn waits for
    every call - running siblings finish, and the planner reports the calls it will never
    start as skipped.
    """
    if state.plan.error is not None or state.cancelled:
        return True
    return not unsettled_calls(state)


def build_result(state: TurnState) -> TurnResult:
    """The TurnResult of a settled turn: outputs and records in model order.

    Raises ToolfleetError when the turn is not settled yet (see ``is_settled``); a turn
    deadline is expressed by setting ``state.cancelled``.
    """
    if not is_settled(state):
        raise ToolfleetError(
            f"turn {state.plan.run_id}/{state.plan.turn_id} is not settled: still waiting for "
            f"{unsettled_calls(state)}; build the result once is_settled(state) is true"
        )
    error = turn_error(state)
    outputs: list[FunctionCallOutput] = []
    interruptions: list[Interruption] = []
    records: list[CallRecord] = []
    for call in _in_model_order(state):
        outcome = _settled(state, call)
        text = _output(state, call, outcome)
        if text is not None:
            outputs.append(FunctionCallOutput(call_id=call.call_id, output=text))
        interrupted = call.disposition == "interrupt" or (
            outcome is not None and outcome.status == "pending_approval"
        )
        if interrupted:
            interruptions.append(
                Interruption(
                    call_id=call.call_id,
                    tool_name=call.tool_name,
                    arguments=call.arguments,
                    reason=call.reason,
                )
            )
        records.append(_record(state, call))
    status: TurnStatus = "completed"
    if error is not None:
        status = "failed"
    elif state.cancelled:
        status = "cancelled"
    elif interruptions:
        status = "interrupted"
    # As the SDK's tool-use tracker: the agent "used a tool" when the model called one.
    reset = state.plan.config.reset_tool_choice and bool(state.plan.calls)
    return TurnResult(
        tenant_id=state.plan.tenant_id,
        run_id=state.plan.run_id,
        turn_id=state.plan.turn_id,
        status=status,
        outputs=outputs,
        interruptions=interruptions,
        error=error,
        next_tool_choice="auto" if reset else None,
        calls=records,
    )


def _in_model_order(state: TurnState) -> list[PlannedCall]:
    return sorted(state.plan.calls, key=lambda c: c.index)


def _planned(state: TurnState, call_id: str) -> PlannedCall | None:
    return next((c for c in state.plan.calls if c.call_id == call_id), None)


def _settles(call: PlannedCall, outcome: CallOutcome) -> bool:
    return settles_call(outcome, call.on_unknown)


def _settled(state: TurnState, call: PlannedCall) -> CallOutcome | None:
    """The settling outcome of a dispatch/attach call (None for pre-decided calls too)."""
    if call.disposition in _DECIDED_BY_PLAN:
        return None
    outcome = state.outcomes.get(call.call_id)
    return outcome if outcome is not None and _settles(call, outcome) else None


def _severity(outcome: CallOutcome) -> str:
    if outcome.error is not None:
        return outcome.error.severity
    return "cancellation" if outcome.status == "cancelled" else "error"


def _fails_turn(state: TurnState, outcome: CallOutcome) -> bool:
    return fails_turn(outcome, state.plan.config.failure_policy, run_cancelled=state.cancelled)


def _error_of(call: PlannedCall, outcome: CallOutcome) -> TurnError:
    error = outcome.error
    if error is not None and (error.severity != "error" or error.type in _AGENTS_EXCEPTIONS):
        return TurnError(
            type=error.type,
            message=error.message,
            call_id=call.call_id,
            guardrails=outcome.guardrails,
        )
    if error is not None and outcome.fails_turn:
        # The executor already worded it as the SDK does ("Error running tool {name}: {e}",
        # with the tool's bare name): wrapping it again would say it twice.
        return TurnError(
            type="UserError",
            message=error.message,
            call_id=call.call_id,
            guardrails=outcome.guardrails,
        )
    detail = error.message if error is not None else outcome.status
    return TurnError(
        type="UserError",
        message=RUN_ERROR.format(name=call.tool_name, error=detail),
        call_id=call.call_id,
        guardrails=outcome.guardrails,
    )


def _output(state: TurnState, call: PlannedCall, outcome: CallOutcome | None) -> str | None:
    """What the model sees for one call, or None when the call has no output item."""
    if call.disposition in _DECIDED_BY_PLAN:
        return call.output  # None for interrupt
    if outcome is None or outcome.status in ("pending_approval", "skipped"):
        return None
    if parent_cancellation(outcome, state.cancelled) or _fails_turn(state, outcome):
        return None  # the failure is the turn's error, not an output (nor the run's cancel)
    return outcome.output


def _record(state: TurnState, call: PlannedCall) -> CallRecord:
    status: CallStatus
    effect: Effect
    if call.disposition in _DECIDED_BY_PLAN:
        defaults: dict[str, tuple[CallStatus, Effect]] = {
            "reuse": ("succeeded", "applied"),
            "reject": ("rejected", "not_executed"),
            "not_found": ("failed", "not_executed"),
            "interrupt": ("pending_approval", "not_executed"),
        }
        status, effect = defaults[call.disposition]
        return CallRecord(
            call_id=call.call_id,
            tool_name=call.tool_name,
            status=call.status or status,
            effect=call.effect or effect,
            attempts=0,
        )
    # The latest outcome even if unsettled: an unresolved timeout says more than "skipped".
    outcome = state.outcomes.get(call.call_id)
    if outcome is not None:
        effect = outcome.effect
        if not _settles(call, outcome):
            # Not settled (a turn cancelled early): the reconciler still decides the call. A
            # retry it sent may be running, and a retry that never began says nothing of an
            # earlier attempt, which may have applied.
            effect = "unknown"
        return CallRecord(
            call_id=call.call_id,
            tool_name=call.tool_name,
            status=outcome.status,
            effect=effect,
            attempts=outcome.attempt,
            started_at=outcome.started_at,
            finished_at=outcome.finished_at,
            guardrails=outcome.guardrails,
            value=outcome.value,
            error=outcome.error,
            run_context=outcome.run_context,
        )
    # No outcome: the call may be running elsewhere (its command was sent), so nothing is
    # known of its effect.
    return CallRecord(
        call_id=call.call_id,
        tool_name=call.tool_name,
        status="cancelled" if state.cancelled else "skipped",
        effect="unknown",
        attempts=0,
    )
