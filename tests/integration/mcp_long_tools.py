"""Tools that run long, for the MCP door's long-running tests (``--tools
tests.integration.mcp_long_tools:tools``).

They run in worker processes, so their upstream is Redis (``side_effects``): each counts
every time it reached the upstream for a job, and keeps a record by idempotency key that its
probe reads. The test plays the upstream's other side: it lets a probe answer, and it is the
external system a deferred call is handed to (``deferred_tools.handed_key``).
"""

from __future__ import annotations

import asyncio
import json
import os

from executors import Deferred, ProbeResult, ToolContext, ToolRegistry
from kernel.adapters.redis import text
from tests.integration.deferred_tools import handed_key
from tests.integration.side_effects import async_side_effects

tools = ToolRegistry()

PROBE_WAIT_S = 50.0
"""How long a probe waits for the test's leave to answer (under the tools' 60 s timeout)."""


def runs_key(job: str) -> str:
    """How many times a tool reached its upstream for ``job``."""
    return f"test:mcp-long:runs:{job}"


def record_key(idempotency_key: str) -> str:
    """The upstream's record of a call's work, by the call's idempotency key."""
    return f"test:mcp-long:record:{idempotency_key}"


def probe_release_key(job: str) -> str:
    """Set by the test: the probe of ``job``'s call may answer."""
    return f"test:mcp-long:probe-release:{job}"


async def _reach_upstream(ctx: ToolContext, job: str) -> None:
    store = async_side_effects()
    await store.incr(runs_key(job))
    await store.set(record_key(ctx.idempotency_key), job)


@tools.tool(effect="non_idempotent", heartbeat=0.5, timeout=60)
async def export_report(ctx: ToolContext, job: str) -> str:
    """Exports a report upstream, heartbeats once, then hangs: a wedged connection that
    never answers, so its heartbeat timeout stops it with its effect unknown."""
    await _reach_upstream(ctx, job)
    await ctx.heartbeat({"exported": job})
    await asyncio.Event().wait()  # no heartbeat from here on
    return "never"


@export_report.probe
async def find_report(ctx: ToolContext) -> ProbeResult:
    """The upstream's record of the export, once the test let the probe answer (so the test
    sees the task while the reconciler probes it)."""
    job = str(ctx.args.get("job", ""))
    store = async_side_effects()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PROBE_WAIT_S
    while not await store.exists(probe_release_key(job)):
        if loop.time() > deadline:
            return ProbeResult.unknown("the test never let the probe answer")
        await asyncio.sleep(0.05)  # wait-ok: the probe polls the test's leave, bounded
    found = await store.get(record_key(ctx.idempotency_key))
    if found is None:
        return ProbeResult.not_applied()
    return ProbeResult.applied(f"exported {text(found)}")


@tools.tool(effect="non_idempotent", timeout=60)
async def dispatch_job(ctx: ToolContext, job: str) -> Deferred:
    """Hands a job to an external system, which completes the call when the job is done."""
    await _reach_upstream(ctx, job)
    handed = {"handle": ctx.completion_handle(), "pid": os.getpid()}
    await async_side_effects().set(handed_key(ctx.call_id), json.dumps(handed))
    return Deferred(complete_within_s=600)


@dispatch_job.probe
async def find_job(ctx: ToolContext) -> ProbeResult:
    """The job is with the external system once handed over; it alone says when it is done."""
    if await async_side_effects().get(record_key(ctx.idempotency_key)) is None:
        return ProbeResult.not_applied()
    return ProbeResult.unknown("the job is still with the external system")
