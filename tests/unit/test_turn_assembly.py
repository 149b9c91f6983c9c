"""Aggregator turn assembly: one test per rule (SDK lifecycle items 8, 10, 11, 12, 16)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from aggregator import (
    TurnState,
    accept_outcome,
    build_result,
    for_a_resumed_plan,
    is_settled,
    keep_early,
    turn_error,
    unsettled_calls,
)
from kernel.errors import ToolfleetError
from schemas import CallError, CallOutcome, PlannedCall, TurnConfig, TurnError, TurnPlan

TIMEOUT_TEXT = "Tool 'add' timed out after 5 seconds."
SDK_ERROR_TEXT = "An error occurred while running the tool. Please try again."
CANCELLED = CallError(type="CancelledError", message="", severity="cancellation")


def call(call_id: str, index: int, disposition: str = "dispatch", **fields: Any) -> PlannedCall:
    return PlannedCall.model_validate(
        {"call_id": call_id, "tool_name": "add", "index": index, "arguments": f'{{"n": {index}}}',
         "disposition": disposition, **fields}
    )  # fmt: skip


def state(*calls: PlannedCall, error: TurnError | None = None, **config: Any) -> TurnState:
    plan = TurnPlan(
        tenant_id="t1", run_id="r1", turn_id=7, response_id="resp", agent_name="assistant",
        calls=list(calls), config=TurnConfig(**config), error=error, planned_at=1.0,
    )  # fmt: skip
    return TurnState(plan=plan)


def outcome(call_id: str, index: int, status: str = "succeeded", **fields: Any) -> CallOutcome:
    """A first-attempt outcome; succeeded/failed/timed_out ones carry an output."""
    values: dict[str, Any] = {
        "tenant_id": "t1", "run_id": "r1", "turn_id": 7, "call_id": call_id, "tool_name": "add",
        "index": index, "attempt": 1, "fencing_token": 1, "status": status,
        "effect": "applied" if status == "succeeded" else "not_executed",
        "output": f"out-{call_id}" if status in ("succeeded", "failed", "timed_out") else None,
        "started_at": 10.0 + index, "finished_at": 20.0 + index,
    }  # fmt: skip
    return CallOutcome.model_validate({**values, **fields})


def failure(
    call_id: str, index: int, severity: str = "error", type_: str = "ValueError"
) -> CallOutcome:
    return outcome(
        call_id,
        index,
        "cancelled" if severity == "cancellation" else "failed",
        output=SDK_ERROR_TEXT,
        error=CallError(type=type_, message=f"boom {call_id}", severity=severity),
        fails_turn=True,
    )


def outputs(s: TurnState) -> list[tuple[str, str]]:
    return [(o.call_id, o.output) for o in build_result(s).outputs]


# --- ordering (item 8) ---------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(25))
def test_outputs_in_model_order_whatever_the_finish_order(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 12)
    dispositions = ["dispatch", "attach", "reuse", "reject", "not_found", "interrupt"]
    calls = []
    for i in range(n):
        d = rng.choice(dispositions)
        pre = {"output": f"pre-{i}"} if d in ("reuse", "reject", "not_found") else {}
        calls.append(call(f"c{i}", i, d, **pre))
    s = state(*calls)
    arrivals = [
        outcome(c.call_id, c.index) for c in calls if c.disposition in ("dispatch", "attach")
    ]
    rng.shuffle(arrivals)
    arrivals += rng.sample(arrivals, k=len(arrivals) // 2)  # at-least-once: some twice
    for o in arrivals:
        accept_outcome(s, o)
    assert is_settled(s)
    result = build_result(s)
    expected = [
        (c.call_id, c.output or f"out-{c.call_id}") for c in calls if c.disposition != "interrupt"
    ]
    assert [(o.call_id, o.output) for o in result.outputs] == expected
    assert [r.call_id for r in result.calls] == [c.call_id for c in calls]


def test_calls_listed_out_of_index_order_are_still_assembled_in_model_order() -> None:
    s = state(call("b", 1), call("a", 0))
    accept_outcome(s, outcome("b", 1))
    accept_outcome(s, outcome("a", 0))
    assert outputs(s) == [("a", "out-a"), ("b", "out-b")]


# --- accepting outcomes (at-least-once, fencing) -------------------------------------------
def test_duplicate_outcome_changes_nothing() -> None:
    s = state(call("c1", 0))
    assert accept_outcome(s, outcome("c1", 0))
    assert not accept_outcome(s, outcome("c1", 0))


def test_late_outcome_of_a_settled_call_is_ignored() -> None:
    s = state(call("c1", 0))
    assert accept_outcome(s, outcome("c1", 0, fencing_token=1))
    assert not accept_outcome(s, outcome("c1", 0, "failed", fencing_token=2))
    assert outputs(s) == [("c1", "out-c1")]


def test_outcome_with_an_older_fencing_token_is_ignored() -> None:
    s = state(call("c1", 0))
    unresolved = outcome("c1", 0, "timed_out", effect="unknown", resolved=False, fencing_token=3)
    assert accept_outcome(s, unresolved)
    assert not accept_outcome(s, outcome("c1", 0, fencing_token=2))
    assert accept_outcome(s, outcome("c1", 0, fencing_token=3, source="reconciler"))


def test_outcome_for_another_turn_or_an_unknown_call_is_ignored() -> None:
    s = state(call("c1", 0))
    assert not accept_outcome(s, outcome("c1", 0, turn_id=8))
    assert not accept_outcome(s, outcome("c1", 0, run_id="r2"))
    assert not accept_outcome(s, outcome("c1", 0, tenant_id="t2"))
    assert not accept_outcome(s, outcome("zz", 0))
    assert s.outcomes == {}


@pytest.mark.parametrize("disposition", ["reuse", "reject", "not_found", "interrupt"])
def test_outcome_for_a_call_decided_by_the_plan_is_ignored(disposition: str) -> None:
    s = state(call("c1", 0, disposition, output="x"))
    assert not accept_outcome(s, outcome("c1", 0))


def test_the_outcome_of_a_call_waiting_for_approval_is_for_the_resumed_plan() -> None:
    """Approved, the call is dispatched by a resumed plan (a newer epoch); its outcome may come
    before that plan does, and is kept for it rather than dropped."""
    s = state(call("c1", 0, "interrupt"), call("c2", 1))
    ran = outcome("c1", 0)
    assert not accept_outcome(s, ran) and for_a_resumed_plan(s, ran)
    assert not for_a_resumed_plan(s, outcome("c1", 0, "pending_approval"))  # the question
    assert not for_a_resumed_plan(s, outcome("c1", 0, turn_id=8))  # another turn's
    assert not for_a_resumed_plan(s, outcome("c2", 1))  # a call this plan dispatched
    assert not for_a_resumed_plan(s, outcome("zz", 0))
    resumed = state(call("c1", 0), call("c2", 1))
    resumed.plan = resumed.plan.model_copy(update={"epoch": 5})
    assert accept_outcome(resumed, ran)


def test_an_outcome_before_its_plan_is_kept_as_the_plan_would_take_it() -> None:
    """Seed 34474: a charge's unknown effect, the probe's outcome and the reconciler's
    resolution all came before the turn's plan; the probe's, read last, replaced the
    resolution, the plan never saw its call settle, and the turn never ended."""
    early: dict[str, CallOutcome] = {}
    unknown = outcome("c1", 0, "failed", effect="unknown", resolved=False)
    resolved = outcome("c1", 0, effect="applied", source="reconciler")
    for record in (unknown, outcome("c1", 0, kind="probe"), resolved,
                   outcome("c1", 0, kind="compensate"), unknown):  # fmt: skip
        keep_early(early, record)
    assert early == {"c1": resolved}  # a probe's is the reconciler's; the unknown is older
    s = state(call("c1", 0))
    assert all(accept_outcome(s, o) for o in early.values()) and is_settled(s)


def test_an_outcome_kept_before_its_plan_gives_way_to_a_newer_attempt_only() -> None:
    early: dict[str, CallOutcome] = {}
    keep_early(early, outcome("c1", 0, kind="probe"))
    assert early == {}
    first = outcome("c1", 0, "failed", resolved=False, retry="transient")
    second = outcome("c1", 0, attempt=2, fencing_token=2)
    keep_early(early, first)
    keep_early(early, second)
    keep_early(early, first)  # the older attempt's, read again
    assert early == {"c1": second}
    # A call's approval question, then the same attempt's execution once approved.
    asked = outcome("c2", 1, "pending_approval")
    keep_early(early, asked)
    keep_early(early, ran := outcome("c2", 1))
    assert early["c2"] == ran


NOT_FOUND = "Tool 'x' not found."


def test_pre_decided_dispositions_are_settled_from_the_plan() -> None:
    s = state(
        call("c1", 0, "reuse", output="old", status="succeeded", effect="applied"),
        call("c2", 1, "reject", output="no", status="rejected", effect="not_executed"),
        call("c3", 2, "not_found", output=NOT_FOUND, status="failed", effect="not_executed"),
        call("c4", 3, "interrupt"),
    )
    assert is_settled(s)
    result = build_result(s)
    assert [(o.call_id, o.output) for o in result.outputs] == [
        ("c1", "old"),
        ("c2", "no"),
        ("c3", NOT_FOUND),
    ]
    assert [(r.status, r.effect, r.attempts) for r in result.calls] == [
        ("succeeded", "applied", 0),
        ("rejected", "not_executed", 0),
        ("failed", "not_executed", 0),
        ("pending_approval", "not_executed", 0),
    ]


def test_dispatch_and_attach_calls_wait_for_an_outcome() -> None:
    s = state(call("c1", 0), call("c2", 1, "attach"))
    assert not is_settled(s)
    accept_outcome(s, outcome("c2", 1))
    assert unsettled_calls(s) == ["c1"]
    with pytest.raises(ToolfleetError, match="not settled"):
        build_result(s)


# --- unknown effects -----------------------------------------------------------------------
def test_unresolved_outcome_waits_for_the_reconciler_under_reconcile_then_report() -> None:
    s = state(call("c1", 0, on_unknown="reconcile_then_report"))
    accept_outcome(s, outcome("c1", 0, "timed_out", effect="unknown", resolved=False))
    assert not is_settled(s)
    accept_outcome(s, outcome("c1", 0, effect="applied", source="reconciler", output="found it"))
    assert outputs(s) == [("c1", "found it")]


def test_unresolved_outcome_settles_at_once_under_report_now_with_the_sdk_timeout_text() -> None:
    s = state(call("c1", 0, on_unknown="report_now"))
    accept_outcome(
        s, outcome("c1", 0, "timed_out", effect="unknown", resolved=False, output=TIMEOUT_TEXT)
    )
    assert is_settled(s)
    assert outputs(s) == [("c1", TIMEOUT_TEXT)]
    assert build_result(s).calls[0].effect == "unknown"
    assert not accept_outcome(s, outcome("c1", 0, source="reconciler"))  # already told the model


# --- failure policy (items 10, 11, 14) -----------------------------------------------------
def test_planning_error_fails_the_turn_with_no_outputs() -> None:
    error = TurnError(type="ModelBehaviorError", message="Tool nope not found in agent a")
    s = state(error=error)
    assert is_settled(s)
    result = build_result(s)
    assert (result.status, result.error, result.outputs) == ("failed", error, [])
    assert result.next_tool_choice is None


def test_error_as_output_lists_the_failed_calls_output_and_leaves_siblings_alone() -> None:
    s = state(call("c1", 0), call("c2", 1))
    accept_outcome(
        s, outcome("c2", 1, "failed", output=SDK_ERROR_TEXT, error=CallError(type="E", message="x"))
    )
    assert not is_settled(s)
    accept_outcome(s, outcome("c1", 0))
    result = build_result(s)
    assert result.status == "completed" and result.error is None
    assert [(o.call_id, o.output) for o in result.outputs] == [
        ("c1", "out-c1"),
        ("c2", SDK_ERROR_TEXT),
    ]


def test_fail_turn_fails_the_turn_and_keeps_the_finished_siblings_outputs() -> None:
    s = state(call("c1", 0), call("c2", 1), call("c3", 2), failure_policy="fail_turn")
    accept_outcome(s, outcome("c1", 0))
    accept_outcome(s, outcome("c2", 1, "failed", error=CallError(type="ValueError", message="bad")))
    assert not is_settled(s)  # the failure is chosen once every call has reported
    accept_outcome(s, outcome("c3", 2, "skipped", source="planner"))  # never started
    assert is_settled(s)
    result = build_result(s)
    assert result.status == "failed"
    assert result.error == TurnError(
        type="UserError", message="Error running tool add: bad", call_id="c2"
    )
    assert [(o.call_id, o.output) for o in result.outputs] == [("c1", "out-c1")]
    assert [(r.call_id, r.status) for r in result.calls] == [
        ("c1", "succeeded"),
        ("c2", "failed"),
        ("c3", "skipped"),
    ]


def test_fails_turn_outcome_fails_the_turn_under_error_as_output() -> None:
    s = state(call("c1", 0), call("c2", 1))
    accept_outcome(s, failure("c2", 1))
    assert not is_settled(s)  # a running sibling still reports (its output is kept)
    accept_outcome(s, outcome("c1", 0))
    assert is_settled(s)
    assert build_result(s).status == "failed"


def test_timeout_under_fail_turn_stays_an_output_unless_the_executor_fails_the_turn() -> None:
    s = state(call("c1", 0, on_unknown="report_now"), failure_policy="fail_turn")
    accept_outcome(
        s, outcome("c1", 0, "timed_out", effect="unknown", resolved=False, output=TIMEOUT_TEXT)
    )
    assert build_result(s).status == "completed"


def test_a_call_of_a_cancelled_turn_without_an_outcome_has_an_unknown_effect() -> None:
    s = state(call("c1", 0), call("c2", 1), call("c3", 2, "attach"), failure_policy="fail_turn")
    accept_outcome(s, failure("c1", 0))
    s.cancelled = True
    assert [(r.status, r.effect) for r in build_result(s).calls[1:]] == [
        ("cancelled", "unknown")
    ] * 2


def test_an_unsettled_call_of_a_cancelled_turn_has_an_unknown_effect() -> None:
    """c1: attempt 1 was cancelled with the run (its effect unknown); the retry never began
    (skipped, not executed) and waits for the reconciler. c2: attempt 1 failed before it
    applied, and the reconciler's retry may be running. Neither effect is known yet."""
    s = state(call("c1", 0), call("c2", 1))
    first = outcome("c1", 0, "cancelled", effect="unknown", resolved=False)
    retry = outcome("c1", 0, "skipped", effect="not_executed", resolved=False, attempt=2,
                    fencing_token=2)  # fmt: skip
    accept_outcome(s, first)
    accept_outcome(s, retry)
    accept_outcome(s, outcome("c2", 1, "failed", effect="not_executed", resolved=False))
    s.cancelled = True
    records = build_result(s).calls
    assert [(r.status, r.effect, r.attempts) for r in records] == [
        ("skipped", "unknown", 2),
        ("failed", "unknown", 1),
    ]
    resolved = retry.model_copy(update={"resolved": True, "fencing_token": 3, "attempt": 3})
    accept_outcome(s, resolved)  # settled by the reconciler: its word stands
    assert build_result(s).calls[0].effect == "not_executed"


