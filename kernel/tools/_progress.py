"""A call attempt's progress reports: validated, numbered, rate-limited, handed to a sink.

A tool reports progress with ``ctx.report_progress(done, total, message)``. Reporting never
waits for the broker: the attempt's ``ProgressReporter`` turns at most one report per
``min_interval_s`` into a ``ProgressEvent`` (numbered from 1 within the attempt) and hands it
to the sink the runner was given, a function that only queues it (the worker's publisher).
A report that comes sooner is held back, replacing any report held before it: when its time
comes, or when the call ends, the newest one is sent. Progress is a gauge, so what a newer
report replaces is lost on purpose; the sequence numbers of the events sent have no gaps.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from kernel.errors import ToolfleetError
from kernel.settings import Settings
from schemas import ExecutionCommand, ProgressEvent

ProgressSink = Callable[[ProgressEvent], None]
"""Takes one progress event without waiting (the worker queues it for its producer)."""

PROGRESS_MIN_INTERVAL_S: float = Settings.model_fields["progress_min_interval_s"].default
"""The default rate limit of one call's progress events (``progress_min_interval_s``)."""


@dataclass(frozen=True)
class Report:
    """What a tool reported, before it is numbered."""

    done: float
    total: float | None
    message: str | None
    at: float
    """Unix time of the report."""


def checked_report(done: object, total: object, message: object) -> Report:
    """A tool's report, or ToolfleetError saying what is wrong with it."""
    for name, value, optional in (("done", done, False), ("total", total, True)):
        if value is None and optional:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise ToolfleetError(
                f"report_progress needs {name} as a finite number >= 0"
                f"{' or None' if optional else ''}, got {value!r}"
            )
    if message is not None and not isinstance(message, str):
        raise ToolfleetError(f"report_progress needs message as a str or None, got {message!r}")
    assert isinstance(done, int | float)
    assert total is None or isinstance(total, int | float)
    return Report(float(done), None if total is None else float(total), message, time.time())


class Throttle:
    """Pure: at most one event per ``min_interval_s``, the newest report held in between.

    ``offer`` says whether a report goes out now; otherwise it is held (replacing the one held
    before) and ``due_in`` says when it may go out. Times are monotonic seconds, passed in.
    """

    def __init__(self, min_interval_s: float) -> None:
        self.min_interval_s = min_interval_s
        self.last_sent: float | None = None
        self.held: Report | None = None

    def offer(self, report: Report, now: float) -> Report | None:
        """The report to send now (``report`` itself), or None: it is held."""
        if self.held is None and self._free(now):
            self.last_sent = now
            return report
        self.held = report
        return None

    def due_in(self, now: float) -> float:
        """Seconds until a held report may go out (0: now)."""
        if self.last_sent is None:
            return 0.0
        return max(0.0, self.last_sent + self.min_interval_s - now)

    def take_due(self, now: float) -> Report | None:
        """The held report, if its time has come; it counts as sent now."""
        if self.held is None or not self._free(now):
            return None
        return self.take(now)

    def take(self, now: float) -> Report | None:
        """The held report whatever the time (the call ended); it counts as sent now."""
        report, self.held = self.held, None
        if report is not None:
            self.last_sent = now
        return report

    def _free(self, now: float) -> bool:
        return self.last_sent is None or now - self.last_sent >= self.min_interval_s


class ProgressReporter:
    """The progress of one call attempt: numbers its events and sends them through ``sink``.

    Lives on the event loop that runs the call; ``report`` is called there (the context hands
    a thread's reports over). ``close`` sends what is held and ignores later reports (a task
    the tool left running after it returned, say).
    """

    def __init__(
        self,
        command: ExecutionCommand,
        sink: ProgressSink,
        *,
        min_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._command = command
        self._sink = sink
        self._clock = clock
        self._throttle = Throttle(min_interval_s)
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self.sequence = 0
        """The sequence number of the last event sent (0: none yet)."""

    def report(self, report: Report) -> None:
        """Send ``report`` now, or hold it until the rate limit allows."""
        if self._closed:
            return
        now = self._clock()
        ready = self._throttle.offer(report, now)
        if ready is not None:
            self._send(ready)
        elif self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._throttle.due_in(now), self._when_due)

    def close(self) -> None:
        """The call ended: send the report held back, if any; later reports are ignored."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held = self._throttle.take(self._clock())
        if held is not None:
            self._send(held)

    def _when_due(self) -> None:
        self._timer = None
        if self._closed:
            return
        now = self._clock()
        held = self._throttle.take_due(now)
        if held is not None:
            self._send(held)
        elif self._throttle.held is not None:  # woken early (a clock's rounding): once more
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._throttle.due_in(now), self._when_due)

    def _send(self, report: Report) -> None:
        self.sequence += 1
        command = self._command
        self._sink(
            ProgressEvent(
                tenant_id=command.tenant_id,
                run_id=command.run_id,
                turn_id=command.turn_id,
                call_id=command.call_id,
                tool_name=command.tool_name,
                attempt=command.attempt,
                sequence=self.sequence,
                done=report.done,
                total=report.total,
                message=report.message,
                at=report.at,
            )
        )
