"""A tool for the MCP door's replica test: served by worker processes (``LocalFleet``), it
counts each time it reached its upstream and answers once the test releases it, both in
Redis (``side_effects``), since the test and the worker are different processes."""

from __future__ import annotations

import asyncio

from executors import ProbeResult, ToolContext, ToolRegistry
from tests.integration.side_effects import side_effects

tools = ToolRegistry()

HOLD_MAX_S = 120.0
"""A held call gives up after this long (a test that never releases it failed already)."""


def runs_key(key: str) -> str:
    """How many times ``held`` reached its upstream for ``key``."""
    return f"test:mcp-replicas:runs:{key}"


def release_key(key: str) -> str:
    """Set by the test: ``held`` of ``key`` may answer."""
    return f"test:mcp-replicas:release:{key}"


@tools.tool(effect="non_idempotent", timeout=HOLD_MAX_S + 10)
async def held(ctx: ToolContext, key: str) -> str:
    """Reaches its upstream at once, then answers when the test releases it."""
    side_effects().incr(runs_key(key))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HOLD_MAX_S
    while not side_effects().exists(release_key(key)):
        if loop.time() > deadline:
            raise TimeoutError(f"{key} was never released")
        await asyncio.sleep(0.05)  # wait-ok: the tool polls its upstream's release, bounded
    return f"done {key}"


@held.probe
async def _held_probe(ctx: ToolContext) -> ProbeResult:
    key = str(ctx.args.get("key", ""))
    if side_effects().get(runs_key(key)):
        return ProbeResult.applied(f"done {key}")
    return ProbeResult.not_applied()
