"""Tools that report progress, for the progress tests (``--tools
tests.integration.progress_tools:tools``).

``lockstep`` reports its steps one at a time and goes on only once the test acknowledged the
step it reported (a Redis key): the test sees every event the tool sends, none coalesced, so
it can assert the exact sequence a reader is shown.
"""

from __future__ import annotations

import asyncio
import time

from executors import ToolContext, ToolRegistry
from tests.integration.side_effects import async_side_effects

tools = ToolRegistry()

ACK_WITHIN_S = 60.0
"""How long the tool waits for the test to acknowledge a step before it fails."""


def holder_key(call_id: str) -> str:
    """The worker running ``call_id``'s latest attempt (set when its body begins)."""
    return f"test:progress-holder:{call_id}"


def ack_key(call_id: str, attempt: int, step: int) -> str:
    """Set by the test once it was shown ``step`` of ``call_id``'s attempt ``attempt``."""
    return f"test:progress-ack:{call_id}:{attempt}:{step}"


@tools.tool(effect="idempotent", timeout=120)
async def lockstep(ctx: ToolContext, steps: int, stall_after: int = 0) -> str:
    """Reports steps 1..``steps``, each once the one before was acknowledged. Its first
    attempt stops after ``stall_after`` steps (0: never) and holds the call: a test kills its
    worker there, and the fleet runs the call again (idempotent, no probe)."""
    store = async_side_effects()
    await store.set(holder_key(ctx.call_id), ctx.worker_id or "")
    for step in range(1, steps + 1):
        await ctx.report_progress(step, steps, f"step {step} of {steps}")
        if ctx.attempt == 1 and step == stall_after:
            await asyncio.Event().wait()  # held until the test SIGKILLs this worker
        deadline = time.monotonic() + ACK_WITHIN_S
        while not await store.exists(ack_key(ctx.call_id, ctx.attempt, step)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"step {step} of attempt {ctx.attempt} never acknowledged")
            await asyncio.sleep(0.01)  # wait-ok: polling interval of a deadline-bounded wait
    return f"{steps} steps"
