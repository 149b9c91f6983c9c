"""Spans are exported in batches: one log record per interval or per full batch."""

from __future__ import annotations

import asyncio
import logging

import pytest

from kernel.adapters.spans import SpanBatcher


def _exported(caplog: pytest.LogCaptureFixture) -> list[list[int]]:
    return [
        [span["n"] for span in record.spans]  # type: ignore[attr-defined]
        for record in caplog.records
        if record.name == "kernel.adapters.spans"
    ]


async def test_a_full_batch_is_logged_at_once_the_rest_after_the_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kernel.adapters.spans")
    batcher = SpanBatcher(interval_s=0.05, max_batch=3)
    for n in range(4):
        batcher.add({"n": n})
    assert _exported(caplog) == [[0, 1, 2]]
    for _ in range(100):  # the timer's flush, within a deadline
        if len(_exported(caplog)) == 2:
            break
        await asyncio.sleep(0.01)  # wait-ok: polling interval of a deadline-bounded wait
    assert _exported(caplog) == [[0, 1, 2], [3]]


async def test_flush_logs_what_is_queued_and_nothing_twice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kernel.adapters.spans")
    batcher = SpanBatcher(interval_s=60)
    batcher.add({"n": 1})
    batcher.flush()
    batcher.flush()
    assert _exported(caplog) == [[1]]
