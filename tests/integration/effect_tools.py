"""Tools whose upstream applies and then the response is lost, for the effect-truth tests.

The fake upstream lives in Redis (shared by every process): it opens one record per
idempotency key and counts every time the body applied. Each tool fails the way a real HTTP
client fails: a read timeout, a reset connection, an httpx error, an HTTP status.
"""

from __future__ import annotations

import asyncio
from typing import Literal

import httpx

from executors import NotExecuted, ProbeResult, ToolContext, ToolRegistry
from tests.integration.side_effects import side_effects

tools = ToolRegistry()

Failure = Literal[
    "none", "timeout", "reset", "httpx_read_timeout", "http_502", "refused", "http_429",
    "http_404", "declined", "definite",
]  # fmt: skip


def record_key(idempotency_key: str) -> str:
    """What the upstream holds for one idempotency key."""
    return f"test:effects:record:{idempotency_key}"


def applies_key(idempotency_key: str) -> str:
    """How many times a body applied the key's effect upstream."""
    return f"test:effects:applies:{idempotency_key}"


def runs_key(call_id: str) -> str:
    """How many times a tool body started for a call."""
    return f"test:effects:runs:{call_id}"


def keys_key(call_id: str) -> str:
    """The idempotency keys the attempts of a call used, in order."""
    return f"test:effects:keys:{call_id}"


def compensated_ref_key(idempotency_key: str) -> str:
    """The upstream reference the compensation of a call received."""
    return f"test:effects:compensated-ref:{idempotency_key}"


class InvalidTitle(Exception):
    """The tool's own validation error: nothing was sent upstream."""


_REQUEST = httpx.Request("POST", "https://upstream.invalid/tickets")


def _fail(failure: Failure) -> None:
    """Raise what a real client raises for ``failure``."""
    if failure == "timeout":
        raise TimeoutError("The read operation timed out")
    if failure == "reset":
        raise ConnectionResetError(104, "Connection reset by peer")
    if failure == "httpx_read_timeout":
        raise httpx.ReadTimeout("timed out", request=_REQUEST)
    if failure == "refused":
        raise ConnectionRefusedError(111, "Connection refused")
    if failure == "declined":
        raise NotExecuted("the upstream declined the request: card expired")
    if failure == "definite":
        raise InvalidTitle("title must not be empty")
    status = {"http_502": 502, "http_429": 429, "http_404": 404}.get(failure)
    if status is not None:
        headers = {"Retry-After": "1"} if status == 429 else {}
        response = httpx.Response(status, headers=headers, request=_REQUEST)
        raise httpx.HTTPStatusError(f"HTTP {status}", request=_REQUEST, response=response)


def _start(ctx: ToolContext) -> None:
    side_effects().incr(runs_key(ctx.call_id))
    side_effects().rpush(keys_key(ctx.call_id), ctx.idempotency_key)


def _apply(ctx: ToolContext, value: str) -> None:
    side_effects().incr(applies_key(ctx.idempotency_key))
    side_effects().set(record_key(ctx.idempotency_key), value, nx=True)  # the upstream dedupes


async def _probe(ctx: ToolContext) -> ProbeResult:
    raw = side_effects().get(record_key(ctx.idempotency_key))
    if raw is None:
        return ProbeResult.not_applied(detail="no record for the idempotency key")
    if raw.startswith(b"WRONG "):
        return ProbeResult.wrong_effect(raw.decode(), detail="upstream holds another value")
    return ProbeResult.applied(f"found upstream: {raw.decode()}")


@tools.tool(effect="non_idempotent", timeout=5)
async def open_ticket(ctx: ToolContext, title: str, lose: Failure = "none") -> str:
    """Opens a ticket upstream, then (``lose``) the response is lost the way ``lose`` says."""
    _start(ctx)
    _apply(ctx, f"ticket {title}")
    await ctx.record_upstream_ref(f"T-{title}")
    _fail(lose)
    return f"opened ticket {title}"


open_ticket.probe(_probe)


@tools.tool(effect="idempotent", timeout=5)
async def put_value(ctx: ToolContext, value: str, first: Failure = "none") -> str:
    """An idempotent write (no probe): attempt 1 fails before applying, as ``first`` says."""
    _start(ctx)
    if ctx.attempt == 1:
        _fail(first)
    _apply(ctx, value)
    return f"stored {value}"


@tools.tool(effect="idempotent", timeout=5, definite_errors=[InvalidTitle])
async def refused(ctx: ToolContext, why: Failure) -> str:
    """An upstream that refuses every request, the way ``why`` says (nothing is applied)."""
    _start(ctx)
    _fail(why)
    return "unreachable"


@tools.tool(effect="non_idempotent", timeout=5, definite_errors=[InvalidTitle])
async def file_claim(ctx: ToolContext, title: str) -> str:
    """Validates, then files a claim; its own validation error is a definite failure."""
    _start(ctx)
    if not title:
        raise InvalidTitle("title must not be empty")
    _apply(ctx, f"claim {title}")
    return f"filed {title}"


file_claim.probe(_probe)


@tools.tool(effect="non_idempotent", timeout=5)
async def submit_order(ctx: ToolContext, item: str) -> str:
    """Non-idempotent, no probe: under the release gate, a human confirms every call."""
    _start(ctx)
    _apply(ctx, f"order {item}")
    return f"ordered {item}"


@tools.tool(effect="non_idempotent", timeout=60)
async def book_seat(ctx: ToolContext, seat: str, hang_s: float = 0) -> str:
    """Books the wrong seat upstream, records the booking id, then hangs (``hang_s``)."""
    _start(ctx)
    _apply(ctx, f"WRONG {seat}")
    await ctx.record_upstream_ref(f"B-{seat}")
    await asyncio.sleep(hang_s)
    return f"booked {seat}"


book_seat.probe(_probe)


@book_seat.compensate
async def _cancel_booking(ctx: ToolContext, original_output: str) -> str:
    side_effects().set(compensated_ref_key(ctx.idempotency_key), ctx.upstream_ref or "")
    side_effects().set(record_key(ctx.idempotency_key), "CANCELLED")
    return f"cancelled booking {ctx.upstream_ref}"


@tools.tool(effect="read_only")
async def peek(what: str) -> str:
    """A read: never held, never gated."""
    return f"saw {what}"
