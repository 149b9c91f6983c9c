"""OpenAI Agents SDK function tools, defined once: run in-process by the SDK and served by the
fleet (``--tools tests.integration.sdk_tools:tools``) in tests/integration/test_sdk_differential.

Names start with ``sdk_`` because the fleet's tool registry in Redis is shared by every fleet
on the machine. Tools that count what ran record it in Redis under the side they ran on:
``fleet`` in a worker process (the tests' fleets start their workers with ``SIDE_ENV`` set,
since a tool on a worker now gets a copy of the run's context like the one in-process), or when
the context is toolfleet's ToolContext (a call that carried no copy); ``sdk`` otherwise
(in-process), so one test can compare both runs of the same call ids.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents import FunctionTool, RunContextWrapper, function_tool
from agents.mcp import MCPServerStdio
from agents.tool_guardrails import (
    ToolGuardrailFunctionOutput,
    ToolInputGuardrailData,
    ToolOutputGuardrailData,
    tool_input_guardrail,
    tool_output_guardrail,
)
from pydantic import BaseModel

from executors import ToolContext, ToolRegistry
from tests.integration.side_effects import side_effects

SIDE_ENV = {"SDK_TOOLS_SIDE": "fleet"}
"""The environment a test fleet's worker processes get: their tools count as "fleet"."""


def side(ctx: RunContextWrapper[Any]) -> str:
    """Where a call runs: "fleet" (a worker) or "sdk" (the test process, in-process run)."""
    on_worker = os.environ.get("SDK_TOOLS_SIDE") == "fleet"
    return "fleet" if on_worker or isinstance(ctx.context, ToolContext) else "sdk"


def runs_key(where: str, call_id: str) -> str:
    """Redis counter: how many times the body of ``call_id`` ran on ``where``."""
    return f"test:sdk:{where}:runs:{call_id}"


def peak_key(where: str, group: str) -> str:
    """Redis counter: the most calls of ``group`` that were in flight at once on ``where``."""
    return f"test:sdk:{where}:peak:{group}"


def _count(ctx: RunContextWrapper[Any], call_id: str) -> None:
    side_effects().incr(runs_key(side(ctx), call_id))


def _call_id(ctx: RunContextWrapper[Any]) -> str:
    return str(getattr(ctx, "tool_call_id", ""))


# --- plain tools -----------------------------------------------------------------------------
@function_tool
async def sdk_add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@function_tool
def sdk_shout(text: str) -> str:
    """A sync tool: runs in a worker thread, in-process and on the fleet alike."""
    return text.upper()


@function_tool(timeout=30)
async def sdk_echo_after(ctx: RunContextWrapper[Any], text: str, ms: int = 0) -> str:
    """Waits ``ms`` milliseconds, then returns ``text``; counts its runs."""
    _count(ctx, _call_id(ctx))
    await asyncio.sleep(ms / 1000)
    return text


@function_tool(timeout=30)
async def sdk_busy(ctx: RunContextWrapper[Any], group: str, ms: int) -> str:
    """Holds ``ms`` milliseconds while counting how many calls of ``group`` are in flight."""
    where = side(ctx)
    in_flight = f"test:sdk:{where}:in-flight:{group}"
    now = side_effects().incr(in_flight)
    side_effects().eval(  # peak = max(peak, now), atomically
        "local p = tonumber(redis.call('GET', KEYS[1]) or '0') "
        "if tonumber(ARGV[1]) > p then redis.call('SET', KEYS[1], ARGV[1]) end return 0",
        1,
        peak_key(where, group),
        now,
    )
    try:
        await asyncio.sleep(ms / 1000)
    finally:
        side_effects().decr(in_flight)
    return f"{group} done"


# --- failures --------------------------------------------------------------------------------
class Fatal(BaseException):
    """Not an Exception: no failure handler can word it."""


def show_error(ctx: RunContextWrapper[Any], error: Exception) -> str:
    """A custom failure_error_function that shows the model the error's class and text."""
    return f"sdk tool failed: {type(error).__name__}: {error}"


@function_tool(timeout=30)
async def sdk_fail(message: str, ms: int = 0) -> str:
    """Raises ValueError(message) after ``ms``; default failure handler."""
    await asyncio.sleep(ms / 1000)
    raise ValueError(message)


@function_tool(timeout=30, failure_error_function=show_error)
async def sdk_fail_shown(message: str) -> str:
    """Raises ValueError(message); a custom handler shows it."""
    raise ValueError(message)


async def _fleet_delay(ctx: RunContextWrapper[Any], ms: int) -> None:
    """Sleeps ``ms`` on the fleet only: the outcome reaches the aggregator that much later,
    as worker scheduling or network latency can make it; in-process nothing changes."""
    if ms and side(ctx) == "fleet":
        await asyncio.sleep(ms / 1000)


