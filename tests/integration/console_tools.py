"""The tools behind the console's tests: a quick read, two writes an operator settles by hand,
a write that needs approval, a write that records its upstream reference, and a tool served in
two versions (the second fails on demand, for circuits and rollbacks)."""

from __future__ import annotations

import asyncio
from typing import Literal

from executors import ToolContext, ToolRegistry
from tests.integration.side_effects import side_effects

tools = ToolRegistry()


def runs_key(call_id: str) -> str:
    """How many times a tool body started for a call."""
    return f"test:console:runs:{call_id}"


@tools.tool(effect="read_only")
async def lookup(city: str) -> str:
    """Weather of a city, at once."""
    return f"{city}: sunny"


@tools.tool(
    effect="non_idempotent", timeout=0.5,
    unattended="a note: an operator settles an unknown one by hand",
)  # fmt: skip
async def note(ctx: ToolContext, text: str, mode: Literal["ok", "apply_then_drop"] = "ok") -> str:
    """Writes a note upstream; with apply_then_drop the response is lost after it was
    written, and with no probe to ask, a human task is filed at once."""
    side_effects().incr(runs_key(ctx.call_id))
    if mode == "apply_then_drop":
        await asyncio.Event().wait()  # never answers: its timeout cancels it
    return f"noted {text}"


@tools.tool(
    effect="non_idempotent", timeout=0.5,
    unattended="a memo: an operator settles an unknown one by hand",
)  # fmt: skip
async def memo(ctx: ToolContext, text: str, mode: Literal["ok", "apply_then_drop"] = "ok") -> str:
    """Like note, with a circuit of its own: the tests' lost responses of note (three within
    the circuit's window open it, TOOLFLEET_CIRCUIT_MIN_CALLS=3) never refuse a memo."""
    side_effects().incr(runs_key(ctx.call_id))
    if mode == "apply_then_drop":
        await asyncio.Event().wait()  # never answers: its timeout cancels it
    return f"memo {text}"


@tools.tool(effect="non_idempotent", needs_approval=True)
async def transfer(ctx: ToolContext, amount: int, to: str) -> str:
    """Moves money: a person approves every call."""
    side_effects().incr(runs_key(ctx.call_id))
    return f"transferred {amount}"


@tools.tool(effect="idempotent", unattended="a booking keyed by its idempotency key")
async def book(ctx: ToolContext, seat: str) -> str:
    """Books a seat and records the upstream's booking id."""
    await ctx.record_upstream_ref("B-77")
    return "booked"


@tools.tool(name="quote", version="1", effect="read_only")
async def quote_v1(fail: bool = False) -> str:
    """The release that works."""
    return "v1 quote"


@tools.tool(name="quote", version="2", effect="read_only")
async def quote_v2(fail: bool = False) -> str:
    """The release that fails when asked to."""
    if fail:
        raise RuntimeError("quote v2 is broken")
    return "v2 quote"
