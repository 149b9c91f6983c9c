"""Showing a call's progress exactly once: which progress events a reader shows.

Progress travels on its own topic and is delivered at least once: a producer's retry, a
consumer that reads a partition again, two replicas of a reader. Every event names its call
(tenant, run, call id), the attempt that reported it and its place in that attempt
(``sequence``, from 1). A reader keeps the last position it showed for each call and shows an
event only if its ``(attempt, sequence)`` comes strictly after it, compared attempt first:

- a duplicate, or an event overtaken by a newer one, is never shown;
- a retried attempt (the fleet ran the call again on another worker) counts its sequence from
  1 again, and is shown because its attempt is higher; once it is shown, the earlier attempt's
  late events are not.

MCP adds a rule of its own (``mcp_notice``): a token's ``progress`` must increase with every
``notifications/progress``. A retried attempt starts over from 1, so the door sends an event's
``done`` only while it grows past the last value sent for the token, and names the attempt in
the message of every notification a retried attempt (2 and later) sends.

Pure: no I/O. ``FleetClient.progress`` keeps a cursor per iterator, the MCP door one per task.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

CallKey = tuple[str, str, str]
"""(tenant_id, run_id, call_id): the call a progress event belongs to."""

Position = tuple[int, int]
"""(attempt, sequence): where an event stands among its call's events."""

Verdict = Literal["first", "next", "new_attempt", "seen"]
"""What an event is to a reader: the call's first event shown, the next one of the attempt
shown last, the first shown of a later attempt, or one to drop (a duplicate, or older than
what was shown)."""


class Positioned(Protocol):
    """The fields of a progress event the cursor reads (``schemas.ProgressEvent`` has them)."""

    @property
    def tenant_id(self) -> str: ...

    @property
    def run_id(self) -> str: ...

    @property
    def call_id(self) -> str: ...

    @property
    def attempt(self) -> int: ...

    @property
    def sequence(self) -> int: ...


def call_key(event: Positioned) -> CallKey:
    """The call ``event`` belongs to."""
    return (event.tenant_id, event.run_id, event.call_id)


def position(event: Positioned) -> Position:
    """Where ``event`` stands among its call's events."""
    return (event.attempt, event.sequence)


def judge(last: Position | None, at: Position) -> Verdict:
    """What an event at ``at`` is to a reader that last showed ``last`` for the same call."""
    if last is None:
        return "first"
    if at <= last:
        return "seen"
    return "new_attempt" if at[0] > last[0] else "next"


class ProgressCursor:
    """The last position shown for each call; ``accept`` says whether to show an event.

    Start it from saved positions (``positions()`` of an earlier cursor) to go on where another
    reader stopped, e.g. a door replica taking over a task. With ``max_calls`` it remembers at
    most that many calls, forgetting the one that reported least recently (a long-lived reader
    of every run, like the console's feed): a duplicate of a forgotten call's event would be
    shown again, so keep the bound well above the calls that report at once.
    """

    def __init__(
        self, shown: Mapping[CallKey, Position] | None = None, *, max_calls: int | None = None
    ) -> None:
        self._shown: dict[CallKey, Position] = dict(shown or {})
        self._max_calls = max_calls

    def judge(self, event: Positioned) -> Verdict:
        """What ``event`` would be to this reader (nothing is recorded)."""
        return judge(self._shown.get(call_key(event)), position(event))

    def accept(self, event: Positioned) -> bool:
        """Whether to show ``event``: True exactly when its position is after the last shown
        for its call, which it then becomes."""
        if self.judge(event) == "seen":
            return False
        key = call_key(event)
        self._shown.pop(key, None)  # re-inserted last: the dict's order is by last report
        self._shown[key] = position(event)
        if self._max_calls is not None and len(self._shown) > self._max_calls:
            del self._shown[next(iter(self._shown))]
        return True

    def shown(self, key: CallKey) -> Position | None:
        """The last position shown for the call ``key``; None before its first event."""
        return self._shown.get(key)

    def positions(self) -> dict[CallKey, Position]:
        """Every call's last shown position (to save, and start a cursor from)."""
        return dict(self._shown)

    def forget(self, key: CallKey) -> None:
        """Drop a call that will report no more (its cursor entry is no longer needed)."""
        self._shown.pop(key, None)

    def __iter__(self) -> Iterator[CallKey]:
        return iter(self._shown)

    def __len__(self) -> int:
        return len(self._shown)


@dataclass(frozen=True)
class Notice:
    """One ``notifications/progress`` the MCP door sends (its token aside)."""

    progress: float
    total: float | None
    message: str | None


def mcp_notice(
    sent: float | None, *, attempt: int, done: float, total: float | None, message: str | None
) -> Notice | None:
    """The notification for a progress event a reader shows (``ProgressCursor.accept``), or
    None to send nothing.

    ``sent`` is the last ``progress`` sent for the token (None: none yet). MCP asks that
    ``progress`` increase with every notification of a token, so an event whose ``done`` is
    not above it is held back: a retried attempt, which starts over, is quiet until it passes
    what the earlier attempt reached. Every notification of attempt 2 or later says
    ``attempt N`` at the front of its message, so a client sees that the call was run again.
    """
    if sent is not None and done <= sent:
        return None
    if attempt > 1:
        message = f"attempt {attempt}: {message}" if message else f"attempt {attempt}"
    return Notice(progress=done, total=total, message=message)
