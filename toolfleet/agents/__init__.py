"""Run OpenAI Agents SDK agents with their tool calls executed on a toolfleet fleet.

```python
from agents import Agent
from toolfleet.agents import FleetRunner
from toolfleet import FleetClient, Settings

async with FleetClient(Settings()) as client:
    runner = FleetRunner(client, tenant_id="acme")
    result = await runner.run(agent, "Open a ticket about the umbrella shortage")
    while result.interruptions:          # calls waiting for approval
        state = result.to_state()
        for item in result.interruptions:
            state.approve(item)           # or state.reject(item, rejection_message=...)
        result = await runner.run(agent, state)
    print(result.final_output)
```

The workers serve the same tools with ``ToolRegistry.from_function_tools(agent.tools)``.
Needs the ``openai-agents`` package.
"""

from toolfleet.agents._errors import FleetRunCancelled, FleetTurnError, run_error
from toolfleet.agents._runner import DEFAULT_MAX_TURNS, FleetRunner
from toolfleet.agents._state import Decision, FleetRunResult, FleetRunState

__all__ = [
    "DEFAULT_MAX_TURNS",
    "Decision",
    "FleetRunCancelled",
    "FleetRunResult",
    "FleetRunState",
    "FleetRunner",
    "FleetTurnError",
    "run_error",
]