@function_tool(timeout=30, failure_error_function=None)
async def sdk_fail_strict(
    ctx: RunContextWrapper[Any], message: str, ms: int = 0, fleet_delay_ms: int = 0
) -> str:
    """Raises ValueError(message) after ``ms``; no failure handler: the run fails."""
    await asyncio.sleep(ms / 1000)
    await _fleet_delay(ctx, fleet_delay_ms)
    _count(ctx, _call_id(ctx))
    raise ValueError(message)


@function_tool(failure_error_function=None)
async def sdk_count_strict(n: int) -> int:
    """Takes an integer; no failure handler (invalid arguments fail the run)."""
    return n


@function_tool(failure_error_function=show_error)
async def sdk_count_shown(n: int) -> int:
    """Takes an integer; a custom handler words invalid arguments."""
    return n


@function_tool(timeout=0.2)
async def sdk_slow(ms: int) -> str:
    """Times out (0.2 s) when ``ms`` is larger; default timeout text."""
    await asyncio.sleep(ms / 1000)
    return "in time"


def late(ctx: RunContextWrapper[Any], error: Exception) -> str:
    """A custom timeout_error_function."""
    return f"sdk_slow_custom gave up: {error}"


@function_tool(timeout=0.2, timeout_error_function=late)
async def sdk_slow_custom(ms: int) -> str:
    """Times out (0.2 s) when ``ms`` is larger; custom timeout text."""
    await asyncio.sleep(ms / 1000)
    return "in time"


@function_tool(timeout=0.2, timeout_behavior="raise_exception")
async def sdk_slow_strict(ms: int) -> str:
    """Times out (0.2 s) when ``ms`` is larger; the timeout fails the run."""
    await asyncio.sleep(ms / 1000)
    return "in time"


@function_tool(timeout=30)
async def sdk_own_timeout(message: str) -> str:
    """Raises a TimeoutError of its own: an ordinary tool error, not the SDK's timeout."""
    raise TimeoutError(message)


@function_tool(timeout=30, failure_error_function=None)
async def sdk_own_timeout_strict(message: str) -> str:
    """Raises a TimeoutError of its own, with no failure handler."""
    raise TimeoutError(message)


@function_tool(timeout=30)
async def sdk_fatal(ctx: RunContextWrapper[Any], message: str, fleet_delay_ms: int = 0) -> str:
    """Raises a BaseException-class error (after ``fleet_delay_ms`` on the fleet)."""
    await asyncio.sleep(0)  # wait-ok: a yield point, as an async tool body has
    await _fleet_delay(ctx, fleet_delay_ms)
    raise Fatal(message)


