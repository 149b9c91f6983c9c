"""The MCP door's progress rule (``kernel.rules.progress.mcp_notice``): a token's progress only
increases, and a retried attempt says so."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from kernel.rules.progress import Notice, mcp_notice


def _sent(events: Sequence[tuple[int, float]]) -> list[tuple[float, str | None]]:
    """(progress, message) of what the door sends for (attempt, done) events, in order."""
    sent: float | None = None
    out: list[tuple[float, str | None]] = []
    for attempt, done in events:
        notice = mcp_notice(sent, attempt=attempt, done=done, total=4.0, message=f"step {done:g}")
        if notice is not None:
            sent = notice.progress
            out.append((notice.progress, notice.message))
    return out


def test_the_first_event_is_sent_as_it_is() -> None:
    assert mcp_notice(None, attempt=1, done=0.0, total=None, message=None) == Notice(
        0.0, None, None
    )
    assert mcp_notice(None, attempt=1, done=2.5, total=10.0, message="copying") == Notice(
        2.5, 10.0, "copying"
    )


def test_progress_is_sent_only_while_it_grows() -> None:
    assert mcp_notice(3.0, attempt=1, done=3.0, total=4.0, message="again") is None
    assert mcp_notice(3.0, attempt=1, done=2.0, total=4.0, message="back") is None
    assert mcp_notice(3.0, attempt=1, done=3.5, total=4.0, message="on") == Notice(3.5, 4.0, "on")


def test_a_retried_attempt_is_quiet_until_it_passes_what_was_sent_then_names_itself() -> None:
    assert _sent([(1, 1), (1, 2), (2, 1), (2, 2), (2, 3), (2, 4)]) == [
        (1.0, "step 1"),
        (2.0, "step 2"),
        (3.0, "attempt 2: step 3"),
        (4.0, "attempt 2: step 4"),
    ]


def test_a_retry_that_goes_further_at_once_is_sent_with_its_attempt() -> None:
    assert _sent([(1, 1), (3, 2)]) == [(1.0, "step 1"), (2.0, "attempt 3: step 2")]
    assert mcp_notice(1.0, attempt=2, done=2.0, total=None, message=None) == Notice(
        2.0, None, "attempt 2"
    )


def test_sent_progress_strictly_increases_whatever_the_events() -> None:
    events = [(1, 1), (1, 1), (1, 3), (1, 2), (2, 1), (2, 3), (2, 4), (3, 0), (3, 5), (2, 6)]
    progress = [p for p, _ in _sent(events)]
    assert progress == [1.0, 3.0, 4.0, 5.0, 6.0]
    assert all(a < b for a, b in itertools.pairwise(progress))
