"""``examples/customer_service/main.py``: the SDK's airline conversation (handoffs between
three agents, a tool that writes the run's context) on FleetRunner as in-process.

main() reads the customer's messages with ``input()`` until the input ends (here: three
messages, then EOFError, as when the user presses Ctrl-D). One scripted model plays every
agent, in the conversation's order. The seat booking handoff draws a random flight number: the
example's ``random`` is given a seeded generator of its own so both runs draw the same one.
"""

from __future__ import annotations

import random
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

MESSAGES = ["How much baggage can I bring?", "I want to change my seat.", "ABC123, seat 14C."]


def script() -> ScriptedModel:
    """The model's side of the conversation, call by call, whichever agent makes the call."""
    return ScriptedModel(
        [
            # 1. Triage hands the baggage question to the FAQ agent, which looks it up.
            [function_call("transfer_to_faq_agent", {}, call_id="call-to-faq")],
            [
                function_call(
                    "faq_lookup_tool",
                    {"question": "How much baggage can I bring?"},
                    call_id="call-faq",
                )
            ],
            [assistant_message("You can bring one bag under 50 pounds.")],
            # 2. The FAQ agent hands back to triage, which hands to seat booking.
            [function_call("transfer_to_triage_agent", {}, call_id="call-to-triage")],
            [function_call("transfer_to_seat_booking_agent", {}, call_id="call-to-seat")],
            [assistant_message("What is your confirmation number, and which seat?")],
            # 3. Seat booking updates the seat: the tool writes the run's context.
            [
                function_call(
                    "update_seat",
                    {"confirmation_number": "ABC123", "new_seat": "14C"},
                    call_id="call-seat",
                )
            ],
            [assistant_message("Your seat is now 14C.")],
        ]
    )


async def test_customer_service_example_runs_on_fleet_runner_as_in_process(
    *,
    example: Callable[[str], ModuleType],
    fleet: InProcessFleet,
    worker_calls: list[tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    service = example("customer_service/main.py")
    agents = [service.triage_agent, service.faq_agent, service.seat_booking_agent]

    async def run(runner: InProcess | OnFleet) -> Observed:
        model = script()
        for agent in agents:
            agent.model = model
        monkeypatch.setattr(service, "random", random.Random(35))
        return await observe(
            service, runner, [model], service.main,
            monkeypatch=monkeypatch, capsys=capsys, replies=MESSAGES,
        )  # fmt: skip

    sdk = InProcess()
    in_process = await run(sdk)
    assert worker_calls == []  # the SDK's runner ran every tool body itself
    fleet_runner = OnFleet(fleet)
    on_fleet = await run(fleet_runner)

    # The example as the SDK runs it: three turns of the conversation, then the input ends;
    # the seat tool wrote the confirmation and seat into the context main() made.
    assert in_process.error == ("EOFError", "no more scripted input")
    assert len(in_process.outcomes) == 3
    flight = in_process.outcomes[2]["context"]["flight_number"]
    assert in_process.outcomes[2]["context"] == {
        "<model>": "AirlineAgentContext",
        "passenger_name": None,
        "confirmation_number": "ABC123",
        "seat_number": "14C",
        "flight_number": flight,
    }
    assert flight is not None and flight.startswith("FLT-")
    assert (
        "Seat Booking Agent: Tool call output: Updated seat to 14C for confirmation number ABC123"
        in in_process.stdout
    )
    # The same on FleetRunner: the tool saw the handoff's flight number and its changes to the
    # context reached the application's context; the next message went to the agent the
    # previous run ended with, the application's own object.
    assert_same_run(on_fleet, in_process)
    ended_with = [service.faq_agent, service.seat_booking_agent, service.seat_booking_agent]
    assert [id(a) for a in sdk.last_agents] == [id(a) for a in ended_with]
    assert [id(a) for a in fleet_runner.last_agents] == [id(a) for a in ended_with]
    assert worker_calls == [("faq_lookup_tool", "call-faq"), ("update_seat", "call-seat")]
