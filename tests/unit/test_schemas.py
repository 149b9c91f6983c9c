"""The wire contract: strict decoding, readable errors, Chat Completions normalisation."""

from __future__ import annotations

import json

import pytest

from kernel.errors import InvalidMessageError
from schemas import (
    CallError,
    CallOutcome,
    DeadLetter,
    FunctionCallItem,
    ModelResponseEvent,
    TurnResult,
)
from schemas.export import JSON_DIR, rendered_schemas

EVENT = {
    "tenant_id": "t1",
    "run_id": "r1",
    "turn_id": 0,
    "agent": {"name": "assistant"},
    "response_id": "resp_1",
    "items": [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "hi"}],
        },
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "add",
            "arguments": '{"a": 1}',
            "id": "fc_1",
        },
    ],
}


def test_model_response_parses_function_calls_and_carries_other_items_untouched() -> None:
    event = ModelResponseEvent.decode(json.dumps(EVENT))
    assert event.schema_version == 1
    assert isinstance(event.items[1], FunctionCallItem)
    assert event.items[0] == EVENT["items"][0]
    assert [c.call_id for c in event.function_calls] == ["c1"]
    again = ModelResponseEvent.decode(event.encode())
    assert again == event


def test_chat_completions_tool_calls_are_normalised_into_function_call_items() -> None:
    raw = {k: v for k, v in EVENT.items() if k != "items"}
    raw["tool_calls"] = [
        {"id": "call_a", "type": "function", "function": {"name": "add", "arguments": "{}"}},
        {"id": "call_b", "type": "function", "function": {"name": "mul", "arguments": '{"x":2}'}},
    ]
    event = ModelResponseEvent.model_validate(raw)
    assert [(c.call_id, c.name, c.arguments) for c in event.function_calls] == [
        ("call_a", "add", "{}"),
        ("call_b", "mul", '{"x":2}'),
    ]


def test_malformed_tool_calls_say_what_shape_is_expected() -> None:
    raw = {k: v for k, v in EVENT.items() if k != "items"} | {"tool_calls": [{"id": "x"}]}
    with pytest.raises(InvalidMessageError, match=r"tool_calls\[0\] must look like"):
        ModelResponseEvent.decode(json.dumps(raw))


def test_errors_name_the_field_and_the_reason() -> None:
    bad = dict(
        EVENT, turn_id=-1, items=[{"type": "function_call", "call_id": "c1", "arguments": "{}"}]
    )
    with pytest.raises(InvalidMessageError) as info:
        ModelResponseEvent.decode(json.dumps(bad))
    assert "turn_id: Input should be greater than or equal to 0" in info.value.reason
    assert "items.0.function_call.name: Field required" in info.value.reason


def test_unknown_fields_are_rejected() -> None:
    with pytest.raises(InvalidMessageError, match="surprise: Extra inputs are not permitted"):
        ModelResponseEvent.decode(json.dumps(dict(EVENT, surprise=1)))


def test_unknown_schema_version_is_rejected_with_advice() -> None:
    with pytest.raises(InvalidMessageError, match=r"unsupported schema_version 2.*re-publish"):
        ModelResponseEvent.decode(json.dumps(dict(EVENT, schema_version=2)))


@pytest.mark.parametrize(
    ("field", "value"),
    [("schema_version", True), ("schema_version", 1.0), ("schema_version", "1"),
     ("turn_id", "7"), ("turn_id", True), ("turn_id", 7.0), ("resume", "yes"), ("resume", 1)],
)  # fmt: skip
def test_nothing_is_coerced_into_versions_numbers_or_flags(field: str, value: object) -> None:
    with pytest.raises(InvalidMessageError, match=field):
        ModelResponseEvent.decode(json.dumps(dict(EVENT, **{field: value})))
    config = dict(EVENT, config={"pre_approval_guardrails": "true"})
    with pytest.raises(InvalidMessageError, match="pre_approval_guardrails"):
        ModelResponseEvent.decode(json.dumps(config))


def test_error_messages_are_cut_to_a_bound() -> None:
    error = CallError(type="ModelBehaviorError", message="x" * 2_000_000)
    assert len(error.message.encode()) <= 4_096 and error.message.endswith("more bytes cut]")


def test_invalid_json_is_reported_as_such() -> None:
    with pytest.raises(InvalidMessageError, match="not valid JSON"):
        ModelResponseEvent.decode(b"\xff{not json")


def test_max_concurrency_below_one_is_rejected() -> None:
    bad = dict(EVENT, config={"max_concurrency": 0})
    with pytest.raises(InvalidMessageError, match=r"config\.max_concurrency"):
        ModelResponseEvent.decode(json.dumps(bad))


def test_outcome_requires_status_and_effect() -> None:
    with pytest.raises(InvalidMessageError, match="effect: Field required"):
        CallOutcome.decode(
            json.dumps(
                {
                    "tenant_id": "t",
                    "run_id": "r",
                    "turn_id": 0,
                    "call_id": "c",
                    "tool_name": "x",
                    "index": 0,
                    "attempt": 1,
                    "fencing_token": 1,
                    "status": "timed_out",
                }
            )
        )


def test_dead_letter_keeps_original_bytes_round_trip() -> None:
    letter = DeadLetter(
        original_topic="toolfleet.model-responses",
        partition=3,
        offset=42,
        key=b"run-1",
        value=b"\xff\x00not json",
        reason="invalid ModelResponseEvent: <message>: not valid JSON",
        service="planner",
        dead_lettered_at=1.0,
    )
    assert DeadLetter.model_validate_json(letter.model_dump_json()).value == b"\xff\x00not json"


def test_turn_result_outputs_can_be_fed_back_to_the_model_as_they_are() -> None:
    result = TurnResult(
        tenant_id="t",
        run_id="r",
        turn_id=0,
        status="completed",
        outputs=[{"call_id": "c1", "output": "3"}],  # type: ignore[list-item]
    )
    assert result.model_dump()["outputs"] == [
        {"type": "function_call_output", "call_id": "c1", "output": "3"}
    ]


def test_exported_json_schemas_are_up_to_date() -> None:
    expected = rendered_schemas()
    on_disk = {p.name: p.read_text() for p in JSON_DIR.glob("*.json")}
    assert on_disk == expected, "schemas/json is stale: run `python -m schemas.export`"
