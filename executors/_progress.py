"""A worker's progress publisher: calls' progress events onto ``progress``, never in their way.

The tool runner hands each progress event to ``ProgressPublisher.offer``, which only queues it
and returns. One background task sends what is queued on the worker's plain idempotent
producer (not in any transaction: progress is not an outcome, and is never written to the
ledger), keyed by run id so a run's events keep their order, one batch in flight at a time.
While a batch is in flight each call keeps at most one event queued, its newest: a producer
that falls behind sends fewer events per call, never older ones, and the queue is bounded by
the calls that report at once (and ``max_calls``). Progress is best-effort: a batch Kafka
refuses is dropped (the calls' next reports follow), and a crash loses what was queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from kernel.adapters.bus import TRANSIENT_ERRORS, Bus
from kernel.adapters.dependencies import DEPENDENCIES
from kernel.rules.progress import CallKey, call_key
from schemas import ProgressEvent

log = logging.getLogger(__name__)

MAX_CALLS = 10_000
"""Calls with an event queued at once, at most; a new call's event past that is dropped."""

STOP_WITHIN_S = 5.0
"""How long a stopping worker tries to send the progress still queued."""


class ProgressPublisher:
    """Queues calls' progress events (``offer``) and publishes them (``run``)."""

    def __init__(self, bus: Bus, *, max_calls: int = MAX_CALLS) -> None:
        self._bus = bus
        self._max_calls = max_calls
        self._queued: dict[CallKey, ProgressEvent] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        """Events the broker acknowledged."""
        self.replaced = 0
        """Events a newer one of their call replaced before they were sent."""
        self.dropped = 0
        """Events dropped: too many calls queued, or Kafka refused their batch."""

    def offer(self, event: ProgressEvent) -> None:
        """Queue ``event`` in place of its call's queued one, if any; never waits."""
        key = call_key(event)
        if key in self._queued:
            self.replaced += 1
        elif len(self._queued) >= self._max_calls:
            self.dropped += 1
            return
        self._queued[key] = event
        self._wake.set()

    @property
    def queued(self) -> int:
        """Events waiting to be sent (one per call at most)."""
        return len(self._queued)

    def start(self) -> None:
        """Start publishing in the background (the bus is started)."""
        self._task = asyncio.create_task(self.run(), name="progress-publisher")

    async def stop(self, within_s: float = STOP_WITHIN_S) -> None:
        """Stop publishing, after one last try (bounded) to send what is queued."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._queued:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within_s):
                    await self._send_batch()

    async def run(self) -> None:
        """Publish what is queued, one batch at a time, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queued:
                await self._send_batch()

    async def _send_batch(self) -> None:
        batch = list(self._queued.values())
        self._queued.clear()
        acks: list[asyncio.Future[Any]] = []
        try:
            for event in batch:
                # No trace headers: a progress event belongs to no span of the fleet's.
                acks.append(await self._bus.publish("progress", event.run_id, event, headers=[]))
        except TRANSIENT_ERRORS as exc:
            DEPENDENCIES.failed(exc)  # said once by the dependency monitor
            self.dropped += len(batch) - len(acks)
        except Exception:  # a bug must not stop the worker's progress for good
            log.exception("could not queue progress events")
            self.dropped += len(batch) - len(acks)
        for answer in await asyncio.gather(*acks, return_exceptions=True):
            if isinstance(answer, BaseException):
                self.dropped += 1
                if isinstance(answer, TRANSIENT_ERRORS):
                    DEPENDENCIES.failed(answer)
                else:
                    log.warning("a progress event was not published", extra={"error": repr(answer)})
            else:
                self.sent += 1
