"""kernel.rules.mcp: what the MCP front door tells a client (pure): tools with annotations
from their effect class, settled calls as results, and the run a call becomes."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kernel.rules.effects import mcp_effect_class
from kernel.rules.mcp import (
    IDEMPOTENCY_KEY_MAX,
    META_CALL,
    POLL_INTERVAL_MS,
    REPUBLISH_AFTER_S,
    TASK_TTL_DEFAULT_MS,
    TASK_TTL_MIN_MS,
    CallProgress,
    annotations_of,
    arguments_refusal,
    call_end_of_turn,
    call_fingerprint,
    call_id_of,
    call_tool_result,
    cancelled_result,
    created_task_result,
    idempotency_key_of,
    listed,
    related,
    republish_due,
    run_id_for,
    task_of,
    task_status,
    task_ttl_ms,
    tool_of,
    unknown_tool_result,
)
from schemas import CallError, CallOutcome, ToolSpec, TurnResult
from schemas.internal import EffectClass, TurnError
from schemas.outbound import CallRecord, FunctionCallOutput, Interruption


def _spec(effect_class: EffectClass = "read_only", **fields: Any) -> ToolSpec:
    base: dict[str, Any] = {
        "name": "lookup",
        "pool": "default",
        "description": "Looks something up.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        "effect_class": effect_class,
    }
    return ToolSpec(**(base | fields))


@pytest.mark.parametrize(
    ("effect_class", "hints"),
    [
        ("read_only", {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True}),
        ("idempotent", {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True}),
        ("non_idempotent",
         {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False}),
        ("irreversible", {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False}),
    ],
)  # fmt: skip
def test_annotations_say_every_hint_of_the_effect_class_outright(
    effect_class: EffectClass, hints: dict[str, bool]
) -> None:
    annotations = annotations_of(_spec(effect_class))
    assert annotations == {"title": "lookup", **hints}
    assert "openWorldHint" not in annotations  # the fleet does not know what a tool reaches


@pytest.mark.parametrize(
    ("declared", "read_back"),
    [
        ("read_only", "read_only"),
        ("idempotent", "idempotent"),
        ("non_idempotent", "non_idempotent"),
        ("irreversible", "non_idempotent"),  # MCP has no hint for "cannot be undone"
    ],
)
def test_the_annotations_read_back_as_the_declared_class(
    declared: EffectClass, read_back: str
) -> None:
    """What a worker would seed from the door's annotations (a fleet serving another fleet's
    door as an upstream MCP server) is the declared class, or the cautious one."""
    assert mcp_effect_class(annotations_of(_spec(declared))).effect_class == read_back


def test_a_tool_is_listed_by_its_lookup_key_with_schema_execution_and_meta() -> None:
    # As a worker publishes a gated tool: no probe, so every call needs approval.
    spec = _spec("non_idempotent", namespace="crm", version="3", needs_approval="always")
    tool = tool_of(spec)
    assert tool["name"] == "crm.lookup"
    assert tool["description"] == "Looks something up."
    assert tool["inputSchema"] == spec.parameters
    assert tool["annotations"]["title"] == "crm.lookup"
    assert tool["annotations"]["destructiveHint"] is True
    assert tool["execution"] == {"taskSupport": "optional"}
    assert tool["_meta"] == {
        "io.toolfleet/effect-class": "non_idempotent",
        "io.toolfleet/version": "3",
        "io.toolfleet/gated": True,  # every call waits for a person
    }
    probed = tool_of(_spec("non_idempotent", has_probe=True))
    assert probed["_meta"]["io.toolfleet/gated"] is False
    by_policy = tool_of(_spec("idempotent", needs_approval="callable"))
    assert by_policy["_meta"]["io.toolfleet/gated"] is True  # its policy may ask


def test_an_input_schema_is_always_an_object() -> None:
    assert tool_of(_spec(parameters={}))["inputSchema"] == {"type": "object", "properties": {}}
    schema = {"type": "object", "properties": {}, "additionalProperties": False}
    assert tool_of(_spec(parameters=schema))["inputSchema"] == schema


def test_only_enabled_tools_are_listed_in_name_order() -> None:
    specs = {
        "zeta": _spec(name="zeta"),
        "alpha": _spec(name="alpha"),
        "off": _spec(name="off", enabled=False),
    }
    assert [t["name"] for t in listed(specs)] == ["alpha", "zeta"]


CALL = call_id_of("mcp-1")
"""The door's call in run ``mcp-1`` (the run id itself)."""


