"""FleetRunner on a test fleet shared by many tests: defects the SDK's own suite found.

Each is reproduced here as the Agents SDK's tests (tests/sdk_suite) meet it: one
``InProcessFleet`` for the module, as a harness's session fixture starts one, a new
``FleetRunner`` per test, tools defined inside each test under names other tests reuse, so
what one test leaves on the fleet must not reach the next. Real Kafka, Redis and the fleet's
services.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents import Agent, RunContextWrapper, function_tool
from agents.items import ToolApprovalItem
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tracing import set_tracing_disabled

from kernel.settings import Settings
from toolfleet.agents import FleetRunner
from toolfleet.testing import InProcessFleet

pytestmark = [pytest.mark.integration, pytest.mark.layout_free, pytest.mark.agent_runtime]

set_tracing_disabled(True)

TENANT = "test-fleet"


@pytest.fixture(scope="module")
async def fleet(settings: Settings) -> AsyncIterator[InProcessFleet]:
    """One fleet for the module, as a harness's conftest starts one per session."""
    async with InProcessFleet(settings, auto_serve=True) as running:
        yield running


def script(call_id: str) -> ScriptedModel:
    """A model that calls ``second_tool`` once, then answers."""
    return ScriptedModel(
        [[function_call("second_tool", {}, call_id=call_id)], [assistant_message("done")]]
    )


def outputs(result: Any) -> list[Any]:
    return [item.output for item in result.new_items if item.type == "tool_call_output_item"]


async def test_a_reused_name_is_gated_by_the_object_the_run_calls_not_an_earlier_one(
    fleet: InProcessFleet,
) -> None:
    # An earlier test's tool of the name asks a person for every call: the fleet serves it.
    @function_tool(name_override="second_tool", needs_approval=True)
    def earlier() -> str:
        """The earlier test's body."""
        return "earlier"

    runner = FleetRunner(fleet.client, tenant_id=TENANT)
    agent = Agent(name="a", model=script("c1"), tools=[earlier])
    held = await runner.run(agent, "go")
    assert [i.name for i in held.interruptions] == ["second_tool"] and outputs(held) == []
    state = held.to_state()
    state.approve(held.interruptions[0])
    approved = await runner.run(agent, state)  # the approved call runs on the fleet: served
    assert outputs(approved) == ["earlier"]
    assert fleet.served("second_tool").function_tool is earlier  # type: ignore[attr-defined]

    # This test's tool of the same name asks nobody: it runs, with no interruption, although
    # the fleet's registry still names the earlier object's gate when the run starts.
    ran: list[str] = []

    @function_tool(name_override="second_tool")
    def current() -> str:
        """This test's body."""
        ran.append("current")
        return "second tool result"

    runner = FleetRunner(fleet.client, tenant_id=TENANT)
    result = await runner.run(Agent(name="a", model=script("c1"), tools=[current]), "go")

    assert result.interruptions == [] and result.final_output == "done"
    assert outputs(result) == ["second tool result"] and ran == ["current"]
    assert fleet.served("second_tool").function_tool is current  # type: ignore[attr-defined]


async def test_the_release_gate_of_the_object_served_with_fleet_options_still_asks(
    fleet: InProcessFleet,
) -> None:
    """The other way round: an object the fleet gates (an irreversible effect, declared when
    serving it) under a name an earlier object ran unattended is asked about, the SDK's way."""
    ran: list[str] = []

    @function_tool(name_override="second_tool")
    def wire_money() -> str:
        """Sends money: irreversible."""
        ran.append("wired")
        return "sent"

    await fleet.serve(wire_money, effect="irreversible")
    runner = FleetRunner(fleet.client, tenant_id=TENANT)
    agent = Agent(name="a", model=script("c2"), tools=[wire_money])
    held = await runner.run(agent, "go")

    assert [i.name for i in held.interruptions] == ["second_tool"] and ran == []
    state = held.to_state()
    state.approve(held.interruptions[0])
    result = await runner.run(agent, state)
    assert outputs(result) == ["sent"] and ran == ["wired"]


async def test_an_approval_the_sdk_scopes_to_the_agent_runs_the_call(
    fleet: InProcessFleet,
) -> None:
    """The context holds another agent's approval of a same-named tool: the SDK asks again
    for this agent's tool, and the person's approval of it (scoped to this agent, which a
    lookup by tool name alone cannot tell apart) lets the call run on the fleet."""
    executed: list[str] = []

    @function_tool(name_override="operate", needs_approval=True)
    def low_privilege() -> str:
        """Another agent's capability."""
        return "public data"

    @function_tool(name_override="operate", needs_approval=True)
    def privileged() -> str:
        """This agent's capability."""
        executed.append("privileged")
        return "private data"

    source = Agent(name="owner", tools=[low_privilege])
    context: RunContextWrapper[dict[str, str]] = RunContextWrapper(context={"tenant": "t"})
    call = function_call("operate", {}, call_id="approved")
    context.approve_tool(ToolApprovalItem(agent=source, raw_item=call))
    model = ScriptedModel([[function_call("operate", {}, call_id="approved")],
                           [assistant_message("done")]])  # fmt: skip
    configured = Agent(name="owner", tools=[privileged], model=model)
    runner = FleetRunner(fleet.client, tenant_id=TENANT)

    held = await runner.run(configured, "start", context=context)
    assert executed == [] and [i.agent for i in held.interruptions] == [configured]
    state = held.to_state()
    state.approve(held.interruptions[0])
    resumed = await runner.run(configured, state)

    assert resumed.final_output == "done" and executed == ["privileged"]
    assert outputs(resumed) == ["private data"]


async def test_a_deferred_top_level_tool_called_under_its_own_namespace_runs_on_the_fleet(
    fleet: InProcessFleet,
) -> None:
    """The model names a deferred top-level tool ``lookup`` with the namespace ``lookup``;
    the SDK dispatches it as ``lookup``, and so must the fleet (not ``lookup.lookup``)."""

    @function_tool(defer_loading=True)
    async def lookup() -> str:
        """Looks something up (loaded on demand)."""
        return "found"

    model = ScriptedModel(
        [
            [function_call("lookup", {}, call_id="d1", namespace="lookup")],
            [assistant_message("done")],
        ]
    )
    runner = FleetRunner(fleet.client, tenant_id=TENANT)
    result = await runner.run(Agent(name="a", model=model, tools=[lookup]), "start")

    assert outputs(result) == ["found"] and result.final_output == "done"
    assert fleet.served("lookup").function_tool is lookup  # type: ignore[attr-defined]
