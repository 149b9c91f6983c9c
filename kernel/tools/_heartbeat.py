"""A call attempt's heartbeats: the tool says it is alive, and what it has got through.

``ctx.heartbeat(details)`` does two things. It resets the call's heartbeat watchdog (a tool
declared with ``heartbeat=N`` whose body sends none for N seconds is cancelled, and its effect
is judged as a heartbeat timeout by ``kernel.rules.effects``). And it hands the details (any
JSON value, at most ``MAX_DETAILS_BYTES`` as JSON) to the worker, which keeps the newest in the
call's ledger entry, at most one write per ``min_interval_s`` for the call, and the newest one
when the call ends: a later attempt of the call (a retry) is given them as
``ctx.heartbeat_details``, so it can resume where the earlier one got to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic_core import PydanticSerializationError, from_json, to_json

from kernel.errors import ToolfleetError

log = logging.getLogger(__name__)

HeartbeatWriter = Callable[[str], Awaitable[None]]
"""Writes one attempt's newest heartbeat details (JSON text) durably: the worker's ledger."""

MAX_DETAILS_BYTES = 16_384
"""The largest heartbeat details, as JSON: a cursor or a checkpoint's id, not the data."""

HEARTBEAT_WRITE_S = 2.0
"""The default least interval between two ledger writes of one call's heartbeat details."""


def details_json(details: object) -> str:
    """``details`` as the JSON text kept in the ledger, or ToolfleetError saying why not."""
    try:
        raw = to_json(details).decode()
    except (PydanticSerializationError, ValueError, TypeError, RecursionError) as exc:
        raise ToolfleetError(
            f"heartbeat details must be JSON (dicts, lists, str, numbers, bool, None): {exc}"
        ) from None
    if len(raw.encode()) > MAX_DETAILS_BYTES:
        raise ToolfleetError(
            f"heartbeat details are {len(raw.encode())} bytes of JSON, more than "
            f"{MAX_DETAILS_BYTES}: keep a cursor or a checkpoint's id in them, not the data"
        )
    return raw


def parse_details(raw: str | None) -> Any:
    """The details a JSON text holds (None for none, or for text that is not JSON)."""
    if not raw:
        return None
    try:
        return from_json(raw)
    except ValueError:
        return None


def overdue_in(last_beat: float, timeout_s: float, now: float) -> float:
    """Pure: seconds until a body last heard from at ``last_beat`` misses its heartbeat
    timeout (<= 0: it has). Times are monotonic seconds."""
    return last_beat + timeout_s - now


class Heartbeats:
    """The heartbeats of one call attempt: when the last came, and its details to the writer.

    Lives on the event loop that runs the call. ``beat`` never waits: the newest details are
    written in the background, at most one write per ``min_interval_s`` (details that come
    sooner replace the pending ones); ``close`` writes the pending ones, if any, and ignores
    later beats.
    """

    def __init__(
        self,
        writer: HeartbeatWriter | None,
        *,
        min_interval_s: float = HEARTBEAT_WRITE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._writer = writer
        self._min_interval_s = min_interval_s
        self.clock = clock
        """The monotonic clock the watchdog reads."""
        self.last_beat = clock()
        """When the body was last heard from (monotonic): its start, or its last heartbeat."""
        self.beats = 0
        """Heartbeats received from the body."""
        self._pending: str | None = None
        self._last_write: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._hurry = asyncio.Event()
        self._closed = False

    def restart(self) -> None:
        """The body starts now: the watchdog counts from here."""
        self.last_beat = self.clock()

    def beat(self, raw: str) -> None:
        """The body is alive, and got this far (``raw``: the details' JSON)."""
        if self._closed:
            return
        self.last_beat = self.clock()
        self.beats += 1
        if self._writer is None:
            return
        self._pending = raw
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._drain(), name="heartbeat-writer"
            )

    async def close(self, *, flush: bool = True) -> None:
        """The call ended: write the pending details now (unless ``flush`` is False)."""
        self._closed = True
        task = self._task
        if task is None:
            return
        if not flush:
            task.cancel()
            return
        self._hurry.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)

    async def _drain(self) -> None:
        try:
            while self._pending is not None:
                if self._last_write is not None and not self._hurry.is_set():
                    wait = self._last_write + self._min_interval_s - self.clock()
                    if wait > 0:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._hurry.wait(), wait)
                raw, self._pending = self._pending, None
                self._last_write = self.clock()
                assert self._writer is not None
                try:
                    await self._writer(raw)
                except Exception:  # best-effort: the next heartbeat writes again
                    log.warning("heartbeat details not written", exc_info=True)
        finally:
            self._task = None
