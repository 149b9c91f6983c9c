"""Heartbeats and Temporal's kinds of per-tool timeout, without a broker: the watchdog in the
tool runner, the writer of a call's newest details, what a retry is given, the tool options,
and the rules (``kernel.rules.effects.timeout_verdict``, the CLASSIFICATION rows, the
schedule-to-start check, the state version that carries them)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from executors import (
    MAX_DETAILS_BYTES,
    HeartbeatTimeoutError,
    ToolContext,
    ToolRegistry,
    ToolTimeoutError,
    run_call,
)
from kernel.errors import ConfigurationError, ToolfleetError
from kernel.rules.effects import (
    CLASSIFICATION,
    Budgets,
    effect_for_class,
    review_rows,
    timeout_verdict,
)
from kernel.rules.outcomes import missed_schedule_to_start, not_started_in_time
from kernel.tools._heartbeat import Heartbeats, overdue_in
from tests.unit.test_runner import command

BUDGETS = Budgets(max_attempts=3, probe_budget=4, circuit_error_rate=0.5, circuit_window_s=60)


def make(func: Any, **options: Any) -> Any:
    options.setdefault("unattended", "a unit test of the runner's mechanics")
    return ToolRegistry().tool(name="tool", **options)(func)


class Written:
    """A heartbeat writer that keeps what it was handed, as the worker's ledger would."""

    def __init__(self) -> None:
        self.details: list[Any] = []
        self.wrote = asyncio.Event()

    async def __call__(self, raw: str) -> None:
        self.details.append(json.loads(raw))
        self.wrote.set()


# -- the watchdog ------------------------------------------------------------------------------


async def _beats_then_stops(ctx: ToolContext, beats: int = 1) -> str:
    for page in range(beats):
        await ctx.heartbeat({"page": page})
    await asyncio.Event().wait()  # hangs without a heartbeat: the watchdog must stop it
    return "never"


async def test_a_body_that_stops_heartbeating_is_cancelled_and_its_effect_is_unknown() -> None:
    tool = make(_beats_then_stops, heartbeat=0.2, effect="non_idempotent")
    written = Written()
    began = time.monotonic()
    outcome = await run_call(
        tool, command('{"beats": 2}'), worker_id="w", heartbeat=written, heartbeat_interval_s=60
    )
    assert time.monotonic() - began >= 0.2
    assert (outcome.status, outcome.effect, outcome.resolved) == ("timed_out", "unknown", False)
    assert outcome.error is not None and outcome.error.type == "HeartbeatTimeoutError"
    assert outcome.output == "Tool 'tool' sent no heartbeat for 0.2 seconds and was stopped."
    # Heartbeats that come together are one write, of the newest details: a retry resumes
    # from them.
    assert written.details == [{"page": 1}]


async def test_a_read_only_tool_that_stops_heartbeating_did_nothing() -> None:
    tool = make(_beats_then_stops, heartbeat=0.1, effect="read_only")
    outcome = await run_call(tool, command(), worker_id="w")
    assert (outcome.status, outcome.effect) == ("timed_out", "not_executed")


async def test_heartbeats_keep_a_body_running_past_its_heartbeat_timeout() -> None:
    async def steady(ctx: ToolContext) -> str:
        for page in range(8):
            await asyncio.sleep(0.05)  # wait-ok: the work between two heartbeats
            await ctx.heartbeat(page)
        return "done"

    began = time.monotonic()
    outcome = await run_call(make(steady, heartbeat=0.2), command(), worker_id="w")
    assert time.monotonic() - began > 0.2  # longer than one heartbeat timeout in all
    assert (outcome.status, outcome.effect, outcome.output) == ("succeeded", "applied", "done")


async def test_a_thread_tool_heartbeats_through_the_blocking_twin() -> None:
    def sync_tool(ctx: ToolContext) -> str:
        ctx.heartbeat_blocking({"rows": 10})
        return "done"

    written = Written()
    outcome = await run_call(make(sync_tool), command(), worker_id="w", heartbeat=written)
    assert outcome.status == "succeeded"
    assert written.details == [{"rows": 10}]


async def test_start_to_close_is_the_timeout_and_says_so() -> None:
    async def slow() -> str:
        await asyncio.Event().wait()
        return "never"

    outcome = await run_call(make(slow, start_to_close=0.05), command(), worker_id="w")
    assert (outcome.status, outcome.effect) == ("timed_out", "unknown")
    assert outcome.error is not None and outcome.error.type == "ToolTimeoutError"
    assert outcome.output == "Tool 'tool' timed out after 0.05 seconds."


def test_a_heartbeat_timeout_is_a_tool_timeout_for_the_formatters() -> None:
    error = HeartbeatTimeoutError("tool", 3)
    assert isinstance(error, ToolTimeoutError) and error.timeout_seconds == 3
    assert str(error) == "Tool 'tool' sent no heartbeat for 3 seconds and was stopped."