def _outcome(**fields: Any) -> CallOutcome:
    base: dict[str, Any] = {
        "tenant_id": "acme", "run_id": "mcp-1", "turn_id": 0, "call_id": CALL,
        "tool_name": "lookup", "index": 0, "attempt": 1, "fencing_token": 1,
        "status": "succeeded", "effect": "applied", "output": "found it",
    }  # fmt: skip
    return CallOutcome(**(base | fields))


def test_a_succeeded_call_is_its_output_with_the_fleets_record_in_meta() -> None:
    assert call_tool_result(_outcome()) == {
        "content": [{"type": "text", "text": "found it"}],
        "isError": False,
        "_meta": {
            META_CALL: {
                "run_id": "mcp-1",
                "status": "succeeded",
                "effect": "applied",
                "attempts": 1,
                "resolved": True,
            }
        },
    }


@pytest.mark.parametrize(
    ("status", "effect"),
    [
        ("failed", "not_executed"),
        ("failed", "applied"),  # an error after the effect: the meta tells the truth
        ("timed_out", "unknown"),
        ("rejected", "not_executed"),
        ("cancelled", "unknown"),
        ("skipped", "not_executed"),
    ],
)
def test_anything_but_succeeded_is_an_error_result(status: str, effect: str) -> None:
    result = call_tool_result(
        _outcome(status=status, effect=effect, output="it broke", attempt=2, resolved=False)
    )
    assert result["isError"] is True
    assert result["content"] == [{"type": "text", "text": "it broke"}]
    assert result["_meta"][META_CALL] == {
        "run_id": "mcp-1", "status": status, "effect": effect, "attempts": 2, "resolved": False,
    }  # fmt: skip


def test_a_call_without_output_is_an_empty_text() -> None:
    assert call_tool_result(_outcome(output=None))["content"] == [{"type": "text", "text": ""}]


def test_an_unknown_tool_is_an_error_result_in_the_sdks_words() -> None:
    assert unknown_tool_result("nope") == {
        "content": [{"type": "text", "text": "Tool 'nope' not found."}],
        "isError": True,
    }


def _turn(**fields: Any) -> TurnResult:
    base: dict[str, Any] = {"tenant_id": "acme", "run_id": "mcp-1", "turn_id": 0,
                            "status": "completed"}  # fmt: skip
    return TurnResult(**(base | fields))


def test_a_completed_turn_ends_its_call_as_recorded() -> None:
    turn = _turn(
        outputs=[FunctionCallOutput(call_id=CALL, output="done")],
        calls=[CallRecord(call_id=CALL, tool_name="lookup", status="succeeded",
                          effect="applied", attempts=2)],
    )  # fmt: skip
    end = call_end_of_turn(turn, "lookup")
    assert (end.status, end.effect, end.output, end.attempt, end.resolved) == (
        "succeeded", "applied", "done", 2, True,
    )  # fmt: skip
    assert call_tool_result(end)["isError"] is False


def test_an_unknown_effect_from_a_turn_counts_as_unresolved() -> None:
    turn = _turn(
        outputs=[FunctionCallOutput(call_id=CALL, output="may have happened")],
        calls=[CallRecord(call_id=CALL, tool_name="lookup", status="timed_out",
                          effect="unknown", attempts=1)],
    )  # fmt: skip
    end = call_end_of_turn(turn, "lookup")
    assert (end.status, end.effect, end.resolved) == ("timed_out", "unknown", False)


def test_a_failed_call_without_output_says_its_error() -> None:
    turn = _turn(
        status="failed",
        calls=[CallRecord(call_id=CALL, tool_name="lookup", status="failed",
                          effect="not_executed", attempts=1,
                          error=CallError(type="ValueError", message="bad q"))],
    )  # fmt: skip
    assert call_end_of_turn(turn, "lookup").output == "bad q"


