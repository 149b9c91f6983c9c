"""Two versions of one tool served side by side: version 1 works, version 2 always fails.

Both are read_only, so a failure stays a plain failure (no reconciler, no probe): the tests
are about routing, not about effects.
"""

from __future__ import annotations

from executors import ToolRegistry

tools = ToolRegistry()


@tools.tool(name="pay_v", version="1", effect="read_only")
async def pay_v1(value: str) -> str:
    """The release that works."""
    return f"v1 paid {value}"


@tools.tool(name="pay_v", version="2", effect="read_only")
async def pay_v2(value: str) -> str:
    """The release that fails on every call."""
    raise RuntimeError(f"v2 cannot pay {value}")
