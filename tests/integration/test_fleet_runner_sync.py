"""FleetRunner.run_sync under a test fleet that runs on an event loop of its own.

``toolfleet.testing.InProcessFleet`` runs the real services as tasks of the loop it started on;
a synchronous test (the Agents SDK's own tests call ``Runner.run_sync``) leaves that loop idle,
so ``run_sync`` must drive the run there rather than on a new loop of its own, which would reach
a fleet that does not move and wait for ``turn_timeout``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents import Agent, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tracing import set_tracing_disabled

from kernel.settings import Settings
from toolfleet.agents import FleetRunner
from toolfleet.testing import InProcessFleet

pytestmark = [pytest.mark.integration, pytest.mark.agent_runtime]

set_tracing_disabled(True)


@pytest.fixture(scope="module")
async def fleet(settings: Settings) -> AsyncIterator[InProcessFleet]:
    async with InProcessFleet(settings, auto_serve=True) as running:
        yield running


def test_run_sync_drives_a_test_fleet_on_its_own_loop(fleet: InProcessFleet) -> None:
    @function_tool
    def shout_sync(text: str) -> str:
        """Shouts."""
        return text.upper()

    model = ScriptedModel(
        [[function_call("shout_sync", {"text": "sync"}, call_id="s1")], [assistant_message("ok")]]
    )
    agent: Agent[Any] = Agent(name="sync", model=model, tools=[shout_sync])
    runner = FleetRunner(fleet.client, tenant_id="sync-tests", turn_timeout=20)
    result = runner.run_sync(agent, "go")
    assert result.final_output == "ok"
    [turn] = runner.turn_results(result)  # the call went to the fleet, on the fleet's loop
    assert [(c.call_id, c.status) for c in turn.calls] == [("s1", "succeeded")]
    outputs = [i for i in model.calls[-1].input if isinstance(i, dict) and "output" in i]
    assert [o["output"] for o in outputs] == ["SYNC"]