def test_a_turn_that_failed_before_its_call_reported_says_unknown() -> None:
    turn = _turn(status="failed", error=TurnError(type="TimeoutError", message="deadline"))
    end = call_end_of_turn(turn, "lookup")
    assert (end.status, end.effect, end.output, end.resolved) == (
        "failed", "unknown", "deadline", False,
    )  # fmt: skip


def test_a_call_waiting_for_approval_says_who_may_decide() -> None:
    turn = _turn(
        status="interrupted",
        interruptions=[Interruption(call_id=CALL, tool_name="pay", arguments="{}")],
    )
    end = call_end_of_turn(turn, "pay")
    result = call_tool_result(end)
    assert result["isError"] is True
    assert result["_meta"][META_CALL]["status"] == "pending_approval"
    assert result["_meta"][META_CALL]["effect"] == "not_executed"
    text = result["content"][0]["text"]
    assert "pay waits for approval" in text and "run mcp-1" in text
    assert "toolfleet approvals" in text


def test_a_call_without_key_is_a_fresh_run() -> None:
    first, second = run_id_for("acme", None), run_id_for("acme", None)
    assert re.fullmatch(r"mcp-[0-9a-f]{32}", first)
    assert first != second


def test_a_key_names_the_same_run_for_its_tenant_only() -> None:
    keyed = run_id_for("acme", "order-7")
    assert re.fullmatch(r"mcp-k-[0-9a-f]{32}", keyed)
    assert run_id_for("acme", "order-7") == keyed
    assert run_id_for("acme", "order-8") != keyed
    assert run_id_for("other", "order-7") != keyed
    # The separator keeps (tenant, key) pairs apart that would concatenate alike.
    assert run_id_for("a", "bc") != run_id_for("ab", "c")


@pytest.mark.parametrize("key", ["", "k" * (IDEMPOTENCY_KEY_MAX + 1)])
def test_a_key_too_short_or_too_long_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match="idempotency key"):
        run_id_for("acme", key)
    run_id_for("acme", "k" * IDEMPOTENCY_KEY_MAX)  # the longest allowed


# --- idempotency keys and tasks ----------------------------------------------------------------


def test_a_calls_fingerprint_is_its_tool_and_arguments_whatever_their_order() -> None:
    same = call_fingerprint("weather", {"city": "Oslo", "days": 2})
    assert same == call_fingerprint("weather", {"days": 2, "city": "Oslo"})
    assert same != call_fingerprint("weather", {"city": "Rome", "days": 2})
    assert same != call_fingerprint("forecast", {"city": "Oslo", "days": 2})
    assert call_fingerprint("weather", None) == call_fingerprint("weather", {})


def test_the_idempotency_key_is_read_from_meta_and_checked() -> None:
    assert idempotency_key_of(None) is None
    assert idempotency_key_of({"progressToken": 1}) is None
    assert idempotency_key_of({"io.toolfleet/idempotency-key": "k-1"}) == "k-1"
    for bad in ("", 7, "x" * (IDEMPOTENCY_KEY_MAX + 1)):
        with pytest.raises(ValueError, match="string of 1 to 256 characters"):
            idempotency_key_of({"io.toolfleet/idempotency-key": bad})


@pytest.mark.parametrize(
    ("requested", "retention_s", "expected"),
    [
        (None, 7 * 86400, TASK_TTL_DEFAULT_MS),
        (1_000, 7 * 86400, TASK_TTL_MIN_MS),  # at least a minute
        (30 * 86400 * 1000, 7 * 86400, 7 * 86400 * 1000),  # never past the ledger's retention
        (None, 3600, 3600 * 1000),
        (None, 0, None),  # the ledger keeps runs for ever, the client asked no limit
        (120_000, 0, 120_000),
    ],
)
def test_a_tasks_ttl_is_clamped_to_what_the_ledger_keeps(
    requested: int | None, retention_s: int, expected: int | None
) -> None:
    assert task_ttl_ms(requested, retention_s) == expected


def test_a_call_is_published_again_only_when_its_creator_left_it_unsubmitted() -> None:
    assert republish_due(submitted=False, has_entry=False, created_at=0.0, now=REPUBLISH_AFTER_S)
    assert not republish_due(submitted=False, has_entry=False, created_at=0.0, now=1.0)
    assert not republish_due(submitted=True, has_entry=False, created_at=0.0, now=99.0)
    assert not republish_due(submitted=False, has_entry=True, created_at=0.0, now=99.0)


