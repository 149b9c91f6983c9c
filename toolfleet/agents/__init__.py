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

``FleetRunner`` is the SDK's own runner (``run``, ``run_streamed``, ``run_sync``, sessions,
handoffs, guardrails, hooks, agents as tools, ``RunState``) on the application's own agents;
only the invocation of their function tools moves, to the fleet's workers, which serve them
with ``ToolRegistry.from_function_tools(...)``. Needs the Agents SDK: ``pip install
'toolfleet[agents]'`` (without it, importing this package raises ``MissingExtraError``, an
``ImportError`` that says so).
"""

from kernel.errors import MissingExtraError

try:
    import agents  # noqa: F401  (first, so a missing SDK is named before any use of it)
except ModuleNotFoundError as exc:  # the SDK, or a package it needs, is not installed
    raise MissingExtraError(
        "toolfleet.agents (FleetRunner)", extra="agents", missing=exc.name
    ) from exc
from toolfleet.agents._calls import fleet_turn_id
from toolfleet.agents._errors import (
    FleetApprovalRequired,
    FleetRunCancelled,
    FleetRunError,
    FleetToolError,
    FleetToolNotServed,
    FleetTurnError,
    run_error,
)
from toolfleet.agents._runner import DEFAULT_MAX_TURNS, FleetRunner

__all__ = [
    "DEFAULT_MAX_TURNS",
    "FleetApprovalRequired",
    "FleetRunCancelled",
    "FleetRunError",
    "FleetRunner",
    "FleetToolError",
    "FleetToolNotServed",
    "FleetTurnError",
    "fleet_turn_id",
    "run_error",
]
