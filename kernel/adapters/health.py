"""Liveness and readiness of a service process, for ``/livez`` and ``/readyz``.

Liveness is the event loop's own heartbeat: a task in the loop beats every second, and the
HTTP thread answers 200 only while the last beat is recent (``LIVE_BOUND_S``). A loop wedged
by blocking code stops beating, so a probe fails even though the HTTP thread still answers.

Readiness is what the service needs to do its work: Kafka and Redis answered the last checks,
the service's consumers have their partitions, and it is not shutting down. ``watch`` runs the
checks from inside the loop; the HTTP thread only reads their results.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

LIVE_BOUND_S = 10.0
"""A loop that has not beaten for this long is reported dead (``/livez`` 503)."""
BEAT_INTERVAL_S = 1.0
CHECK_INTERVAL_S = 2.0
CHECK_TIMEOUT_S = 1.5
NUDGED_CHECK_INTERVAL_S = 0.5
"""Checks asked for by a retry loop run at most this often (a loop failing 20 times a second
must not become 20 checks a second)."""


@dataclass
class Health:
    """What ``/livez`` and ``/readyz`` report; written by the loop, read by the HTTP thread."""

    beat: float = field(default_factory=time.monotonic)
    checks: dict[str, bool] = field(default_factory=dict)
    """Named conditions of readiness (kafka, redis, assigned, not stopping)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def set(self, name: str, ok: bool) -> None:
        """Record one readiness condition."""
        with self._lock:
            self.checks[name] = ok

    def live(self) -> bool:
        """Whether the event loop beat recently."""
        return time.monotonic() - self.beat < LIVE_BOUND_S

    def ready(self) -> tuple[bool, dict[str, bool]]:
        """Whether every readiness condition holds (none recorded yet: not ready), and which."""
        with self._lock:
            checks = dict(self.checks)
        return bool(checks) and all(checks.values()) and self.live(), checks

    def reset(self) -> None:
        """Forget the readiness conditions (the service is being built again)."""
        with self._lock:
            self.checks.clear()


HEALTH = Health()
"""This process's health (one service per process)."""


Check = Callable[[], Awaitable[object]]
Report = Callable[[str, BaseException | None], None]
"""Told each check's result: its name and what it raised (None when it passed)."""


async def watch(
    checks: dict[str, Check],
    health: Health = HEALTH,
    *,
    report: Report | None = None,
    nudged: asyncio.Event | None = None,
) -> None:
    """Beat every second and run ``checks`` every few seconds, until cancelled.

    A check passes when it returns within ``CHECK_TIMEOUT_S`` without raising; each result
    goes to ``report`` too. Setting ``nudged`` runs the checks at the next beat instead of
    at the next interval (a retry loop met an error: is the dependency away?).
    """
    last_check = float("-inf")
    while True:
        health.beat = time.monotonic()
        since = health.beat - last_check
        asked = nudged is not None and nudged.is_set() and since >= NUDGED_CHECK_INTERVAL_S
        if asked or since >= CHECK_INTERVAL_S:
            if nudged is not None:
                nudged.clear()
            last_check = health.beat
            for name, check in checks.items():
                error: BaseException | None = None
                try:
                    await asyncio.wait_for(check(), CHECK_TIMEOUT_S)
                except Exception as exc:  # any failure means not ready
                    error = exc
                health.set(name, error is None)
                if report is not None:
                    report(name, error)
        if nudged is None:
            await asyncio.sleep(BEAT_INTERVAL_S)
        elif nudged.is_set():  # asked again right after a check: not before the interval
            await asyncio.sleep(NUDGED_CHECK_INTERVAL_S)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(nudged.wait(), BEAT_INTERVAL_S)
