"""Outcomes toolfleet writes itself, when no tool body produced one."""

from __future__ import annotations

import time
from typing import Literal

from kernel.rules.effects import effect_for_class, timeout_verdict
from kernel.rules.texts import NEVER_STARTED_DEADLINE, NOT_STARTED_IN_TIME, unknown_outcome_text
from schemas import CallError, CallOutcome, ExecutionCommand, ToolSpec


def identity(command: ExecutionCommand, worker_id: str | None) -> dict[str, object]:
    """The fields that say which call and attempt an outcome belongs to."""
    return {
        "tenant_id": command.tenant_id,
        "run_id": command.run_id,
        "turn_id": command.turn_id,
        "call_id": command.call_id,
        "tool_name": command.tool_name,
        "index": command.index,
        "attempt": command.attempt,
        "fencing_token": command.fencing_token,
        "capped": command.capped,
        "admitted": command.admitted,
        "worker_id": worker_id,
        "finished_at": time.time(),
    }


WORKER_LOST = CallError(
    type="WorkerLost", message="the worker running this call stopped before reporting an outcome"
)
"""Why a call's effect is unknown when its worker vanished after ``started``."""

DEFERRAL_EXPIRED = CallError(
    type="DeferralExpired",
    message="the deferred call's completion did not arrive within its complete_within_s",
)
"""Why a deferred call's effect is unknown once its completion is overdue."""


def lost(
    command: ExecutionCommand,
    spec: ToolSpec | None,
    *,
    worker_id: str | None,
    source: Literal["executor", "reconciler"],
    cause: CallError = WORKER_LOST,
) -> CallOutcome:
    """A call whose worker vanished after it started (or whose ``started`` a failover could
    lose, ``cause`` says which): nobody knows whether it applied.

    A read-only tool cannot have applied anything; every other tool's effect is unknown.
    """
    effect = effect_for_class(spec.effect_class if spec else "non_idempotent", "unknown")
    return CallOutcome(
        **identity(command, worker_id),
        status="failed",
        effect=effect,
        resolved=effect != "unknown" or (spec is not None and spec.on_unknown == "report_now"),
        output=unknown_outcome_text(spec) if spec else None,
        error=cause,
        source=source,
    )


def ended(
    command: ExecutionCommand, worker_id: str | None, status: Literal["skipped", "cancelled"]
) -> CallOutcome:
    """A call of a cancelled run: skipped before it started, or cancelled while running."""
    return CallOutcome(
        **identity(command, worker_id),
        status=status,
        effect="not_executed" if status == "skipped" else "unknown",
        error=CallError(type="CancelledError", message="run cancelled", severity="cancellation"),
    )


def reported(outcome: CallOutcome) -> CallOutcome:
    """``outcome`` as the turn may take it: a later attempt that did not apply (refused, or
    never begun: an open circuit, a cancelled run, a tool not served) says nothing of the
    attempts before it, one of which may have applied; the reconciler, which knows, settles
    the call."""
    if outcome.kind == "execute" and outcome.attempt > 1 and outcome.effect == "not_executed":
        return outcome.model_copy(update={"resolved": False})
    return outcome


def past_deadline(command: ExecutionCommand) -> CallOutcome:
    """A call that waited for capacity until its turn's deadline: never started."""
    return CallOutcome(
        **identity(command, None),
        status="timed_out",
        effect="not_executed",
        output=NEVER_STARTED_DEADLINE.format(name=command.tool_name),
        error=CallError(
            type="DeadlineExceeded", message="the turn's deadline passed before the call started"
        ),
        source="planner",
    )


def missed_schedule_to_start(command: ExecutionCommand, seconds: float | None, now: float) -> bool:
    """Whether ``command`` waited past its tool's schedule-to-start timeout (None: it has
    none): counted from when the command was issued, so admission's wait counts."""
    return seconds is not None and now - command.issued_at > seconds


def not_started_in_time(
    command: ExecutionCommand, worker_id: str | None, seconds: float
) -> CallOutcome:
    """A call that waited past its tool's schedule-to-start timeout: it never starts, and what
    that proves is ``timeout_verdict("schedule_to_start")``'s."""
    verdict = timeout_verdict("schedule_to_start")
    return CallOutcome(
        **identity(command, worker_id),
        status="timed_out",
        effect=verdict.effect,
        retry=verdict.retry,
        output=NOT_STARTED_IN_TIME.format(name=command.tool_name, seconds=seconds),
        error=CallError(
            type="ScheduleToStartTimeout",
            message=f"not started within {seconds:g} s of the command's issue",
        ),
    )


def completed(
    command: ExecutionCommand,
    worker_id: str | None,
    effect: Literal["applied", "not_executed", "unknown"],
    output: str | None,
) -> CallOutcome:
    """A deferred call's outcome, as its completion says: applied succeeded, anything else
    failed; an unknown effect is the reconciler's (probed), as any unknown effect."""
    return CallOutcome(
        **identity(command, worker_id),
        status="succeeded" if effect == "applied" else "failed",
        effect=effect,
        output=output,
        resolved=effect != "unknown",
    )
