"""A fake upstream service (in Redis, shared by every process) and the tools that call it.

The upstream records effects by idempotency key, and can be told to apply an effect and then
drop the response (the tool outlives its timeout), or to drop the request before applying.
"""

from __future__ import annotations

import asyncio
from typing import Literal

import httpx

from executors import ProbeResult, ToolContext, ToolRegistry
from tests.integration.side_effects import side_effects

tools = ToolRegistry()

Mode = Literal["ok", "apply_then_drop", "drop", "wrong_then_drop"]
_HANG_S = 5.0  # longer than every timeout below: the response is "lost"


def effect_key(idempotency_key: str) -> str:
    """What the upstream holds for one idempotency key."""
    return f"test:upstream:{idempotency_key}"


def count_key(idempotency_key: str) -> str:
    """How many times the body tried to apply the key's effect (the upstream dedupes)."""
    return f"test:upstream:applies:{idempotency_key}"


def executions_key(call_id: str) -> str:
    """How many times the tool body started for a call."""
    return f"test:upstream:executions:{call_id}"


async def _call_upstream(ctx: ToolContext, value: str, mode: Mode) -> str:
    side_effects().incr(executions_key(ctx.call_id))
    if mode == "drop":
        await asyncio.sleep(_HANG_S)  # the request never arrives
    side_effects().incr(count_key(ctx.idempotency_key))
    stored = value if mode != "wrong_then_drop" else f"WRONG {value}"
    side_effects().set(effect_key(ctx.idempotency_key), stored, nx=True)  # upstream dedupes by key
    if mode in ("apply_then_drop", "wrong_then_drop"):
        await asyncio.sleep(_HANG_S)  # applied, but the response is lost
    return f"stored {value}"


async def _probe(ctx: ToolContext) -> ProbeResult:
    raw = side_effects().get(effect_key(ctx.idempotency_key))
    if raw is None:
        return ProbeResult.not_applied(detail="no record for the idempotency key")
    stored = raw.decode()
    if stored.startswith("WRONG "):
        return ProbeResult.wrong_effect(stored, detail="upstream holds a different value")
    return ProbeResult.applied(f"stored {stored}")


async def _undo(ctx: ToolContext, original_output: str) -> str:
    side_effects().set(effect_key(ctx.idempotency_key), "COMPENSATED")
    return f"undid {original_output}"


@tools.tool(effect="non_idempotent", timeout=0.5)
async def pay(ctx: ToolContext, value: str, mode: Mode = "ok") -> str:
    """Non-idempotent upstream write with a probe and a compensation."""
    return await _call_upstream(ctx, value, mode)


pay.probe(_probe)
pay.compensate(_undo)


@tools.tool(effect="idempotent", timeout=0.5)
async def put_record(ctx: ToolContext, value: str, drop_first: bool = False) -> str:
    """Idempotent upstream write; with drop_first the first attempt's request is lost."""
    mode: Mode = "drop" if drop_first and ctx.attempt == 1 else "ok"
    return await _call_upstream(ctx, value, mode)


put_record.probe(_probe)


@tools.tool(
    effect="non_idempotent", timeout=0.5,
    unattended="a notification: an operator settles an unknown one by hand",
)  # fmt: skip
async def notify(ctx: ToolContext, value: str, mode: Mode = "ok") -> str:
    """Non-idempotent upstream write without a probe."""
    return await _call_upstream(ctx, value, mode)


@tools.tool(effect="read_only", version="7")
async def flaky(fail: bool) -> str:
    """A tool version that fails on demand (for the circuit breaker)."""
    if fail:
        raise RuntimeError("upstream 500")
    return "fine"


def applies_key(idempotency_key: str) -> str:
    """How many times ``charge_card`` really applied a charge (the upstream does not dedupe)."""
    return f"test:upstream:charges:{idempotency_key}"


Lost = Literal["none", "refused", "timeout", "reset", "http_502"]
"""How a charge's response is lost: never (none), before the request left (refused), or after
the upstream charged (a read timeout, a reset connection, a 502 from a proxy)."""


@tools.tool(effect="non_idempotent", timeout=10)
async def charge_card(
    ctx: ToolContext, amount: int, before_ms: int, after_ms: int, lose: Lost = "none"
) -> str:
    """A non-idempotent charge: work, apply (no dedupe upstream), work, answer."""
    await asyncio.sleep(before_ms / 1000)
    if lose == "refused":
        raise ConnectionRefusedError(111, "Connection refused")
    side_effects().incr(applies_key(ctx.idempotency_key))
    await asyncio.sleep(after_ms / 1000)
    if lose == "timeout":
        raise TimeoutError("The read operation timed out")
    if lose == "reset":
        raise ConnectionResetError(104, "Connection reset by peer")
    if lose == "http_502":
        request = httpx.Request("POST", "https://payments.invalid/charges")
        response = httpx.Response(502, request=request)
        raise httpx.HTTPStatusError("502 Bad Gateway", request=request, response=response)
    return f"charged {amount}"


@charge_card.probe
async def _charged(ctx: ToolContext) -> ProbeResult:
    if int(side_effects().get(applies_key(ctx.idempotency_key)) or 0) > 0:
        return ProbeResult.applied("charged")
    return ProbeResult.not_applied(detail="no charge for the idempotency key")