@pytest.mark.parametrize("reverse", [False, True])
def test_failure_choice_base_exception_beats_error_beats_cancellation(reverse: bool) -> None:
    s = state(call("c0", 0), call("c1", 1), call("c2", 2), call("c3", 3))
    arrivals = [
        failure("c0", 0, "cancellation", "CancelledError"),
        failure("c1", 1, "error"),
        failure("c2", 2, "base_exception", "KeyboardInterrupt"),
        outcome("c3", 3),
    ]
    for o in reversed(arrivals) if reverse else arrivals:
        accept_outcome(s, o)
    assert turn_error(s) == TurnError(type="KeyboardInterrupt", message="boom c2", call_id="c2")
    assert outputs(s) == [("c3", "out-c3")]


@pytest.mark.parametrize("reverse", [False, True])
def test_failure_choice_ties_go_to_the_lowest_model_index(reverse: bool) -> None:
    s = state(call("c0", 0), call("c1", 1), call("c2", 2))
    arrivals = [failure("c2", 2), failure("c1", 1)]
    for o in reversed(arrivals) if reverse else arrivals:
        accept_outcome(s, o)
    error = turn_error(s)
    assert error is not None and error.call_id == "c1"


def test_sdk_exceptions_fail_the_turn_as_they_are_and_others_are_wrapped() -> None:
    s = state(call("c1", 0))
    accept_outcome(s, failure("c1", 0, type_="ToolInputGuardrailTripwireTriggered"))
    assert turn_error(s) == TurnError(
        type="ToolInputGuardrailTripwireTriggered", message="boom c1", call_id="c1"
    )


