"""The one backoff policy of toolfleet: capped exponential steps, each wait with equal jitter.

The n-th step is ``min(cap_s, first_s * 2 ** (n - 1))`` (tenacity's ``wait_exponential``);
the wait is half of that step plus a random part of the other half. The fixed half keeps
retries from hammering a server that just came back; the random half spreads a fleet's
retries, so that the instances of a service that lost Redis together do not return to it in
step. Every retry schedule in toolfleet is a ``Backoff``: a service's retry of a dependency
(``kernel.adapters.backoff`` names those and runs the waits), the fleet's retry of a call
that was not executed (``effects.retry_delay``), the reconciler's probes (their steps) and
the console's reconnects. Pure: the random part can be handed in, so decisions stay testable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tenacity import RetryCallState, Retrying
from tenacity.wait import wait_base, wait_exponential

_RETRYING = Retrying()
"""What a tenacity retry state belongs to (its wait strategies read only the attempt)."""


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with equal jitter: wait n is within [step/2, step], where
    ``step = min(cap_s, first_s * 2 ** (n - 1))``."""

    first_s: float
    """The first step (the first wait is between half of it and all of it)."""
    cap_s: float
    """The largest step: waits never exceed it, however many attempts failed."""

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.cap_s:
            raise ValueError(f"a backoff needs 0 < first_s <= cap_s, got {self}")

    @classmethod
    def capped(cls, first_s: float, cap_s: float) -> Backoff:
        """The policy whose first step is ``first_s``, or ``cap_s`` when that is larger."""
        return cls(min(first_s, cap_s), cap_s)

    def step(self, attempt: int) -> float:
        """The step after failed attempt number ``attempt`` (1 for the first), without
        jitter: what a schedule that must be exact (the reconciler's probes) waits."""
        state = RetryCallState(_RETRYING, None, (), {})
        state.attempt_number = max(1, attempt)
        return float(wait_exponential(multiplier=self.first_s, max=self.cap_s)(state))

    def delay(self, attempt: int, jitter: float | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1 for the first): half
        the step, plus ``jitter`` (in [0, 1); drawn when not given) of the other half."""
        step = self.step(attempt)
        part = random.random() if jitter is None else jitter
        return step / 2 + step / 2 * part

    def wait(self) -> wait_base:
        """This policy as a tenacity wait strategy (for ``AsyncRetrying``)."""
        return _Wait(self)


class _Wait(wait_base):
    """Tenacity's view of a ``Backoff``: the wait after each failed attempt."""

    def __init__(self, policy: Backoff) -> None:
        self.policy = policy

    def __call__(self, retry_state: RetryCallState) -> float:
        return self.policy.delay(retry_state.attempt_number)
