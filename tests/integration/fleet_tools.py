"""Tools the end-to-end tests' workers serve (``--tools tests.integration.fleet_tools:tools``).

Side effects are recorded in Redis (``REDIS_URL``), so a test can count how often a call's
body really ran, across processes and crashes.
"""

from __future__ import annotations

import asyncio
import logging
import time

from executors import CallHooks, GuardrailResult, Tool, ToolContext, ToolRegistry
from tests.integration.side_effects import side_effects

tools = ToolRegistry()


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
    side_effects().incr(effects_key(ctx.call_id))
    await asyncio.sleep(ms / 1000)
    return text


@tools.tool(
    effect="non_idempotent", timeout=60, unattended="a test counter: the tests check its effects"
)
async def charge(ctx: ToolContext, amount: int, hold_ms: int = 0) -> str:
    """Counts a side effect, then holds the call open for ``hold_ms``."""
    side_effects().set(starts_key(ctx.call_id), ctx.worker_id or "")
    await asyncio.sleep(hold_ms / 1000)
    side_effects().incr(effects_key(ctx.call_id))
    return f"charged {amount}"


@tools.tool(effect="read_only")
async def boom(message: str) -> str:
    """Always raises."""
    raise ValueError(message)


@tools.tool(effect="read_only", timeout=0.2)
async def too_slow() -> str:
    """Never finishes within its timeout."""
    await asyncio.sleep(10)  # wait-ok: the tool outlives its timeout on purpose
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


# --- Tools and hooks for tests/integration/test_semantics.py ----------------------------------
# Everything they observe is counted in Redis per call_id, so a test can assert how often user
# code (body, approval policy, hooks) really ran, whichever worker process ran it.


def timing_key(call_id: str) -> str:
    """Redis hash of when the body of ``call_id`` began and ended (``start`` / ``end``)."""
    return f"test:timing:{call_id}"


def approval_checks_key(call_id: str) -> str:
    """Redis counter of how many times a ``needs_approval`` callable was asked about a call."""
    return f"test:approval-checks:{call_id}"


def hook_key(event: str, call_id: str) -> str:
    """Redis counter of how many times the registry hook ``event`` ran for ``call_id``."""
    return f"test:hooks:{event}:{call_id}"


class _CountingHooks(CallHooks):
    """Registry hooks that only count, per call_id and event."""

    async def on_tool_start(self, ctx: ToolContext, tool: Tool) -> None:
        side_effects().incr(hook_key("start", ctx.call_id))

    async def on_tool_end(self, ctx: ToolContext, tool: Tool, output: str) -> None:
        side_effects().incr(hook_key("end", ctx.call_id))


tools.hooks = _CountingHooks()


@tools.tool(effect="read_only", timeout=30)
async def timed_work(ctx: ToolContext, text: str, ms: int = 0) -> str:
    """Records start and end times around ``ms`` milliseconds of work; returns ``text``."""
    side_effects().hset(timing_key(ctx.call_id), "start", repr(time.time()))
    side_effects().incr(effects_key(ctx.call_id))
    await asyncio.sleep(ms / 1000)
    side_effects().hset(timing_key(ctx.call_id), "end", repr(time.time()))
    return text


@tools.tool(effect="read_only", timeout=60)
async def hold(ctx: ToolContext, ms: int) -> str:
    """Marks itself started, holds for ``ms``, then counts its effect (read_only: report_now)."""
    side_effects().set(starts_key(ctx.call_id), ctx.worker_id or "")
    await asyncio.sleep(ms / 1000)
    side_effects().incr(effects_key(ctx.call_id))
    return "held"


@tools.tool(effect="read_only", needs_approval=True)
def approve_me(ctx: ToolContext, name: str) -> str:
    """Needs approval every time; counts its side effect."""
    side_effects().incr(effects_key(ctx.call_id))
    return f"done {name}"


def _counted_policy(ctx: ToolContext, args: dict[str, object]) -> bool:
    side_effects().incr(approval_checks_key(ctx.call_id))
    return int(str(args.get("amount", 0))) > 100


@tools.tool(effect="read_only", needs_approval=_counted_policy)
def payout(ctx: ToolContext, amount: int) -> str:
    """Needs approval above 100, decided by a callable that counts how often it is asked."""
    side_effects().incr(effects_key(ctx.call_id))
    return f"paid {amount}"


def input_screen(ctx: ToolContext, args: dict[str, object]) -> GuardrailResult:
    """Input guardrail: "secret" is rejected with a message, "trip" trips the wire."""
    text = str(args.get("text", ""))
    if "trip" in text:
        return GuardrailResult.raise_exception()
    if "secret" in text:
        return GuardrailResult.reject_content("Refusing to echo secrets.")
    return GuardrailResult.allow()


def output_screen(ctx: ToolContext, args: dict[str, object], output: object) -> GuardrailResult:
    """Output guardrail: "classified" output is replaced, "explode" trips the wire."""
    if "explode" in str(output):
        return GuardrailResult.raise_exception()
    if "classified" in str(output):
        return GuardrailResult.reject_content("Output withheld.")
    return GuardrailResult.allow()


@tools.tool(effect="read_only", input_guardrails=[input_screen], output_guardrails=[output_screen])
def screened_echo(ctx: ToolContext, text: str) -> str:
    """Echoes ``text`` through an input and an output guardrail; counts its side effect."""
    side_effects().incr(effects_key(ctx.call_id))
    return text


@tools.tool(effect="read_only", needs_approval=True, input_guardrails=[input_screen])
def screened_approval(ctx: ToolContext, text: str) -> str:
    """Needs approval and has an input guardrail (for ``pre_approval_guardrails``)."""
    side_effects().incr(effects_key(ctx.call_id))
    return text


class Fatal(BaseException):
    """A BaseException-class failure (like KeyboardInterrupt, without stopping anything)."""


async def _until(at: float) -> None:
    await asyncio.sleep(max(0.0, at - time.time()))


@tools.tool(effect="read_only", timeout=30, failure_error_function=None)
async def strict_boom(ctx: ToolContext, message: str, at: float = 0.0) -> str:
    """Raises ValueError(message) at unix time ``at``; no failure handler: fails the turn."""
    await _until(at)
    side_effects().incr(effects_key(ctx.call_id))
    raise ValueError(message)


@tools.tool(effect="read_only", timeout=30)
async def fatal(ctx: ToolContext, message: str, at: float = 0.0) -> str:
    """Raises a BaseException-class error at unix time ``at`` (always fails the turn)."""
    await _until(at)
    side_effects().incr(effects_key(ctx.call_id))
    raise Fatal(message)


@tools.tool(effect="read_only", timeout=30)
async def boom_at(ctx: ToolContext, message: str, at: float = 0.0) -> str:
    """Raises ValueError(message) at unix time ``at`` (default failure handler)."""
    await _until(at)
    side_effects().incr(effects_key(ctx.call_id))
    raise ValueError(message)


@tools.tool(effect="read_only")
async def chatty(ctx: ToolContext, secret: str) -> str:
    """Logs a line of its own (never its argument): the worker tags it with the call's ids."""
    logging.getLogger("tests.integration.fleet_tools").info("chatty ran")
    return "said"
