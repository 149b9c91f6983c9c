"""The one backoff policy of toolfleet: capped exponential delays with equal jitter (tenacity).

Every retry of a dependency (Kafka, Redis) waits by a ``Backoff``: the n-th delay is
``step = min(cap_s, first_s * 2 ** (n - 1))`` and the wait is half of that step plus a random
part of the other half. The fixed half keeps retries from hammering a server that just came
back; the random half spreads a fleet's retries, so that the instances of a service that lost
Redis together do not return to it in step. The delays are tenacity's wait strategies
(``wait_exponential`` plus ``wait_random_exponential``), not arithmetic of our own.

- ``retrying(...)``: a tenacity ``AsyncRetrying`` that sleeps by the policy, and whose sleeps
  end early when an ``asyncio.Event`` is set (a service stopping, a dependency back);
- ``delay(n)``: the n-th delay, for loops that decide themselves what an attempt's failure
  means (a consume loop that dead-letters some errors and retries others).

The named policies below are the project's; a new retry loop picks one of them (or a
``Backoff`` with its own first step and cap) rather than writing its own schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type
from tenacity.wait import wait_base, wait_exponential, wait_random_exponential

__all__ = ["DEPENDENCY", "MESSAGE", "STEP", "TICK", "Backoff", "Interrupted"]


class Interrupted(Exception):
    """A backoff sleep ended because its ``until`` event was set (the loop should stop)."""


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with equal jitter: delay n is within [step/2, step], where
    ``step = min(cap_s, first_s * 2 ** (n - 1))``."""

    first_s: float
    """The first step (the first delay is between half of it and all of it)."""
    cap_s: float
    """The largest step: delays never exceed it, however many attempts failed."""

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.cap_s:
            raise ValueError(f"a backoff needs 0 < first_s <= cap_s, got {self}")

    def wait(self) -> wait_base:
        """The tenacity wait strategy: the fixed half of the step plus a random part of the
        other half (tenacity's own exponential and full-jitter waits, added)."""
        half, cap = self.first_s / 2, self.cap_s / 2
        fixed = wait_exponential(multiplier=half, max=cap)
        return fixed + wait_random_exponential(multiplier=half, max=cap)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1 for the first)."""
        state = RetryCallState(AsyncRetrying(), None, (), {})
        state.attempt_number = max(1, attempt)
        return float(self.wait()(state))

    def retrying(
        self,
        retry_on: type[BaseException] | tuple[type[BaseException], ...],
        *,
        until: asyncio.Event | None = None,
        wake: Callable[[], Awaitable[Any]] | None = None,
        before_sleep: Callable[[RetryCallState], None] | None = None,
    ) -> AsyncRetrying:
        """An ``AsyncRetrying`` that retries on ``retry_on`` forever, sleeping by this policy.

        A sleep ends early, raising ``Interrupted``, once ``until`` is set; it ends early
        without raising (the next attempt comes at once) when ``wake()`` returns first (a
        dependency reported back). Any other exception is raised as it is.
        """

        async def sleep(seconds: float) -> None:
            await nap(seconds, until=until, wake=wake)

        options: dict[str, Any] = {}
        if before_sleep is not None:
            options["before_sleep"] = before_sleep
        return AsyncRetrying(
            wait=self.wait(),
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
        waiters.append(asyncio.ensure_future(until.wait()))
    if wake is not None:
        waiters.append(asyncio.ensure_future(wake()))
    if not waiters:
        await asyncio.sleep(seconds)
        return
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
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
