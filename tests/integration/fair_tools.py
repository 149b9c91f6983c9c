"""Tools of the fairness tests (``--tools tests.integration.fair_tools:tools``).

Each records, in Redis (``tests.integration.side_effects``), when each call's body started
(a sorted set per tenant), how often each call ran, and its tenant's peak of calls in flight.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from executors import ToolContext, ToolRegistry
from tests.integration.side_effects import ENTER_IN_FLIGHT, async_side_effects, in_flight_keys

tools = ToolRegistry()


def starts_key(tenant: str) -> str:
    """Sorted set: call id -> when its body started (Unix time), for one tenant."""
    return f"test:fair:starts:{tenant}"


def runs_key(call_id: str) -> str:
    """How many times the body of ``call_id`` ran."""
    return f"test:fair:runs:{call_id}"


async def _work(ctx: ToolContext, ms: int) -> str:
    store = async_side_effects()
    began = time.time()
    await asyncio.gather(
        store.zadd(starts_key(ctx.tenant_id), {ctx.call_id: began}),
        store.incr(runs_key(ctx.call_id)),
        store.eval(ENTER_IN_FLIGHT, 2, *in_flight_keys(ctx.tenant_id)),
    )
    try:
        await asyncio.sleep(ms / 1000)
    finally:
        await store.decr(in_flight_keys(ctx.tenant_id)[0])
    return "done"


work = tools.tool(name="work", effect="read_only", timeout=60)(_work)
"""Holds ``ms`` milliseconds: the flooding tenants' and the light tenant's tool."""

limited = tools.tool(name="limited", effect="read_only", timeout=60)(_work)
"""The same, under a per-tool rate limit in the tests."""


@tools.tool(effect="idempotent", timeout=30)
async def rate_limited(ctx: ToolContext, ms: int = 0) -> str:
    """Answers as an upstream over its rate limit does: HTTP 429 (retry after 1 s)."""
    request = httpx.Request("POST", "https://upstream.example/v1/charge")
    response = httpx.Response(429, request=request, headers={"Retry-After": "1"})
    raise httpx.HTTPStatusError("429 Too Many Requests", request=request, response=response)