@pytest.mark.parametrize(
    ("progress", "cancelled", "expected"),
    [
        (CallProgress(state=None), None, ("working", "queued")),
        (CallProgress(state="planned", pending_approval=True), None, "input_required"),
        (CallProgress(state="dispatched"), None, ("working", "waiting for a slot")),
        (CallProgress(state="started", attempts=2), None, ("working", "running (attempt 2)")),
        (CallProgress(state="deferred", attempts=1), None,
         ("working", "handed over to another system: waiting for its completion")),
        (
            CallProgress(
                state="finished",
                outcome=_outcome(status="timed_out", effect="unknown", resolved=False),
            ),
            None,
            ("working", "effect unknown: the reconciler is probing it (attempt 1)"),
        ),
        (CallProgress(state="committed", outcome=_outcome(), settled=True), None,
         ("completed", None)),
        (
            CallProgress(
                state="committed",
                outcome=_outcome(status="failed", effect="not_executed", output="boom"),
                settled=True,
            ),
            None,
            ("failed", "boom"),
        ),
        (CallProgress(state="committed", outcome=_outcome(), settled=True), "stop",
         ("cancelled", "stop")),
        (CallProgress(state="started"), "stop", ("cancelled", "stop")),
    ],
)  # fmt: skip
def test_a_tasks_status_follows_its_calls_ledger_entry(
    progress: CallProgress, cancelled: str | None, expected: Any
) -> None:
    status, message = task_status("book_trip", progress, cancelled_reason=cancelled)
    if isinstance(expected, str):
        assert status == expected
        assert message is not None and "waiting for approval of book_trip" in message
    else:
        assert (status, message) == expected


def test_a_task_says_when_to_poll_until_it_is_terminal() -> None:
    times = {"created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:01Z"}
    working = task_of("mcp-1", "working", "queued", ttl_ms=60_000, **times)
    assert working == {
        "taskId": "mcp-1", "status": "working", "statusMessage": "queued",
        "createdAt": "2026-01-01T00:00:00Z", "lastUpdatedAt": "2026-01-01T00:00:01Z",
        "ttl": 60_000, "pollInterval": POLL_INTERVAL_MS,
    }  # fmt: skip
    assert "pollInterval" not in task_of("mcp-1", "completed", None, ttl_ms=None, **times)
    created = created_task_result(working, "weather")
    assert created["task"] == working
    assert created["content"][0]["text"].startswith("weather runs as task mcp-1")


def test_a_cancelled_tasks_result_is_an_error_that_keeps_the_calls_effect() -> None:
    result = related(cancelled_result(_outcome(), "mcp-1", "stop"), "mcp-1")
    assert result["isError"] is True
    assert result["content"] == [{"type": "text", "text": "cancelled: stop"}]
    assert result["_meta"][META_CALL]["effect"] == "applied"  # cancelling is not undoing
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": "mcp-1"}
    never = cancelled_result(None, "mcp-2", "stop")
    assert never["_meta"][META_CALL]["effect"] == "not_executed"


def test_arguments_over_the_fleets_limits_are_refused_with_the_setting_to_raise() -> None:
    assert arguments_refusal('{"city": "Oslo"}', max_bytes=1024, max_depth=4) is None
    big = arguments_refusal('{"x": "' + "a" * 2000 + '"}', max_bytes=1024, max_depth=4)
    assert big == "arguments of 2009 bytes, more than TOOLFLEET_MAX_ARGUMENT_BYTES=1024"
    deep = arguments_refusal('{"a": {"b": {"c": {"d": {"e": 1}}}}}', max_bytes=1024, max_depth=4)
    assert deep == "arguments nested deeper than TOOLFLEET_MAX_JSON_DEPTH=4"


def test_each_door_call_has_a_call_id_of_its_own_in_every_identity_scope() -> None:
    # Under identity_scope="tenant" the ledger keys a call by tenant and call id alone: a
    # fixed call id would make every door call of a tenant the same call.
    assert call_id_of("mcp-1") != call_id_of("mcp-2")
