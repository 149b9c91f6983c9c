"""Waiting by the one backoff policy (``kernel.rules.backoff.Backoff``) in the services.

A ``Backoff``'s wait n is within [step/2, step], ``step = min(cap_s, first_s * 2 ** (n - 1))``
(see ``kernel.rules.backoff``). Here the waits are run:

- ``retrying(policy, ...)``: a tenacity ``AsyncRetrying`` that sleeps by the policy, and whose
  sleeps end early when an ``asyncio.Event`` is set (a service stopping, a dependency back);
- ``nap``: one such sleep, for loops that decide themselves what an attempt's failure means
  (a consume loop that dead-letters some errors and retries others: ``policy.delay(n)``).

The named policies below are the services'; a new retry loop picks one of them (or a
``Backoff`` with its own first step and cap) rather than writing its own schedule.

Both wait through asyncio's functions as they were when this module was imported, not as
``asyncio.sleep`` is when they run: a test that shares its event loop with a fleet
(``toolfleet.testing.InProcessFleet``) may patch asyncio's functions module-wide, and the
services' loops that wait here must come out of it as they went in (a ``wait_for`` that never
times out, patched in by one of the Agents SDK's tests, once wedged every worker's capacity
registration for good); a background loop that waits for an event with a deadline uses
``nap(seconds, wake=event.wait)`` for that reason.
"""

from __future__ import annotations

import asyncio
import contextlib
from asyncio import ensure_future as _ensure_future
from asyncio import sleep as _sleep
from asyncio import wait as _wait
from collections.abc import Awaitable, Callable
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from kernel.rules.backoff import Backoff

__all__ = [
    "DEPENDENCY",
    "MESSAGE",
    "RECONNECT",
    "STEP",
    "TICK",
    "Backoff",
    "Interrupted",
    "nap",
    "retrying",
]


class Interrupted(Exception):
    """A backoff sleep ended because its ``until`` event was set (the loop should stop)."""


def retrying(
    policy: Backoff,
    retry_on: type[BaseException] | tuple[type[BaseException], ...],
    *,
    until: asyncio.Event | None = None,
    wake: Callable[[], Awaitable[Any]] | None = None,
    before_sleep: Callable[[RetryCallState], None] | None = None,
) -> AsyncRetrying:
    """An ``AsyncRetrying`` that retries on ``retry_on`` forever, sleeping by ``policy``.

    A sleep ends early, raising ``Interrupted``, once ``until`` is set; it ends early without
    raising (the next attempt comes at once) when ``wake()`` returns first (a dependency
    reported back). Any other exception is raised as it is.
    """

    async def sleep(seconds: float) -> None:
        await nap(seconds, until=until, wake=wake)

    options: dict[str, Any] = {}
    if before_sleep is not None:
        options["before_sleep"] = before_sleep
    return AsyncRetrying(
        wait=policy.wait(),
        retry=retry_if_exception_type(retry_on),
        sleep=sleep,
        reraise=True,
        **options,
    )


async def nap(
    seconds: float,
    *,
    until: asyncio.Event | None = None,
    wake: Callable[[], Awaitable[Any]] | None = None,
) -> None:
    """Sleep ``seconds``; raise ``Interrupted`` as soon as ``until`` is set, and return early
    when ``wake()`` returns."""
    if until is not None and until.is_set():
        raise Interrupted
    waiters: list[asyncio.Task[Any]] = []
    if until is not None:
        waiters.append(_ensure_future(until.wait()))
    if wake is not None:
        waiters.append(_ensure_future(wake()))
    if not waiters:
        await _sleep(seconds)
        return
    try:
        await _wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        for waiter in waiters:
            with contextlib.suppress(BaseException):
                await waiter
    if until is not None and until.is_set():
        raise Interrupted


DEPENDENCY = Backoff(first_s=0.5, cap_s=30.0)
"""Waiting for Kafka and Redis to answer (at start, and after a cut-off): a service that
cannot start retries every 30 s at most, and the dependency monitor wakes it as soon as a
check sees both answer again."""

MESSAGE = Backoff(first_s=0.2, cap_s=5.0)
"""Handling one record again after a dependency error (``ConsumeLoop``): short, because the
record's turn waits for it."""

STEP = Backoff(first_s=0.1, cap_s=5.0)
"""Repeating one step of a call (a worker's command, an outcome's write after the tool ran)."""

TICK = Backoff(first_s=0.5, cap_s=10.0)
"""A periodic background pass that failed (admission's tick, the reconciler's): the next pass
waits longer, instead of failing every period while a dependency is away."""

RECONNECT = Backoff(first_s=0.5, cap_s=10.0)
"""The console connecting to Kafka again (its bus, its live feed): a page waits for it."""
