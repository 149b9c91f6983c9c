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


def farm_key(idempotency_key: str) -> str:
    """The render farm's record of a job: ``queued``, or ``done:<output>``."""
    return f"test:deferred:farm:{idempotency_key}"


@tools.tool(effect="non_idempotent")
async def render_video(ctx: ToolContext, title: str, within: float = 3600) -> Deferred:
    """Queues a render on the render farm, which completes the call when it is done."""
    handed = {"handle": ctx.completion_handle(), "pid": os.getpid(), "title": title,
              "key": ctx.idempotency_key}  # fmt: skip
    store = async_side_effects()
    await store.set(farm_key(ctx.idempotency_key), "queued")
    await store.set(handed_key(ctx.call_id), json.dumps(handed))
    return Deferred(complete_within_s=within)


@render_video.probe
async def find_render(ctx: ToolContext) -> ProbeResult:
    """The farm's record of the job, by idempotency key."""
    record = await async_side_effects().get(farm_key(ctx.idempotency_key))
    if record is None:
        return ProbeResult.not_applied()
    text = record.decode()
    if text.startswith("done:"):
        return ProbeResult.applied(text.removeprefix("done:"))
    return ProbeResult.unknown("still queued on the render farm")
