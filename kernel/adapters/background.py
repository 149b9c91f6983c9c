"""The background tasks of a service: loops it runs beside its consume loop, each meant to run
until the service stops (a worker's capacity registration and lease renewal, a planner's
admission tick, the reconciler's tick).

Such a loop catches what it can recover from and goes on. One that ends anyway, on an
exception it did not catch or by returning, leaves its service half-alive: a worker whose slots
leave the pool's capacity once their registration expires, so every call waits; a planner that
no longer sweeps expired leases. ``BackgroundTasks`` does not let that pass in silence: the
task's error is logged at once with its traceback, the service is stopped (``stop``: it takes
no more work, in-flight calls finish), and ``raise_failure`` raises the error from the
service's ``run``. The process then exits and is restarted; an in-process fleet's ``check()``
reports it (``failure``) from the moment it happens.

asyncio's ``TaskGroup`` would cancel the consume loop instead (and its calls in flight), and
report a task that returned as a success.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import create_task as _create_task
from asyncio import wait as _wait
from collections.abc import Callable, Coroutine
from typing import Any

from kernel.errors import ToolfleetError

__all__ = ["BackgroundTaskEnded", "BackgroundTasks"]

log = logging.getLogger(__name__)


class BackgroundTaskEnded(ToolfleetError):
    """A service's background loop returned while the service ran (a bug: such a loop runs
    until the service stops); the service stopped. Report it with the service's log."""


class BackgroundTasks:
    """The loops a service runs beside its consume loop; one that ends stops the service.

    ``service`` names the service in the log and the error; ``stop`` is the service's own
    ``stop`` (it stops taking work and returns from ``run`` once in-flight work is done);
    ``stopping``, if given, is set once the service stops: a loop may return from then on.
    """

    def __init__(
        self, service: str, stop: Callable[[], None], *, stopping: asyncio.Event | None = None
    ) -> None:
        self.service = service
        self._stop = stop
        self._stopping = stopping
        self._tasks: dict[asyncio.Task[Any], str] = {}
        self._closing = False
        self.failure: tuple[str, BaseException] | None = None
        """The first task that ended on its own (its name) and why, if one did."""

    def start(self, name: str, loop: Coroutine[Any, Any, object]) -> asyncio.Task[Any]:
        """Run ``loop`` (``name``: what it does, for the log and the error) until ``close``."""
        # Bound at import (``_create_task``): a test sharing the event loop with an in-process
        # fleet may patch ``asyncio.create_task`` with a mock that runs nothing.
        task = _create_task(loop, name=f"{self.service}: {name}")
        self._tasks[task] = name
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        if self._closing or task.cancelled():  # cancelled by the service on its way out
            return
        error = task.exception()
        if error is None and self._stopping is not None and self._stopping.is_set():
            return  # a loop that ends when its service stops
        name = self._tasks.pop(task)
        if error is None:
            error = BackgroundTaskEnded(
                f"the {self.service}'s {name} returned while the service ran; it stopped. "
                "A bug: report it with this log"
            )
        else:
            error.add_note(f"(in the {self.service}'s {name}, a background task; it stopped)")
        log.error(
            "%s's %s ended; stopping the %s",
            self.service,
            name,
            self.service,
            exc_info=error,
            extra={"task": name},
        )
        if self.failure is None:
            self.failure = (name, error)
        self._stop()

    async def close(self) -> None:
        """Cancel every task and wait until each has ended (the service is stopping)."""
        self._closing = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await _wait(list(self._tasks))
        for task, name in self._tasks.items():
            error = None if task.cancelled() else task.exception()
            if error is not None:  # on its way out: said, not raised
                log.warning("%s's %s failed while stopping", self.service, name, exc_info=error)
        self._tasks.clear()

    def raise_failure(self) -> None:
        """Raise the error of the task that ended while the service ran, if one did."""
        if self.failure is not None:
            raise self.failure[1]
