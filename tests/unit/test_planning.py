"""Planner decision logic: one test per rule (SDK lifecycle items 1-5, 9, 15, 17)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from kernel.rules.texts import unknown_outcome_text
from planner import (
    DEFAULT_REJECTION_MESSAGE,
    EMPTY_CALL_ID,
    REUSED_COMPLETED,
    REUSED_IN_FLIGHT,
    REUSED_IN_RESPONSE,
    ApprovalView,
    Decision,
    FailurePolicy,
    LedgerView,
    PlanResult,
    fingerprint,
    idempotency_key,
    lookup_key,
    next_to_release,
    parse_arguments,
    plan_turn,
)
from schemas import FunctionCallItem, ModelResponseEvent, PlannedCall, ToolSpec

NOW = 1_700_000_000.0
MBE = "ModelBehaviorError"
A1 = '{"a": 1}'


def tool(name: str = "add", **fields: Any) -> ToolSpec:
    return ToolSpec(name=name, pool=fields.pop("pool", "default"), parameters={}, **fields)


TOOLS = {t.lookup_key: t for t in (tool("add"), tool("mul"), tool("sub"))}


def gated(needs_approval: str, name: str = "add") -> dict[str, ToolSpec]:
    return {name: tool(name, needs_approval=needs_approval)}


def fc(call_id: str, name: str = "add", args: str = A1, **extra: Any) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": args, **extra}


def event(*items: dict[str, Any], resume: bool = False, **config: Any) -> ModelResponseEvent:
    return ModelResponseEvent.model_validate(
        {"tenant_id": "t1", "run_id": "r1", "turn_id": 3, "agent": {"name": "assistant"},
         "response_id": "resp_1", "items": list(items), "config": config, "resume": resume}
    )  # fmt: skip


def plan(ev: ModelResponseEvent, **given: Any) -> PlanResult:
    """plan_turn with the default registry, an empty ledger and no decisions unless given."""
    defaults: dict[str, Any] = {"tools": TOOLS, "ledger": {}, "approvals": ApprovalView()}
    return plan_turn(ev, now=NOW, **{**defaults, **given})


def kinds(result: PlanResult) -> list[str]:
    return [c.disposition for c in result.plan.calls]


def sent(result: PlanResult) -> list[tuple[str, bool]]:
    return [(d.call.call_id, d.approved) for d in result.dispatch]


def entry(call_id: str, state: str, args: str = A1, name: str = "add", **f: Any) -> LedgerView:
    return LedgerView(call_id, fingerprint(name, args), state, **f)  # type: ignore[arg-type]


def per_call(**decisions: Decision) -> ApprovalView:
    return ApprovalView(per_call=decisions)


def assert_turn_error(result: PlanResult, message: str, call_id: str | None = None) -> None:
    error = result.plan.error
    assert error is not None
    assert (error.type, error.message, error.call_id) == (MBE, message, call_id)
    assert result.failed
    assert result.dispatch == [] and result.ledger_updates == [] and result.plan.calls == []


# --- identity ------------------------------------------------------------------------------
def test_fingerprint_ignores_whitespace_and_key_order() -> None:
    assert fingerprint("add", '{"a": 1, "b": [1, 2]}') == fingerprint("add", '{"b":[1,2],"a":1}')
    canonical = json.dumps({"tool": "add", "arguments": {"é": 1}}, sort_keys=True,
                           separators=(",", ":"), ensure_ascii=False)  # fmt: skip
    assert fingerprint("add", '{"é": 1}') == hashlib.sha256(canonical.encode()).hexdigest()


def test_fingerprint_depends_on_tool_and_argument_values() -> None:
    others = {fingerprint("mul", A1), fingerprint("add", '{"a": 2}'), fingerprint("ns.add", A1)}
    assert fingerprint("add", A1) not in others


def test_fingerprint_of_unparseable_arguments_uses_the_raw_string() -> None:
    assert fingerprint("add", "{a: 1") == fingerprint("add", "{a: 1")
    assert fingerprint("add", "{a: 1") != fingerprint("add", "{a:  1")
    assert fingerprint("add", '"x"') != fingerprint("add", "x")  # parsed vs raw never collide


def test_idempotency_key_is_stable_per_call_and_never_per_attempt() -> None:
    fp = fingerprint("add", A1)
    key = idempotency_key("t1", "r1", "c1", fp)
    assert key == idempotency_key("t1", "r1", "c1", fp) and key.startswith("tf-")
    others = {idempotency_key("t2", "r1", "c1", fp), idempotency_key("t1", "r1", "c2", fp)}
    assert len({key, *others}) == 3


def test_two_runs_calling_call_0_alike_get_two_idempotency_keys() -> None:
    """Found by the simulator (seed 116): identity is scoped to the run, but the key was not:
    two runs of one tenant each asking call_0 to charge 500 shared a key, so an upstream
    that dedupes on it would make one charge for both, and a probe of the second run would
    find the first run's charge."""
    fp = fingerprint("charge", '{"cents": 500}')
    assert idempotency_key("t1", "run-0", "call_0", fp) != idempotency_key(
        "t1", "run-1", "call_0", fp
    )
    # Scoped to the tenant, the run is not part of the identity: one key whatever the run.
    assert idempotency_key("t1", "", "call_0", fp) not in {
        idempotency_key("t1", "run-0", "call_0", fp),
        idempotency_key("t1", "run-1", "call_0", fp),
    }


