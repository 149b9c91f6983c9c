"""The tools of the rolling-upgrade test, served by the baseline's workers and the current ones.

This file is imported as the top-level module ``upgrade_tools`` by both releases' workers
(``--tools upgrade_tools:tools``, its directory on PYTHONPATH), so it uses only the tool API
both releases have (``executors``) and counts everything in a Redis of its own
(``UPGRADE_EFFECTS_URL``, a plain single Redis whatever the fleet's state runs on), under the
test run's tag (``UPGRADE_TAG``).

Gates: a gated tool holds its call while its pool's gate is closed (its key exists) and the
worker running it has not been let go (``open_key`` of its worker id), at most ``_MAX_HOLD_S``:
calls stay running, or queued behind the pool's only slot, across as many service
replacements as the test wants, and the test lets one worker's calls finish before it stops
that worker.
"""

from __future__ import annotations

import asyncio
import os
import time
from functools import cache

import redis.asyncio
from agents import function_tool
from agents.tool_context import ToolContext as SdkToolContext

import executors
from executors import ProbeResult, ToolContext, ToolRegistry

tools = ToolRegistry()

_MAX_HOLD_S = 240.0  # a test that never opens a gate fails on its own deadline first
_HANG_S = 5.0  # longer than the lossy tools' timeouts: the response is lost


def tag() -> str:
    """The test run's tag: every key below carries it."""
    return os.environ.get("UPGRADE_TAG", "untagged")


def ran_key(call_id: str) -> str:
    """Counter: how many times the body of ``call_id`` ran (the side effect)."""
    return f"upgrade:{tag()}:ran:{call_id}"


def started_key(call_id: str) -> str:
    """Hash: the worker ids whose body of ``call_id`` began, with how many times each."""
    return f"upgrade:{tag()}:started:{call_id}"


def gate_key(pool: str) -> str:
    """String: while it exists, the gated calls of ``pool`` hold."""
    return f"upgrade:{tag()}:gate:{pool}"


def open_key(worker_id: str) -> str:
    """String: once it exists, the gated calls on worker ``worker_id`` finish."""
    return f"upgrade:{tag()}:open:{worker_id}"


def upstream_key(idempotency_key: str) -> str:
    """What the fake upstream holds for one idempotency key (what a probe reads)."""
    return f"upgrade:{tag()}:upstream:{idempotency_key}"


def probes_key(call_id: str) -> str:
    """Counter: probes asked about one call."""
    return f"upgrade:{tag()}:probes:{call_id}"


def answers_key() -> str:
    """String: while it is missing, probes answer "unknown" (the upstream cannot tell yet)."""
    return f"upgrade:{tag()}:probes-answer"


def imports_key() -> str:
    """Hash: pid of each process that imported this module -> where ``executors`` came from."""
    return f"upgrade:{tag()}:imports"


@cache
def _effects() -> redis.asyncio.Redis:
    return redis.asyncio.Redis.from_url(os.environ["UPGRADE_EFFECTS_URL"])


async def _record_start(ctx: ToolContext) -> None:
    await _effects().hincrby(started_key(ctx.call_id), ctx.worker_id or "?", 1)


async def _hold(ctx: ToolContext, pool: str) -> None:
    deadline = time.monotonic() + _MAX_HOLD_S
    held = (gate_key(pool), open_key(ctx.worker_id or "?"))
    while time.monotonic() < deadline:
        closed, let_go = await _effects().mget(held)
        if closed is None or let_go is not None:
            return
        await asyncio.sleep(0.05)  # wait-ok: a tool polling its upstream's gate


@tools.tool(effect="idempotent", timeout=10, pool="default")
async def echo(ctx: ToolContext, text: str) -> str:
    """Counts its run and returns ``text`` (turns that complete at once)."""
    await _record_start(ctx)
    await _effects().incr(ran_key(ctx.call_id))
    return text


