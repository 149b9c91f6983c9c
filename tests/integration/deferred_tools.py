"""A tool that hands its work to an external system and frees its worker, for the deferred
completion tests (``--tools tests.integration.deferred_tools:tools``).

The external system is a Redis key: the tool leaves its completion handle there, with the
process that ran it, and returns ``Deferred``; the test plays the external system.
"""

from __future__ import annotations

import json
import os

from executors import Deferred, ProbeResult, ToolContext, ToolRegistry
from tests.integration.side_effects import async_side_effects

tools = ToolRegistry()


def handed_key(call_id: str) -> str:
    """What the external system was handed for ``call_id``: the handle and the worker's pid."""
    return f"test:deferred:handed:{call_id}"


@tools.tool(effect="non_idempotent")
async def render_video(ctx: ToolContext, title: str) -> Deferred:
    """Queues a render on the render farm, which completes the call when it is done."""
    handed = {"handle": ctx.completion_handle(), "pid": os.getpid(), "title": title}
    await async_side_effects().set(handed_key(ctx.call_id), json.dumps(handed))
    return Deferred(complete_within_s=3600)


@render_video.probe
async def find_render(ctx: ToolContext) -> ProbeResult:
    """The farm's queue by idempotency key (not reached in these tests)."""
    return ProbeResult.unknown("the render farm has no lookup")