def test_parse_arguments_returns_a_dict_only_for_json_objects() -> None:
    assert parse_arguments(A1) == {"a": 1}
    assert parse_arguments("[1]") is None and parse_arguments("{oops") is None


# --- validation of the whole response (items 1, 3) -----------------------------------------
def test_empty_call_id_fails_the_turn_before_any_dispatch() -> None:
    assert_turn_error(plan(event(fc("c1"), fc(""))), EMPTY_CALL_ID)


def test_same_id_same_fingerprint_in_one_response_runs_once() -> None:
    result = plan(event(fc("c1", args=A1), fc("c2", "mul"), fc("c1", args='{ "a":1 }')))
    assert [(c.call_id, c.index) for c in result.plan.calls] == [("c1", 0), ("c2", 1)]  # first
    assert sent(result) == [("c1", False), ("c2", False)]


def test_same_id_different_fingerprint_in_one_response_fails_the_turn() -> None:
    result = plan(event(fc("c1", args=A1), fc("c1", args='{"a": 2}')))
    assert_turn_error(result, REUSED_IN_RESPONSE, "c1")


def test_committed_id_same_fingerprint_reuses_committed_output() -> None:
    ledger = {"c1": entry("c1", "committed", output="2", status="succeeded", effect="applied")}
    result = plan(event(fc("c1"), fc("c2")), ledger=ledger)
    assert kinds(result) == ["reuse", "dispatch"]
    reused = result.plan.calls[0]
    assert (reused.output, reused.status, reused.effect) == ("2", "succeeded", "applied")
    assert sent(result) == [("c2", False)]
    assert [u.call.call_id for u in result.ledger_updates] == ["c2"]


def test_a_committed_call_the_reconciler_has_not_settled_is_reused_as_unknown() -> None:
    """Its retry did nothing (not executed), the attempt before it may have applied: the model
    was told the effect is unknown, and a resumed turn tells it the same."""
    ledger = {
        "c1": entry("c1", "committed", output="x", status="failed", effect="not_executed",
                    resolved=False),
    }  # fmt: skip
    reused = plan(event(fc("c1")), ledger=ledger).plan.calls[0]
    assert (reused.disposition, reused.status, reused.effect) == ("reuse", "failed", "unknown")
    assert reused.output == unknown_outcome_text(TOOLS["add"])


def test_committed_id_different_fingerprint_fails_the_turn() -> None:
    ledger = {"c1": entry("c1", "committed", args='{"a": 9}', output="10")}
    assert_turn_error(plan(event(fc("c2"), fc("c1")), ledger=ledger), REUSED_COMPLETED, "c1")


@pytest.mark.parametrize("state", ["started", "deferred", "finished"])
def test_in_flight_id_same_fingerprint_attaches_without_second_execution(state: str) -> None:
    result = plan(event(fc("c1")), ledger={"c1": entry("c1", state)})
    assert kinds(result) == ["attach"]
    assert result.dispatch == [] and result.ledger_updates == []


@pytest.mark.parametrize("state", ["planned", "dispatched", "started", "finished"])
def test_in_flight_id_different_fingerprint_fails_the_turn(state: str) -> None:
    result = plan(event(fc("c1", args='{"a": 2}')), ledger={"c1": entry("c1", state)})
    assert_turn_error(result, REUSED_IN_FLIGHT, "c1")


