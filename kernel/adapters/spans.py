"""Spans of tool calls, exported in batches as structured log records."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any

_log = logging.getLogger("kernel.adapters.spans")


class SpanBatcher:
    """Collects spans and logs them together: one record per ``interval_s`` or ``max_batch``.

    As OpenTelemetry's batch span processor does: a record per call would cost a worker more
    than the call itself. The record is ``{"msg": "spans", "spans": [...]}``; a process that
    dies without ``flush`` loses at most the last interval's spans, never an outcome.
    """

    def __init__(self, interval_s: float = 0.1, max_batch: int = 256) -> None:
        self.interval_s = interval_s
        self.max_batch = max_batch
        self._pending: list[dict[str, Any]] = []
        self._timer: asyncio.TimerHandle | None = None

    def add(self, span: dict[str, Any]) -> None:
        """Queue one span (needs a running event loop for the timed flush)."""
        self._pending.append(span)
        if len(self._pending) >= self.max_batch:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.interval_s, self.flush)

    def flush(self) -> None:
        """Log the queued spans now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pending:
            batch, self._pending = self._pending, []
            # A batch holds many calls' spans: logged outside any one call's log context.
            contextvars.Context().run(_log.info, "spans", extra={"spans": batch})