@tools.tool(
    effect="non_idempotent", timeout=_MAX_HOLD_S + 30, pool="default",
    unattended="a test counter: the upgrade test checks its effects",
)  # fmt: skip
async def work(ctx: ToolContext, text: str) -> str:
    """A running call: begins, holds while the gate ``default`` is closed, counts, returns."""
    await _record_start(ctx)
    await _hold(ctx, "default")
    await _effects().incr(ran_key(ctx.call_id))
    return f"worked {text}"


@tools.tool(
    effect="non_idempotent", timeout=_MAX_HOLD_S + 30, pool="narrow",
    unattended="a test counter: the upgrade test checks its effects",
)  # fmt: skip
async def narrow_work(ctx: ToolContext, text: str) -> str:
    """The narrow pool's tool (one slot): holds while the gate ``narrow`` is closed, so the
    pool's other calls wait in admission."""
    await _record_start(ctx)
    await _hold(ctx, "narrow")
    await _effects().incr(ran_key(ctx.call_id))
    return f"narrowed {text}"


@tools.tool(effect="read_only", needs_approval=True, pool="default")
async def approve_me(ctx: ToolContext, name: str) -> str:
    """Needs a person's approval for every call; counts its run."""
    await _record_start(ctx)
    await _effects().incr(ran_key(ctx.call_id))
    return f"approved {name}"


@tools.tool(effect="non_idempotent", timeout=0.5, pool="default")
async def pay(ctx: ToolContext, value: str) -> str:
    """Applies upstream, then loses its response: its effect is unknown, and its probe says
    "unknown" until the test lets the upstream answer."""
    await _record_start(ctx)
    await _effects().incr(ran_key(ctx.call_id))
    await _effects().set(upstream_key(ctx.idempotency_key), value, nx=True)
    await asyncio.sleep(_HANG_S)  # wait-ok: applied, and the response is lost
    return f"paid {value}"


@pay.probe
async def _find_payment(ctx: ToolContext) -> ProbeResult:
    await _effects().incr(probes_key(ctx.call_id))
    if not await _effects().exists(answers_key()):
        return ProbeResult.unknown("the upstream cannot tell yet")
    stored = await _effects().get(upstream_key(ctx.idempotency_key))
    if stored is None:
        return ProbeResult.not_applied(detail="no payment for the idempotency key")
    return ProbeResult.applied(f"paid {stored.decode()}")


@tools.tool(
    effect="non_idempotent", timeout=0.5, pool="default",
    unattended="a notification: an operator settles an unknown one by hand",
)  # fmt: skip
async def notify(ctx: ToolContext, value: str) -> str:
    """Applies upstream, then loses its response; no probe: a human task decides."""
    await _record_start(ctx)
    await _effects().incr(ran_key(ctx.call_id))
    await asyncio.sleep(_HANG_S)  # wait-ok: applied, and the response is lost
    return f"notified {value}"


def _where_executors_is() -> None:
    """Record which ``executors`` this process imported (the baseline's or the current)."""
    import redis as blocking

    client = blocking.Redis.from_url(os.environ["UPGRADE_EFFECTS_URL"])
    try:
        client.hset(imports_key(), str(os.getpid()), str(executors.__file__))
    finally:
        client.close()


if "UPGRADE_EFFECTS_URL" in os.environ:
    _where_executors_is()


def _remember_tool() -> None:
    """An Agents SDK function tool that writes to its run's context copy: the current
    release sends the change back with the call's outcome (``CallOutcome.run_context``)."""

    @function_tool
    async def remember(ctx: SdkToolContext[object], note: str) -> str:
        """Adds ``note`` to the run context's notes."""
        await _effects().hincrby(started_key(ctx.tool_call_id), "sdk", 1)
        if isinstance(ctx.context, dict):  # a copy travelled (the baseline gives none)
            ctx.context.setdefault("notes", []).append(note)
        await _effects().incr(ran_key(ctx.tool_call_id))
        return f"remembered {note}"

    tools.add_function_tool(remember, effect="idempotent", pool="default")


_remember_tool()