@pytest.mark.parametrize("state", ["planned", "dispatched"])
def test_planned_or_dispatched_call_is_sent_again_with_the_same_idempotency_key(state: str) -> None:
    # Its command may have been lost; the ledger's dispatch is idempotent and begin admits one.
    result = plan(event(fc("c1")), ledger={"c1": entry("c1", state)})
    assert kinds(result) == ["dispatch"] and not result.ledger_updates[0].create
    expected = idempotency_key("t1", "r1", "c1", fingerprint("add", A1))
    assert result.dispatch[0].idempotency_key == expected


def test_whole_response_is_validated_first_and_the_first_problem_in_model_order_wins() -> None:
    result = plan(event(fc("c1", "nope"), fc("c2"), fc("c2", args="{}")))
    assert_turn_error(result, REUSED_IN_RESPONSE, "c2")  # identity before the missing tool
    ledger = {"c1": entry("c1", "committed", args="{}", output="x")}
    assert_turn_error(plan(event(fc("c1"), fc("")), ledger=ledger), REUSED_COMPLETED, "c1")


# --- tool lookup (item 15) -----------------------------------------------------------------
def test_missing_tool_with_raise_error_fails_the_turn() -> None:
    result = plan(event(fc("c1"), fc("c2", "nope")))
    assert_turn_error(result, "Tool nope not found in agent assistant", "c2")


def test_tools_are_looked_up_and_named_by_namespace_dot_name() -> None:
    item = FunctionCallItem(call_id="c", name="add", arguments="{}", namespace="math")
    assert lookup_key(item) == "math.add"
    assert lookup_key(item.model_copy(update={"namespace": None})) == "add"
    ns_tool = tool("add", namespace="math", pool="gpu")
    result = plan(event(fc("c1", "add", namespace="math")), tools={ns_tool.lookup_key: ns_tool})
    assert (result.plan.calls[0].tool_name, result.dispatch[0].call.pool) == ("math.add", "gpu")
    missing = plan(event(fc("c1", "nope", namespace="ns")))
    assert_turn_error(missing, "Tool ns.nope not found in agent assistant", "c1")


def test_missing_tool_with_return_error_to_model_outputs_not_found_in_model_order() -> None:
    ev = event(fc("c1"), fc("c2", "nope"), fc("c3", "mul"), tool_not_found="return_error_to_model")
    result = plan(ev)
    assert kinds(result) == ["dispatch", "not_found", "dispatch"]
    missing = result.plan.calls[1]
    text = "Tool 'nope' not found."
    assert (missing.output, missing.status, missing.effect) == (text, "failed", "not_executed")
    assert sent(result) == [("c1", False), ("c3", False)]
    assert result.ledger_updates[1].call.output == text  # committed now: nothing will run


def test_missing_tool_is_not_needed_for_a_committed_call() -> None:
    ledger = {"c1": entry("c1", "committed", name="gone", output="ok")}
    assert kinds(plan(event(fc("c1", "gone")), ledger=ledger)) == ["reuse"]


def test_disabled_tool_fails_the_turn_before_siblings_start_if_the_call_would_run() -> None:
    tools = {**TOOLS, "mul": tool("mul", enabled=False, needs_approval="always")}
    assert kinds(plan(event(fc("c1"), fc("c2", "mul")), tools=tools)) == ["dispatch", "interrupt"]
    result = plan(
        event(fc("c1"), fc("c2", "mul")), tools=tools, approvals=per_call(c2=Decision(True))
    )
    assert_turn_error(result, "Tool mul is currently disabled for agent assistant.", "c2")


# --- approval partition (item 5) -----------------------------------------------------------
def test_tool_that_never_needs_approval_is_dispatched_unapproved() -> None:
    (d,) = plan(event(fc("c1"))).dispatch
    assert (d.approved, d.call.pool, d.call.effect_class) == (False, "default", "non_idempotent")


def test_tool_that_always_needs_approval_is_interrupted_without_a_command() -> None:
    result = plan(event(fc("c1"), fc("c2", "mul")), tools={**TOOLS, **gated("always", "mul")})
    assert kinds(result) == ["dispatch", "interrupt"]
    assert [c.call_id for c in result.interruptions] == ["c2"]
    assert sent(result) == [("c1", False)]
    updates = [(u.call.call_id, u.pending_approval, u.create) for u in result.ledger_updates]
    assert updates == [("c1", False, True), ("c2", True, True)]


