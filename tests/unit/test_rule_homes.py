"""Rules that several places used to decide each for itself, now decided by one function each
(docs/architecture.md section 7 names it): parent cancellation and turn failure, the arguments
an approval policy may judge, the timeout text, the ids a log line carries."""

from __future__ import annotations

from typing import Any

import pytest

from kernel.adapters.logs import ids_of
from kernel.rules.approvals import approval_arguments
from kernel.rules.effects import fails_turn, parent_cancellation
from kernel.rules.texts import TIMEOUT, timeout_text, unknown_outcome_text
from kernel.tools import ToolTimeoutError, default_tool_timeout_error_message
from schemas import ApprovalDecision, CallError, CallOutcome, CancelRequest, ToolSpec


def _outcome(**fields: Any) -> CallOutcome:
    base: dict[str, Any] = {
        "tenant_id": "t", "run_id": "r", "turn_id": 0, "call_id": "c", "tool_name": "x",
        "index": 0, "attempt": 1, "fencing_token": 1, "status": "cancelled", "effect": "unknown",
    }  # fmt: skip
    return CallOutcome(**(base | fields))


CANCELLATION = CallError(type="CancelledError", message="cancelled", severity="cancellation")
BASE_EXCEPTION = CallError(type="KeyboardInterrupt", message="", severity="base_exception")


def test_a_cancelled_call_of_a_cancelled_run_is_the_runs_cancellation() -> None:
    assert parent_cancellation(_outcome(error=CANCELLATION), run_cancelled=True)
    assert parent_cancellation(_outcome(error=None), run_cancelled=True)
    # The run is not cancelled: the call's own cancellation (a failure, by its policy).
    assert not parent_cancellation(_outcome(error=CANCELLATION), run_cancelled=False)
    # What the call raised itself meanwhile stays its failure.
    assert not parent_cancellation(_outcome(error=BASE_EXCEPTION), run_cancelled=True)
    assert not parent_cancellation(_outcome(status="failed"), run_cancelled=True)


def test_a_parent_cancellation_fails_no_turn_whatever_the_outcome_says() -> None:
    flagged = _outcome(error=CANCELLATION, fails_turn=True)
    assert fails_turn(flagged, "fail_turn")  # a tool-local cancellation, no failure handler
    assert not fails_turn(flagged, "fail_turn", run_cancelled=True)
    assert not fails_turn(flagged, "error_as_output", run_cancelled=True)
    # A definite failure under fail_turn still fails it, cancelled run or not.
    failed = _outcome(status="failed", effect="not_executed")
    assert fails_turn(failed, "fail_turn", run_cancelled=True)
    raised = _outcome(error=BASE_EXCEPTION, fails_turn=True)
    assert fails_turn(raised, "error_as_output", run_cancelled=True)


@pytest.mark.parametrize(
    "raw", ["", "  ", "{bad", "[]", "3", '"text"', "null", '{"n": NaN}', '{"n": -Infinity}']
)
def test_arguments_an_approval_policy_cannot_read_for_certain_fail_closed(raw: str) -> None:
    assert approval_arguments(raw) is None


def test_arguments_nested_deeper_than_the_parser_goes_fail_closed() -> None:
    assert approval_arguments('{"a": ' * 100_000 + "1" + "}" * 100_000) is None


def test_an_object_of_arguments_is_what_the_policy_sees() -> None:
    assert approval_arguments('{"amount": 5, "to": "bob"}') == {"amount": 5, "to": "bob"}
    assert approval_arguments("{}") == {}


def test_approval_arguments_read_as_the_sdks_do() -> None:
    from agents.util._approvals import parse_function_tool_arguments

    for raw in ["", " ", "{bad", "[]", "1", '{"n": NaN}', '{"n": Infinity}', '{"a": [1]}', "{}"]:
        assert approval_arguments(raw) == parse_function_tool_arguments(raw), raw


def test_the_timeout_text_is_one_text_wherever_it_is_worded() -> None:
    assert timeout_text("lookup", 2.5) == "Tool 'lookup' timed out after 2.5 seconds."
    assert timeout_text("lookup", 3.0) == TIMEOUT.format(name="lookup", seconds=3)
    assert default_tool_timeout_error_message(tool_name="lookup", timeout_seconds=2.5) == (
        timeout_text("lookup", 2.5)
    )
    assert str(ToolTimeoutError("lookup", 2.5)) == timeout_text("lookup", 2.5)
    spec = ToolSpec.model_validate(
        {"name": "lookup", "pool": "p", "parameters": {}, "on_unknown": "report_now",
         "timeout_s": 2.5}
    )  # fmt: skip
    assert unknown_outcome_text(spec) == timeout_text("lookup", 2.5)


def test_a_log_line_carries_the_ids_of_what_is_handled() -> None:
    outcome = _outcome(tenant_id="acme", run_id="r1", call_id="c1", tool_name="charge")
    assert ids_of(outcome) == {
        "tenant_id": "acme", "run_id": "r1", "call_id": "c1", "tool": "charge",
    }  # fmt: skip
    cancel = CancelRequest(tenant_id="acme", run_id="r1", reason="stop")
    assert ids_of(cancel) == {"tenant_id": "acme", "run_id": "r1", "call_id": None, "tool": None}
    decision = ApprovalDecision.model_validate(
        {"tenant_id": "acme", "run_id": "r1", "call_id": "c1", "tool_name": "refund",
         "approve": True, "decided_by": "ops"}
    )  # fmt: skip
    assert ids_of(decision)["tool"] == "refund"
    assert ids_of(object()) == {"tenant_id": None, "run_id": None, "call_id": None, "tool": None}
