"""Tools for the crash and concurrency-limit tests; effects and in-flight counts go to Redis."""

from __future__ import annotations

import asyncio

from executors import ToolContext, ToolRegistry
from tests.integration.side_effects import ENTER_IN_FLIGHT, in_flight_keys, side_effects

tools = ToolRegistry()


def effects_key(call_id: str) -> str:
    """How many times the body of ``call_id`` completed its side effect."""
    return f"test:effects:{call_id}"


def holder_key(call_id: str) -> str:
    """The worker that started ``call_id`` (set when the body begins)."""
    return f"test:holder:{call_id}"


@tools.tool(
    effect="non_idempotent", timeout=60, on_unknown="report_now",
    unattended="a test counter: the crash tests count its effects themselves",
)  # fmt: skip
async def charge(ctx: ToolContext, amount: int, hold_ms: int = 0) -> str:
    """Records who holds the call, holds it, then applies its one side effect."""
    side_effects().set(holder_key(ctx.call_id), ctx.worker_id or "")
    await asyncio.sleep(hold_ms / 1000)
    side_effects().incr(effects_key(ctx.call_id))
    return f"charged {amount}"


async def _tracked(ctx: ToolContext, scope: str, ms: int) -> str:
    """Counts itself in flight for ``scope`` and for its worker while it sleeps ``ms``."""
    scopes = [scope, f"worker:{ctx.worker_id}"]
    for s in scopes:
        side_effects().eval(ENTER_IN_FLIGHT, 2, *in_flight_keys(s))
    try:
        await asyncio.sleep(ms / 1000)
    finally:
        for s in scopes:
            side_effects().decr(in_flight_keys(s)[0])
    return "ok"


tracked = tools.tool(name="tracked", effect="read_only", timeout=60)(_tracked)
"""Limited to N at once by admission in the tests (`toolfleet tools limit tracked`)."""
tracked_free = tools.tool(name="tracked_free", effect="read_only", timeout=60)(_tracked)
"""No tool limit: only the tenant and per-worker limits apply."""
