"""Running user code without letting its BaseExceptions escape, and naming what it raised."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from schemas import CallError, ErrorSeverity


@dataclass(frozen=True)
class Captured:
    """How the tool body ended: a value, or whatever it raised (BaseExceptions included)."""

    value: Any = None
    error: BaseException | None = None


# Tool tasks left running after a parent cancellation: referenced until they end, or the event
# loop could garbage-collect them mid-cleanup.
_ABANDONED: set[asyncio.Task[Captured]] = set()


def severity(exc: BaseException) -> ErrorSeverity:
    """Rank for the failure choice: a CancelledError, an Exception, or another BaseException."""
    if isinstance(exc, asyncio.CancelledError):
        return "cancellation"
    return "error" if isinstance(exc, Exception) else "base_exception"


def text_of(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in naming its class when that raises: a tool's exception whose
    text cannot be made must still become the call's outcome (the SDK's default failure text
    never reads it either)."""
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}: str() failed>"


def error_of(exc: BaseException, message: str) -> CallError:
    """The CallError for ``exc``: its class name, ``message`` and its severity."""
    return CallError(type=type(exc).__name__, message=message, severity=severity(exc))


async def capture(body: Awaitable[Any]) -> Captured:
    """Await the body and keep whatever it raised as a value.

    A BaseException escaping a task would be re-raised out of the event loop (KeyboardInterrupt,
    SystemExit) or logged as never retrieved; captured, it becomes this call's outcome.
    """
    try:
        return Captured(value=await body)
    except BaseException as exc:
        return Captured(error=exc)


def abandon(child: asyncio.Task[Captured]) -> None:
    """Cancel a body task without waiting for it, keeping it referenced until it ends."""
    child.cancel()
    _ABANDONED.add(child)
    child.add_done_callback(_ABANDONED.discard)