def test_irreversible_tool_that_opted_out_of_approval_is_dispatched() -> None:
    # The registry publishes irreversible tools as needs_approval="always" by default
    # (tests/unit/test_tool_api.py); a published "never" is the author's explicit opt-out.
    result = plan(event(fc("c1")), tools={"add": tool(effect_class="irreversible")})
    assert kinds(result) == ["dispatch"]


def test_callable_approval_is_dispatched_for_the_worker_to_evaluate() -> None:
    assert sent(plan(event(fc("c1")), tools=gated("callable"))) == [("c1", False)]


def test_callable_approval_with_unparseable_arguments_fails_closed() -> None:
    assert kinds(plan(event(fc("c1", args="{oops")), tools=gated("callable"))) == ["interrupt"]


def test_a_runtimes_policy_outcome_dispatches_pre_approved_so_the_worker_never_asks() -> None:
    # A signed by_policy decision: the runtime evaluated the tool's callable policy (even on
    # arguments the planner cannot parse) and it asked no one.
    ev = event(fc("c1"), fc("c2", args="{oops"))
    result = plan(ev, tools=gated("callable"), unasked={"c1", "c2"})
    assert sent(result) == [("c1", True), ("c2", True)]
    assert [u.approval for u in result.ledger_updates] == [None, None]  # no person decided


def test_a_runtimes_policy_outcome_does_not_pass_the_fleets_own_gate_or_a_hold() -> None:
    gate = plan(event(fc("c1")), tools=gated("always"), unasked={"c1"})
    assert (kinds(gate), sent(gate)) == (["interrupt"], [])
    held = plan(event(fc("c1")), tools=gated("callable"), unasked={"c1"}, held={"c0"})
    assert (kinds(held), sent(held)) == (["interrupt"], [])
    assert held.plan.calls[0].reason is not None  # held for a person: not an approval question


def test_pre_approval_guardrails_send_an_approval_gated_call_to_the_worker_first() -> None:
    result = plan(event(fc("c1"), pre_approval_guardrails=True), tools=gated("always"))
    # "always": the worker runs input guardrails, then reports pending_approval itself.
    assert kinds(result) == ["dispatch"]
    assert sent(result) == [("c1", False)]


def test_per_call_approval_dispatches_approved_without_asking_again() -> None:
    result = plan(event(fc("c1")), tools=gated("always"), approvals=per_call(c1=Decision(True)))
    assert sent(result) == [("c1", True)]
    assert result.ledger_updates[0].approval == "approved"


def test_ledger_decision_comes_before_the_approval_state() -> None:
    ledger = {"c1": entry("c1", "planned", approval="rejected", approval_message="no")}
    approvals = per_call(c1=Decision(True))
    result = plan(event(fc("c1")), ledger=ledger, approvals=approvals, tools=gated("always"))
    assert kinds(result) == ["reject"] and result.plan.calls[0].output == "no"


def test_per_call_decision_comes_before_the_sticky_decision() -> None:
    approvals = ApprovalView({"c1": Decision(True)}, sticky={"add": Decision(False, "never")})
    result = plan(event(fc("c1"), fc("c2")), approvals=approvals)
    assert kinds(result) == ["dispatch", "reject"]
    assert result.plan.calls[1].output == "never"


def test_sticky_always_approve_dispatches_approved() -> None:
    approvals = ApprovalView(sticky={"add": Decision(True)})
    assert sent(plan(event(fc("c1")), tools=gated("always"), approvals=approvals)) == [("c1", True)]


def test_rejection_output_is_rejected_and_not_executed_and_committed_now() -> None:
    result = plan(event(fc("c1")), approvals=per_call(c1=Decision(False)))
    r = result.plan.calls[0]
    assert (r.disposition, r.status, r.effect) == ("reject", "rejected", "not_executed")
    assert r.output == DEFAULT_REJECTION_MESSAGE == "Tool execution was not approved."
    (update,) = result.ledger_updates
    assert (update.approval, update.call.output) == ("rejected", DEFAULT_REJECTION_MESSAGE)


@pytest.mark.parametrize(
    ("call_decision", "sticky", "expected"),
    [
        (Decision(False, "per call"), Decision(False, "sticky"), "per call"),
        (Decision(False), Decision(False, "sticky"), "sticky"),
        (None, Decision(False, "sticky"), "sticky"),
        (None, Decision(False), DEFAULT_REJECTION_MESSAGE),
        (Decision(False), None, DEFAULT_REJECTION_MESSAGE),
    ],
)
def test_rejection_message_priority_per_call_then_sticky_then_default(
    call_decision: Decision | None, sticky: Decision | None, expected: str
) -> None:
    approvals = ApprovalView({"c1": call_decision} if call_decision else {},
                             {"add": sticky} if sticky else {})  # fmt: skip
    assert plan(event(fc("c1")), approvals=approvals).plan.calls[0].output == expected