def test_tool_local_cancellation_follows_the_failure_policy() -> None:
    as_output = state(call("c1", 0))
    accept_outcome(as_output, outcome("c1", 0, "cancelled", output=SDK_ERROR_TEXT, error=CANCELLED))
    assert outputs(as_output) == [("c1", SDK_ERROR_TEXT)]
    fails = state(call("c1", 0), failure_policy="fail_turn")  # the executor flags fails_turn
    accept_outcome(fails, outcome("c1", 0, "cancelled", error=CANCELLED, fails_turn=True))
    assert build_result(fails).status == "failed"
    assert turn_error(fails) == TurnError(type="CancelledError", message="", call_id="c1")


def test_lost_worker_under_fail_turn_is_reported_not_failed() -> None:
    s = state(call("c1", 0, on_unknown="report_now"), failure_policy="fail_turn")
    lost = outcome("c1", 0, "failed", effect="unknown", resolved=False, output="unknown")
    accept_outcome(s, lost)
    assert (build_result(s).status, outputs(s)) == ("completed", [("c1", "unknown")])


# --- cancellation (item 12) ----------------------------------------------------------------
def test_parent_cancellation_is_never_turned_into_output() -> None:
    s = state(call("c1", 0), call("c2", 1), call("c3", 2), failure_policy="fail_turn")
    accept_outcome(s, outcome("c1", 0))
    accept_outcome(s, outcome("c2", 1, "cancelled", output="cancelled!", error=CANCELLED))
    s.cancelled = True
    assert is_settled(s)
    result = build_result(s)
    assert (result.status, result.error) == ("cancelled", None)
    assert [(o.call_id, o.output) for o in result.outputs] == [("c1", "out-c1")]
    assert [r.status for r in result.calls] == ["succeeded", "cancelled", "cancelled"]


