"""Tools the end-to-end tests' workers serve (``--tools tests.integration.fleet_tools:tools``).

Side effects are recorded in Redis (``REDIS_URL``), so a test can count how often a call's
body really ran, across processes and crashes.
"""

from __future__ import annotations

import asyncio
import os
from functools import cache

import redis

from executors import GuardrailResult, ToolContext, ToolRegistry

tools = ToolRegistry()


@cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ["REDIS_URL"])


def effects_key(call_id: str) -> str:
    """Redis counter of how many times the body of ``call_id`` ran."""
    return f"test:effects:{call_id}"


def starts_key(call_id: str) -> str:
    """Redis key set when the body of ``call_id`` begins (lets a test kill a worker mid-call)."""
    return f"test:started:{call_id}"


@tools.tool(effect="read_only")
def add(a: int, b: int) -> int:
    """Adds two numbers (a sync tool: runs in a thread)."""
    return a + b


@tools.tool(effect="idempotent", timeout=30)
async def sleep_then_echo(ctx: ToolContext, text: str, ms: int = 0) -> str:
    """Sleeps ``ms`` milliseconds, records that it ran, and returns ``text``."""
    _redis().incr(effects_key(ctx.call_id))
    await asyncio.sleep(ms / 1000)
    return text


@tools.tool(effect="non_idempotent", timeout=60)
async def charge(ctx: ToolContext, amount: int, hold_ms: int = 0) -> str:
    """Counts a side effect, then holds the call open for ``hold_ms``."""
    _redis().set(starts_key(ctx.call_id), ctx.worker_id or "")
    await asyncio.sleep(hold_ms / 1000)
    _redis().incr(effects_key(ctx.call_id))
    return f"charged {amount}"


@tools.tool(effect="read_only")
async def boom(message: str) -> str:
    """Always raises."""
    raise ValueError(message)


@tools.tool(effect="read_only", timeout=0.2)
async def too_slow() -> str:
    """Never finishes within its timeout."""
    await asyncio.sleep(10)
    return "unreachable"


@tools.tool(effect="read_only", needs_approval=True)
def delete_repo(name: str) -> str:
    """Needs approval every time."""
    return f"deleted {name}"


def _large(ctx: ToolContext, args: dict[str, object]) -> bool:
    return int(str(args.get("amount", 0))) > 100


@tools.tool(effect="read_only", needs_approval=_large)
def refund(amount: int) -> str:
    """Needs approval only above 100."""
    return f"refunded {amount}"


def _no_secrets(ctx: ToolContext, args: dict[str, object]) -> GuardrailResult:
    if "secret" in str(args.get("text", "")):
        return GuardrailResult.reject_content("Refusing to echo secrets.")
    return GuardrailResult.allow()


@tools.tool(effect="read_only", input_guardrails=[_no_secrets])
def guarded_echo(text: str) -> str:
    """Echoes text unless an input guardrail rejects it."""
    return text


@tools.tool(effect="read_only", is_enabled=False)
def disabled_tool() -> str:
    """Switched off."""
    return "never"
