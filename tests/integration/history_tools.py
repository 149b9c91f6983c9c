"""The tools behind the console history's tests, with names of their own: circuits count
failures per tool version across the whole test session, and the other console tests'
lost responses and failures must not add to these (nor these to theirs)."""

from __future__ import annotations

import asyncio
from typing import Literal

from executors import ToolContext, ToolRegistry

tools = ToolRegistry()


@tools.tool(name="h_lookup", effect="read_only")
async def lookup(city: str) -> str:
    """Weather of a city, at once."""
    return f"{city}: sunny"


@tools.tool(name="h_quote", version="1", effect="read_only")
async def quote_v1(fail: bool = False) -> str:
    """The release that works."""
    return "v1 quote"


@tools.tool(name="h_quote", version="2", effect="read_only")
async def quote_v2(fail: bool = False) -> str:
    """The release that fails when asked to."""
    if fail:
        raise RuntimeError("quote v2 is broken")
    return "v2 quote"


@tools.tool(name="h_transfer", effect="non_idempotent", needs_approval=True)
async def transfer(amount: int, to: str) -> str:
    """Moves money: a person approves every call."""
    return f"transferred {amount}"


@tools.tool(
    name="h_note", effect="non_idempotent", timeout=0.5,
    unattended="a note: an operator settles an unknown one by hand",
)  # fmt: skip
async def note(ctx: ToolContext, text: str, mode: Literal["ok", "apply_then_drop"] = "ok") -> str:
    """Writes a note upstream; with apply_then_drop the response is lost after it was
    written, and with no probe to ask, a human task is filed at once."""
    if mode == "apply_then_drop":
        await asyncio.Event().wait()  # never answers: its timeout cancels it, the response is lost
    return f"noted {text}"