# --- guardrails ------------------------------------------------------------------------------
@tool_input_guardrail
def screen_input(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
    """ "secret" in the arguments is rejected with a message, "trip" trips the wire."""
    arguments = data.context.tool_arguments
    if "trip" in arguments:
        return ToolGuardrailFunctionOutput.raise_exception(output_info="tripped")
    if "secret" in arguments:
        return ToolGuardrailFunctionOutput.reject_content("Refusing to handle secrets.")
    return ToolGuardrailFunctionOutput.allow(output_info={"screened": "input"})


@tool_output_guardrail
def screen_output(data: ToolOutputGuardrailData) -> ToolGuardrailFunctionOutput:
    """A "classified" output is replaced, an "explode" output trips the wire."""
    if "explode" in str(data.output):
        return ToolGuardrailFunctionOutput.raise_exception(output_info="exploded")
    if "classified" in str(data.output):
        return ToolGuardrailFunctionOutput.reject_content("Output withheld.")
    return ToolGuardrailFunctionOutput.allow(output_info={"screened": "output"})


@function_tool(tool_input_guardrails=[screen_input], tool_output_guardrails=[screen_output])
async def sdk_screened(ctx: RunContextWrapper[Any], text: str) -> str:
    """Echoes ``text`` through an input and an output guardrail; counts its runs."""
    _count(ctx, _call_id(ctx))
    return text


# --- approvals -------------------------------------------------------------------------------
@function_tool(needs_approval=True)
async def sdk_delete(ctx: RunContextWrapper[Any], name: str) -> str:
    """Needs approval every time; counts its runs."""
    _count(ctx, _call_id(ctx))
    return f"deleted {name}"


def policy_key(where: str, call_id: str) -> str:
    """Redis counter: how many times ``large_amounts`` was asked about ``call_id`` on ``where``."""
    return f"test:sdk:{where}:policy:{call_id}"


async def large_amounts(ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
    """Approval policy: amounts above 100 need a human; counts where it is asked."""
    side_effects().incr(policy_key(side(ctx), call_id))
    return int(params.get("amount", 0)) > 100


@function_tool(needs_approval=large_amounts)
async def sdk_pay(ctx: RunContextWrapper[Any], amount: int) -> str:
    """Needs approval above 100; counts its runs."""
    _count(ctx, _call_id(ctx))
    return f"paid {amount}"


@function_tool(needs_approval=True, tool_input_guardrails=[screen_input])
async def sdk_screened_delete(ctx: RunContextWrapper[Any], text: str) -> str:
    """Needs approval and has an input guardrail (for pre-approval guardrails)."""
    _count(ctx, _call_id(ctx))
    return f"deleted {text}"


@function_tool(is_enabled=False)
async def sdk_disabled() -> str:
    """Switched off: the model is never shown it."""
    return "never"


SDK_TOOLS: list[FunctionTool] = [
    sdk_add, sdk_shout, sdk_echo_after, sdk_busy, sdk_fail, sdk_fail_shown, sdk_fail_strict,
    sdk_count_strict, sdk_count_shown, sdk_slow, sdk_slow_custom, sdk_slow_strict,
    sdk_own_timeout, sdk_own_timeout_strict, sdk_fatal, sdk_screened, sdk_delete, sdk_pay,
    sdk_screened_delete, sdk_disabled,
]  # fmt: skip
"""Every tool of this module, as an agent lists them."""


@function_tool
async def sdk_transfer(ctx: RunContextWrapper[Any], amount: int) -> str:
    """No approval in the SDK; the fleet's release gate holds it (see ``tools``)."""
    _count(ctx, _call_id(ctx))
    return f"transferred {amount}"


class Stock(BaseModel):
    """A structured tool output."""

    sku: str
    units: int


@function_tool
async def sdk_ticket(title: str) -> dict[str, Any]:
    """Returns a mapping (the model sees its str())."""
    return {"ticket": {"title": title, "status": "created"}}


@function_tool(output_type=Stock)
async def sdk_stock(sku: str) -> Stock:
    """Returns a pydantic model, declared as the tool's output type."""
    return Stock(sku=sku, units=42)


@function_tool
async def sdk_pair(a: int) -> tuple[int, int]:
    """Returns a tuple, which JSON keeps as a list: its return annotation rebuilds it."""
    return (a, a + 1)


@dataclass
class Forecast:
    """A structured tool output no ``output_type`` declares: only the annotation names it."""

    city: str
    sky: str


@function_tool
async def sdk_forecast(city: str) -> Forecast:
    """Returns a dataclass, named by its return annotation only."""
    return Forecast(city=city, sky="sunny")


@function_tool
async def sdk_loose(a: int):  # type: ignore[no-untyped-def]  # no annotation: nothing to rebuild
    """Returns a tuple with no return annotation: the application gets the model's text."""
    return (a, a)


@function_tool(failure_error_function=None)
async def sdk_cancel_itself(reason: str) -> str:
    """Cancels itself (a tool-local cancellation) with no failure handler to take it."""
    raise asyncio.CancelledError(reason)


OBJECT_TOOLS: list[FunctionTool] = [sdk_ticket, sdk_stock, sdk_pair, sdk_forecast, sdk_loose]
"""Tools that return objects, not text (not in SDK_TOOLS: other scenarios' views stay)."""

tools = ToolRegistry.from_function_tools(
    [*SDK_TOOLS, *OBJECT_TOOLS, sdk_cancel_itself], effect="read_only"
)
"""What the fleet's workers serve: the same objects, unchanged."""
tools.add_function_tool(sdk_transfer, effect="non_idempotent")  # no probe: gated


def mcp_server(side: str) -> MCPServerStdio:
    """The test MCP server (tests/integration/mcp_server.py) over stdio, counting as ``side``.

    Started by whoever connects it: a worker (``side`` "fleet", through ``tools`` below), or the
    test process (the agent's own server, which the runner lists the tools of).
    """
    passed = ("PATH", "PYTHONPATH", "REDIS_URL", "TEST_SIDE_EFFECTS_URL", "HOME")
    env = {k: os.environ[k] for k in passed if k in os.environ} | {"MCP_SIDE": side}
    return MCPServerStdio(
        params={
            "command": sys.executable,
            "args": ["-m", "tests.integration.mcp_server"],
            "env": env,
            "cwd": str(Path(__file__).resolve().parents[2]),
        },
        name="toolfleet-test",
        client_session_timeout_seconds=30,
    )


tools.add_mcp_server(
    mcp_server("fleet"), effects={"mcp_weather": "read_only", "mcp_book": "idempotent"}
)