# --- interruptions, tool choice, records (items 5, 16) -------------------------------------
def test_interruptions_come_from_the_plan_and_pending_approval_outcomes_in_model_order() -> None:
    s = state(call("c1", 0), call("c2", 1, "interrupt"), call("c3", 2))
    accept_outcome(s, outcome("c3", 2))
    accept_outcome(s, outcome("c1", 0, "pending_approval", effect="not_executed"))
    result = build_result(s)
    assert result.status == "interrupted"
    assert [(i.call_id, i.tool_name, i.arguments) for i in result.interruptions] == [
        ("c1", "add", '{"n": 0}'),
        ("c2", "add", '{"n": 1}'),
    ]
    assert [o.call_id for o in result.outputs] == ["c3"]


def test_next_tool_choice_is_auto_when_the_agent_used_a_tool_and_resets_tool_choice() -> None:
    used = state(call("c1", 0, "reject", output="no"))
    assert build_result(used).next_tool_choice == "auto"
    kept = state(call("c1", 0, "reject", output="no"), reset_tool_choice=False)
    assert build_result(kept).next_tool_choice is None
    assert build_result(state()).next_tool_choice is None


def test_call_records_carry_status_effect_attempts_and_timings_in_model_order() -> None:
    s = state(call("c1", 0), call("c2", 1))
    accept_outcome(s, outcome("c2", 1, attempt=2, fencing_token=2))
    accept_outcome(s, outcome("c1", 0))
    records = [
        (r.status, r.effect, r.attempts, r.started_at, r.finished_at) for r in build_result(s).calls
    ]
    assert records == [
        ("succeeded", "applied", 1, 10.0, 20.0),
        ("succeeded", "applied", 2, 11.0, 21.0),
    ]


def test_turn_result_identifies_the_turn() -> None:
    result = build_result(state(call("c1", 0, "interrupt")))
    assert (result.tenant_id, result.run_id, result.turn_id) == ("t1", "r1", 7)
