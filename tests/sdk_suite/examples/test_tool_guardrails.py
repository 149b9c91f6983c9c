"""``examples/basic/tool_guardrails.py``: its four runs (a call that passes, one an input
guardrail rejects, one an output guardrail halts, one whose output is rejected) on
FleetRunner as in-process."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest
from agents.testing import ScriptedModel, assistant_message, function_call

from tests.sdk_suite.examples._differential import (
    InProcess,
    Observed,
    OnFleet,
    assert_same_run,
    observe,
)
from toolfleet.testing import InProcessFleet

pytestmark = [pytest.mark.integration, pytest.mark.agent_runtime]


def script() -> ScriptedModel:
    """The model's side of main()'s four runs, in order (the third ends in the tripwire)."""
    return ScriptedModel(
        [
            # 1. Normal email sending.
            [
                function_call(
                    "send_email",
                    {
                        "to": "john@example.com",
                        "subject": "Welcome",
                        "body": "Welcome to our service.",
                    },
                    call_id="call-welcome",
                )
            ],
            [assistant_message("I sent the welcome email to john@example.com.")],
            # 2. The input guardrail rejects the call (ACME); the model is told so.
            [
                function_call(
                    "send_email",
                    {
                        "to": "john@example.com",
                        "subject": "Introduction",
                        "body": "Introducing ACME corp.",
                    },
                    call_id="call-acme",
                )
            ],
            [assistant_message("I can't send an email that mentions ACME.")],
            # 3. The output guardrail raises on the SSN: the run ends with the tripwire.
            [function_call("get_user_data", {"user_id": "user123"}, call_id="call-ssn")],
            # 4. The output guardrail rejects the phone number; the model is told so.
            [function_call("get_contact_info", {"user_id": "user456"}, call_id="call-phone")],
            [assistant_message("That contact info holds a phone number I can't share.")],
        ]
    )


async def test_tool_guardrails_example_runs_on_fleet_runner_as_in_process(
    *,
    example: Callable[[str], ModuleType],
    fleet: InProcessFleet,
    worker_calls: list[tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    guardrails = example("basic/tool_guardrails.py")

    async def run(runner: InProcess | OnFleet) -> Observed:
        model = guardrails.agent.model = script()
        return await observe(
            guardrails, runner, [model], guardrails.main, monkeypatch=monkeypatch, capsys=capsys
        )

    in_process = await run(InProcess())
    assert worker_calls == []  # the SDK's runner ran every tool body itself
    on_fleet = await run(OnFleet(fleet))

    # What the example shows, in-process: the second call never ran, the third run raised.
    assert "🚨 Output guardrail triggered: Execution halted for sensitive data" in (
        in_process.stdout
    )
    assert "Details: {'blocked_pattern': 'SSN', 'tool': 'get_user_data'}" in in_process.stdout
    assert in_process.outcomes[1]["tool_input_guardrails"] == [
        (
            "reject_sensitive_words",
            {"type": "reject_content", "message": "🚨 Tool call blocked: contains 'ACME'"},
            {"blocked_word": "ACME", "argument": "body"},
        )
    ]
    assert in_process.outcomes[2]["raised"] == "ToolOutputGuardrailTripwireTriggered"
    assert_same_run(on_fleet, in_process)
    # The bodies ran on the fleet's workers; the rejected call's never started.
    assert worker_calls == [
        ("send_email", "call-welcome"),
        ("get_user_data", "call-ssn"),
        ("get_contact_info", "call-phone"),
    ]
