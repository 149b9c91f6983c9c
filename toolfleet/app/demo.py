"""``toolfleet demo``: a whole fleet on this machine, one model response in, one turn result out.

The two tools below are the README's example. The demo starts the planner, the aggregator
and two workers as separate processes, submits a model response with three calls, and
prints the TurnResult the agent runtime would get.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid

from executors import ProbeResult, ToolContext, ToolRegistry
from kernel.adapters.topics import ensure_topics
from kernel.settings import Settings
from schemas import ModelResponseEvent
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet

tools = ToolRegistry()

_TICKETS: dict[str, str] = {}  # stands in for an upstream ticket system


@tools.tool(effect="read_only", timeout=5.0)
async def get_weather(city: str) -> str:
    """Current weather of a city."""
    await asyncio.sleep(0.05)
    return f"{city}: 21°C, clear"


@tools.tool(effect="non_idempotent", timeout=5.0)
async def create_ticket(ctx: ToolContext, title: str, priority: int = 3) -> str:
    """Opens a ticket; the idempotency key lets a probe find it after a lost response."""
    ticket = _TICKETS.setdefault(ctx.idempotency_key, f"T-{len(_TICKETS) + 1}")
    return f"opened {ticket} ({title!r}, priority {priority})"


@create_ticket.probe
async def _find_ticket(ctx: ToolContext) -> ProbeResult:
    ticket = _TICKETS.get(ctx.idempotency_key)
    return ProbeResult.applied(f"opened {ticket}") if ticket else ProbeResult.not_applied()


def demo_event() -> ModelResponseEvent:
    """A model response calling both tools, in the Responses API item shape."""
    run = f"demo-{uuid.uuid4().hex[:8]}"
    calls = [
        ("get_weather", {"city": "Lisbon"}),
        ("create_ticket", {"title": "Umbrella shortage", "priority": 1}),
        ("get_weather", {"city": "Oslo"}),
    ]
    return ModelResponseEvent.model_validate(
        {
            "tenant_id": "demo",
            "run_id": run,
            "turn_id": 0,
            "agent": {"name": "assistant"},
            "response_id": f"resp-{run}",
            "items": [
                {"type": "function_call", "call_id": f"call_{run}_{i}", "name": name,
                 "arguments": json.dumps(args)}
                for i, (name, args) in enumerate(calls)
            ],
        }
    )  # fmt: skip


async def run_demo(settings: Settings) -> None:
    """Start a local fleet, run one turn through it, print the result."""
    await ensure_topics(settings)
    # aiokafka logs, then retries, the offset lookups a broker answers before its partitions
    # have settled (fresh topics, a broker that just restarted): not the demo's story.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    with LocalFleet(settings, tools="toolfleet.app.demo:tools", workers=2) as fleet:
        print(f"fleet started (logs in {fleet.log_dir})")
        await fleet.ready()  # every worker owns its partitions: the tools are published
        async with FleetClient(settings) as client:
            event = demo_event()
            began = time.monotonic()
            await client.submit(event)
            print(f"submitted {event.run_id} with {len(event.function_calls)} calls")
            while True:  # the first turn waits for the services to join their groups
                fleet.check()
                try:
                    result = await client.result(event.run_id, 0, within=2)
                    break
                except TimeoutError:
                    if time.monotonic() - began > 120:
                        raise
            print(f"turn result after {time.monotonic() - began:.2f} s:")
            print(result.model_dump_json(indent=2, exclude_none=True))