def test_the_watchdog_is_due_when_no_heartbeat_came_within_the_timeout() -> None:
    assert overdue_in(last_beat=10.0, timeout_s=5.0, now=12.0) == 3.0
    assert overdue_in(last_beat=10.0, timeout_s=5.0, now=15.0) == 0.0
    assert overdue_in(last_beat=10.0, timeout_s=5.0, now=16.0) < 0


# -- the writer of a call's newest details -----------------------------------------------------


async def test_at_most_one_write_per_interval_the_newest_details_kept() -> None:
    now = [100.0]
    written = Written()
    beats = Heartbeats(written, min_interval_s=10, clock=lambda: now[0])
    for page in range(3):
        beats.beat(json.dumps(page))  # one loop turn: each replaces the one before
    async with asyncio.timeout(5):
        await written.wrote.wait()
    assert written.details == [2]
    beats.beat("3")
    beats.beat("4")
    await asyncio.sleep(0)  # wait-ok: loop turns in which nothing may be written
    await asyncio.sleep(0)  # wait-ok: (the interval, 10 s on the test's clock, has not passed)
    assert written.details == [2]
    await beats.close()  # the call ended: the newest pending details are written now
    assert written.details == [2, 4]
    beats.beat("5")  # after the call ended: ignored
    assert beats.beats == 5 and written.details == [2, 4]


async def test_details_must_be_json_and_small() -> None:
    ctx = ToolContext.from_command(command())
    with pytest.raises(ToolfleetError, match="JSON"):
        await ctx.heartbeat(object())
    with pytest.raises(ToolfleetError, match="cursor"):
        await ctx.heartbeat("x" * MAX_DETAILS_BYTES)
    await ctx.heartbeat({"ok": [1, 2]})  # outside a worker: checked, then nowhere


def test_a_retry_is_given_the_details_of_the_earlier_attempt() -> None:
    retried = command(attempt=2, heartbeat_details='{"page": 7}')
    assert ToolContext.from_command(retried).heartbeat_details == {"page": 7}
    assert ToolContext.from_command(command()).heartbeat_details is None


# -- the tool options --------------------------------------------------------------------------


async def _noop() -> None:
    return None


def test_the_options_reach_the_published_spec() -> None:
    tool = make(_noop, schedule_to_start=30, start_to_close=5, heartbeat=2)
    spec = tool.spec("default")
    assert (spec.timeout_s, spec.schedule_to_start_s, spec.heartbeat_timeout_s) == (5, 30, 2)
    assert make(_noop, timeout=5, start_to_close=5).timeout == 5


def test_contradicting_or_impossible_timeouts_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="one setting"):
        make(_noop, timeout=5, start_to_close=6)
    with pytest.raises(ConfigurationError, match="heartbeat must be greater than 0"):
        make(_noop, heartbeat=0)

    def sync_tool() -> None:
        return None

    with pytest.raises(ConfigurationError, match="heartbeat is only supported for async"):
        make(sync_tool, heartbeat=1)
    assert make(sync_tool, schedule_to_start=1).schedule_to_start == 1  # measured before


# -- the rules ---------------------------------------------------------------------------------


def test_each_kind_of_timeout_maps_to_an_effect_in_one_place() -> None:
    assert timeout_verdict("schedule_to_start").effect == "not_executed"
    assert timeout_verdict("schedule_to_start").retry == "permanent"
    assert timeout_verdict("start_to_close").effect == "unknown"
    assert timeout_verdict("heartbeat").effect == "unknown"
    assert effect_for_class("read_only", timeout_verdict("heartbeat").effect) == "not_executed"
    rows = {signal.split(":")[0]: effect for signal, effect, _ in CLASSIFICATION}
    assert rows["schedule-to-start timeout"] == "not_executed"
    assert rows["heartbeat timeout"] == rows["start-to-close timeout"] == "unknown"


def test_tools_describe_shows_what_follows_each_kind_of_timeout() -> None:
    spec = (
        make(_noop, effect="non_idempotent").spec("default").model_copy(update={"has_probe": True})
    )
    rows = {r.signal.split(":")[0]: r for r in review_rows(spec, BUDGETS)}
    assert rows["heartbeat timeout"].may_have_applied == "maybe"
    assert "probe" in rows["heartbeat timeout"].first_action
    never = rows["schedule-to-start timeout"]
    assert (never.effect, never.may_have_applied) == ("not_executed", "no")
    assert never.first_action == "reported to the model; never retried"


def test_schedule_to_start_counts_from_the_commands_issue() -> None:
    issued = command(issued_at=1000.0)
    assert not missed_schedule_to_start(issued, None, now=10_000.0)
    assert not missed_schedule_to_start(issued, 5.0, now=1004.0)
    assert missed_schedule_to_start(issued, 5.0, now=1005.5)
    outcome = not_started_in_time(issued, "w1", 5.0)
    assert (outcome.status, outcome.effect, outcome.retry) == (
        "timed_out", "not_executed", "permanent",
    )  # fmt: skip
    assert outcome.started_at is None and outcome.error is not None
    assert outcome.output == (
        "Tool 'tool' was not started within 5 seconds of the call (its schedule-to-start "
        "timeout). It had no effect."
    )