def test_pending_approval_without_decision_is_interrupted_again_never_re_asked() -> None:
    # A callable checker already answered "ask" on the worker: do not send it there again.
    ledger = {"c1": entry("c1", "dispatched", pending_approval=True)}
    result = plan(event(fc("c1")), tools=gated("callable"), ledger=ledger)
    assert kinds(result) == ["interrupt"] and result.dispatch == []
    assert not result.ledger_updates[0].create


def test_call_the_worker_reported_pending_is_sent_approved_once_decided() -> None:
    # The ledger records the decision when it arrives; the call is still "dispatched".
    ledger = {"c1": entry("c1", "dispatched", approval="approved")}
    assert sent(plan(event(fc("c1")), tools=gated("callable"), ledger=ledger)) == [("c1", True)]


# --- resume (item 17) ----------------------------------------------------------------------
def test_resume_checks_the_ledger_first_for_every_call() -> None:
    tools = {name: tool(name, needs_approval="always") for name in ("add", "mul", "sub", "div")}
    tools["pow"] = tool("pow")
    items = [fc("c1"), fc("c2", "mul"), fc("c3", "sub"), fc("c4", "div"), fc("c5", "pow")]
    ledger = {
        "c1": entry("c1", "committed", output="done"),
        "c2": entry("c2", "planned", name="mul", pending_approval=True),
        "c3": entry("c3", "planned", name="sub", pending_approval=True),
        "c4": entry("c4", "planned", name="div", pending_approval=True),
        "c5": entry("c5", "planned", name="pow"),
    }
    approvals = per_call(c2=Decision(True), c3=Decision(False, "nope"))
    result = plan(event(*items, resume=True), tools=tools, ledger=ledger, approvals=approvals)
    # existing output; approved; rejected; unresolved: asked again; never needed approval
    assert kinds(result) == ["reuse", "dispatch", "reject", "interrupt", "dispatch"]
    assert sent(result) == [("c2", True), ("c5", False)]
    assert result.plan.calls[2].output == "nope"


def test_resume_attaches_to_a_call_approved_and_already_running() -> None:
    ledger = {"c1": entry("c1", "started", pending_approval=True, approval="approved")}
    assert kinds(plan(event(fc("c1"), resume=True), ledger=ledger)) == ["attach"]


def test_plan_carries_the_turn_identity_and_config() -> None:
    message = {"type": "message", "role": "assistant", "content": []}
    ev = event(fc("c1"), message, fc("c2"), max_concurrency=2)
    p = plan_turn(ev, tools=TOOLS, ledger={}, approvals=ApprovalView(), now=NOW, epoch=1).plan
    identity = (p.tenant_id, p.run_id, p.turn_id, p.response_id, p.agent_name)
    assert identity == ("t1", "r1", 3, "resp_1", "assistant")
    assert (p.epoch, p.planned_at, p.config.max_concurrency, p.error) == (1, NOW, 2, None)
    assert [c.index for c in p.calls] == [0, 1]  # position among function calls only


# --- release order (item 9) ----------------------------------------------------------------

KINDS = ["dispatch", "interrupt", "dispatch", "attach", "dispatch"]
CALLS = [
    PlannedCall(call_id="abcde"[i], tool_name="add", index=i, arguments="{}", disposition=d)
    for i, d in enumerate(KINDS)
]


def release(
    running: set[str], done: set[str], limit: int | None, failed: bool = False,
    policy: FailurePolicy = "fail_turn",
) -> list[str]:  # fmt: skip
    return next_to_release(CALLS, running, done, limit=limit, failed=failed, policy=policy)


def test_release_starts_dispatch_calls_in_model_order_up_to_the_limit() -> None:
    assert release(set(), set(), 2) == ["a", "c"]
    assert release({"a", "c"}, set(), 2) == []
    assert release({"a", "c"}, {"a"}, 2) == ["e"]
    assert release({"a"}, set(), None) == ["c", "e"]  # no limit: every queued call


def test_release_starts_nothing_new_after_a_failure_only_under_fail_turn() -> None:
    assert release({"c"}, {"a"}, None, failed=True) == []
    assert release(set(), {"a"}, 1, failed=True, policy="error_as_output") == ["c"]
