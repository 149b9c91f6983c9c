"""Progress, exactly once: the cursor that decides what a reader shows, the rate limit and
the coalescing between a tool's reports and the topic, the tool API (pure: no broker)."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest
from agents import function_tool

from executors import ToolContext, ToolRegistry, current_tool_context
from executors._progress import ProgressPublisher
from kernel.adapters.topics import plan_topics
from kernel.errors import ToolfleetError
from kernel.rules.progress import ProgressCursor, judge
from kernel.settings import Settings
from kernel.tools import run_call
from kernel.tools._progress import Report, Throttle
from schemas import InvalidMessageError, ProgressEvent
from schemas.internal import PROGRESS_MESSAGE_MAX_BYTES
from tests.conftest import wait_for
from toolfleet.app.console._feed import Filter, LiveFeed
from toolfleet.testing import ToolEnvironment


def _event(attempt: int, sequence: int, call: str = "c1", **fields: Any) -> ProgressEvent:
    base: dict[str, Any] = {
        "tenant_id": "acme", "run_id": "r1", "turn_id": 0, "call_id": call, "tool_name": "t",
        "attempt": attempt, "sequence": sequence, "done": float(sequence), "at": 1.0,
    }  # fmt: skip
    return ProgressEvent(**(base | fields))


# --- the cursor ---------------------------------------------------------------------------------


def test_a_duplicate_is_shown_once() -> None:
    cursor = ProgressCursor()
    assert cursor.accept(_event(1, 1))
    assert not cursor.accept(_event(1, 1))
    assert cursor.accept(_event(1, 2))
    assert not cursor.accept(_event(1, 2))
    assert cursor.shown(("acme", "r1", "c1")) == (1, 2)


def test_an_event_overtaken_by_a_newer_one_is_never_shown() -> None:
    cursor = ProgressCursor()
    arriving = [_event(1, seq) for seq in (1, 3, 2, 4, 3, 5)]
    shown = [e.sequence for e in arriving if cursor.accept(e)]
    assert shown == [1, 3, 4, 5]


def test_a_retried_attempt_is_shown_from_its_first_event_and_told_apart() -> None:
    cursor = ProgressCursor()
    for seq in (1, 2, 3):
        assert cursor.accept(_event(1, seq))
    # The fleet ran the call again: attempt 2 counts from 1 again, and is shown.
    assert cursor.judge(_event(2, 1)) == "new_attempt"
    assert cursor.accept(_event(2, 1))
    # attempt 1's late (or duplicated) events are not, once attempt 2 is shown.
    assert not cursor.accept(_event(1, 3))
    assert not cursor.accept(_event(1, 4))
    assert cursor.judge(_event(2, 2)) == "next"
    assert cursor.accept(_event(2, 2))
    assert cursor.shown(("acme", "r1", "c1")) == (2, 2)


def test_calls_and_tenants_have_positions_of_their_own() -> None:
    cursor = ProgressCursor()
    assert cursor.accept(_event(1, 5, call="a"))
    assert cursor.accept(_event(1, 1, call="b"))  # another call: its own position
    assert cursor.accept(_event(1, 1, call="a", tenant_id="other"))  # same ids, other tenant
    assert len(cursor) == 3


def test_a_cursor_goes_on_from_saved_positions() -> None:
    first = ProgressCursor()
    for seq in (1, 2):
        first.accept(_event(1, seq))
    resumed = ProgressCursor(first.positions())
    assert not resumed.accept(_event(1, 2))
    assert resumed.accept(_event(1, 3))
    resumed.forget(("acme", "r1", "c1"))
    assert resumed.shown(("acme", "r1", "c1")) is None


def test_verdicts() -> None:
    assert judge(None, (1, 1)) == "first"
    assert judge(None, (3, 7)) == "first"  # a reader that opened late: whatever comes first
    assert judge((1, 1), (1, 2)) == "next"
    assert judge((1, 9), (2, 1)) == "new_attempt"
    assert judge((2, 1), (1, 9)) == "seen"
    assert judge((2, 1), (2, 1)) == "seen"


# --- the wire model and the topic -----------------------------------------------------------------


def test_the_event_is_bounded_and_refuses_nonsense() -> None:
    long = _event(1, 1, message="é" * 5_000)
    assert long.message is not None and len(long.message.encode()) <= PROGRESS_MESSAGE_MAX_BYTES
    assert ProgressEvent.decode(long.encode()) == long
    raw = _event(1, 1).model_dump(exclude_none=True)
    for field, value in [
        ("sequence", 0), ("attempt", 0), ("done", -1), ("done", True), ("done", "3"),
        ("total", -1), ("kind", "heartbeat"),
    ]:  # fmt: skip
        with pytest.raises(InvalidMessageError, match=field):
            ProgressEvent.decode(json.dumps(raw | {field: value}))


def test_the_progress_topic_is_planned_short_lived_and_not_compacted() -> None:
    plan = {t.logical: t for t in plan_topics(Settings(), ["default"])}
    configs = plan["progress"].configs
    assert configs["retention.ms"] == str(24 * 3600 * 1000)
    assert "cleanup.policy" not in configs  # deleted by age: every event is its own record


# --- the rate limit (pure) ----------------------------------------------------------------------


def _report(done: float) -> Report:
    return Report(done, None, None, 0.0)


def test_the_throttle_sends_at_once_then_holds_only_the_newest_report() -> None:
    throttle = Throttle(0.25)
    assert throttle.offer(_report(1), now=10.0) == _report(1)
    assert throttle.offer(_report(2), now=10.1) is None
    assert throttle.offer(_report(3), now=10.2) is None  # replaces 2: progress is a gauge
    assert throttle.due_in(10.2) == pytest.approx(0.05)
    assert throttle.take_due(10.2) is None  # not yet
    assert throttle.take_due(10.25) == _report(3)
    assert throttle.take_due(10.3) is None  # nothing held
    # Held reports go out in order: one arriving while another is held is held too.
    assert throttle.offer(_report(4), now=10.3) is None
    assert throttle.offer(_report(5), now=10.6) is None  # replaces 4, which a timer would send
    assert throttle.take_due(10.6) == _report(5)


def test_the_throttle_gives_up_what_it_holds_when_the_call_ends() -> None:
    throttle = Throttle(10.0)
    assert throttle.offer(_report(1), now=0.0) == _report(1)
    assert throttle.offer(_report(2), now=0.1) is None
    assert throttle.take(now=0.2) == _report(2)
    assert throttle.take(now=0.3) is None


def test_no_interval_sends_every_report() -> None:
    throttle = Throttle(0.0)
    assert [throttle.offer(_report(d), now=1.0) for d in (1, 2, 3)] == [
        _report(1), _report(2), _report(3),
    ]  # fmt: skip


# --- the tool API, through the runner ----------------------------------------------------------

tools = ToolRegistry()


@tools.tool(effect="read_only", timeout=10)
async def steps(ctx: ToolContext, n: int) -> str:
    """Reports n steps, one after the other, as fast as it can."""
    for i in range(1, n + 1):
        await ctx.report_progress(i, n, f"step {i}")
    return "done"


@tools.tool(effect="read_only")
def sync_steps(ctx: ToolContext, n: int) -> str:
    """A sync tool (it runs in a thread) reporting n steps."""
    for i in range(1, n + 1):
        ctx.report_progress_blocking(i, n)
    return "done"


@tools.tool(effect="read_only", timeout=10)
async def bad_progress(ctx: ToolContext, done: Any) -> str:
    """Reports what it is given."""
    await ctx.report_progress(done)
    return "reported"


async def test_every_report_is_an_event_numbered_from_1_per_attempt() -> None:
    env = ToolEnvironment(tenant_id="acme", run_id="r1")
    outcome = await env.run(steps, {"n": 3}, call_id="c1")
    retried = await env.run(steps, {"n": 2}, call_id="c1", attempt=2)
    assert (outcome.status, retried.status) == ("succeeded", "succeeded")
    assert [(e.attempt, e.sequence, e.done, e.total, e.message) for e in env.progress] == [
        (1, 1, 1.0, 3.0, "step 1"), (1, 2, 2.0, 3.0, "step 2"), (1, 3, 3.0, 3.0, "step 3"),
        (2, 1, 1.0, 2.0, "step 1"), (2, 2, 2.0, 2.0, "step 2"),
    ]  # fmt: skip
    first = env.progress[0]
    assert (first.tenant_id, first.run_id, first.call_id, first.tool_name) == (
        "acme", "r1", "c1", "steps",
    )  # fmt: skip
    assert "step" not in (outcome.output or "")  # progress never enters the outcome


async def test_a_sync_tool_reports_from_its_thread() -> None:
    env = ToolEnvironment()
    outcome = await env.run(sync_steps, {"n": 4})
    assert outcome.status == "succeeded"
    assert [e.sequence for e in env.progress] == [1, 2, 3, 4]
    assert [e.done for e in env.progress] == [1.0, 2.0, 3.0, 4.0]


async def test_reports_sooner_than_the_interval_coalesce_into_the_newest_at_the_end() -> None:
    env = ToolEnvironment(progress_interval_s=60.0)
    await env.run(steps, {"n": 50})
    # The first at once, the 49 others held one at a time: the newest goes out at the end.
    assert [(e.sequence, e.done) for e in env.progress] == [(1, 1.0), (2, 50.0)]


@pytest.mark.parametrize("done", [-1, True, "3", None])
async def test_a_nonsense_report_is_the_tools_error(done: Any) -> None:
    env = ToolEnvironment()
    outcome = await env.run(bad_progress, {"done": done})
    assert outcome.status == "failed"
    assert outcome.error is not None and "report_progress needs done" in outcome.error.message
    assert env.progress == []


@tools.tool(effect="read_only", timeout=10)
async def nonfinite(ctx: ToolContext, kind: str) -> str:
    """Reports a NaN or an infinity."""
    await ctx.report_progress(math.nan if kind == "nan" else math.inf)
    return "reported"


@pytest.mark.parametrize("kind", ["nan", "inf"])
async def test_a_non_finite_report_is_the_tools_error(kind: str) -> None:
    env = ToolEnvironment()
    outcome = await env.run(nonfinite, {"kind": kind})
    assert outcome.error is not None and "finite number" in outcome.error.message


async def test_outside_a_worker_a_report_goes_nowhere() -> None:
    ctx = ToolContext(
        tenant_id="t", run_id="r", turn_id=0, call_id="c", tool_name="x", arguments="{}",
        idempotency_key="k", attempt=1, fencing_token=1,
    )  # fmt: skip
    await ctx.report_progress(1, 2, "fine")
    ctx.report_progress_blocking(2, 2)
    with pytest.raises(ToolfleetError, match="report_progress needs total"):
        await ctx.report_progress(1, -2)


@tools.tool(effect="read_only", timeout=10)
async def paced(ctx: ToolContext) -> str:
    """Reports 1 then 2 at once (2 is held), waits until 2 was sent, then reports 3."""
    await ctx.report_progress(1)
    await ctx.report_progress(2)
    await PACED_SENT_2.wait()
    await ctx.report_progress(3)
    return "done"


PACED_SENT_2 = asyncio.Event()


async def test_a_held_report_goes_out_when_its_time_comes_while_the_tool_runs() -> None:
    env = ToolEnvironment()
    sent: list[ProgressEvent] = []

    def sink(event: ProgressEvent) -> None:
        sent.append(event)
        if event.done == 2.0:
            PACED_SENT_2.set()

    PACED_SENT_2.clear()
    outcome = await run_call(
        paced, env.command(paced), worker_id="w", progress=sink, progress_interval_s=0.05
    )
    assert outcome.status == "succeeded"
    # 2 was sent by the timer while the tool waited for it; 3, held, when the call ended.
    assert [(e.sequence, e.done) for e in sent] == [(1, 1.0), (2, 2.0), (3, 3.0)]


@tools.tool(effect="read_only", timeout=10)
async def leaves_a_reporter_behind(ctx: ToolContext) -> str:
    """Starts a task that reports once the test says the call has ended."""
    await ctx.report_progress(1)
    LEFT_BEHIND.append(asyncio.create_task(_late(ctx)))
    return "done"


LEFT_BEHIND: list[asyncio.Task[None]] = []
CALL_ENDED = asyncio.Event()


async def _late(ctx: ToolContext) -> None:
    await CALL_ENDED.wait()
    await ctx.report_progress(99)


async def test_reports_after_the_call_ended_are_ignored() -> None:
    env = ToolEnvironment()
    await env.run(leaves_a_reporter_behind, {})
    CALL_ENDED.set()
    await asyncio.gather(*LEFT_BEHIND)
    assert [e.done for e in env.progress] == [1.0]


# --- the worker's publisher: bounded, coalescing, never in the tool's way ---------------------


class _SlowBus:
    """Records what is published; each ack waits until the test releases it (a producer
    that fell behind)."""

    service = "test"

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes | None, ProgressEvent]] = []
        self.acks: list[asyncio.Future[None]] = []
        self.caught_up = False
        """From now on every ack is immediate."""

    async def publish(
        self, topic: str, key: str | bytes | None, value: Any, headers: Any = None,
        partition: int | None = None,
    ) -> asyncio.Future[None]:  # fmt: skip
        raw_key = key.encode() if isinstance(key, str) else key
        self.published.append((topic, raw_key, value))
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.acks.append(ack)
        if self.caught_up:
            ack.set_result(None)
        return ack

    def release(self, *, for_good: bool = False) -> None:
        self.caught_up = self.caught_up or for_good
        for ack in self.acks:
            if not ack.done():
                ack.set_result(None)


async def test_a_publisher_behind_sends_only_the_newest_event_of_each_call() -> None:
    bus = _SlowBus()
    publisher = ProgressPublisher(bus, max_calls=2)  # type: ignore[arg-type]
    publisher.start()
    try:
        publisher.offer(_event(1, 1, call="a"))

        async def in_flight() -> int:
            return len(bus.published)

        await wait_for(in_flight)  # a1 is with the producer, unacknowledged
        publisher.offer(_event(1, 2, call="a"))
        publisher.offer(_event(1, 3, call="a"))  # replaces a2
        publisher.offer(_event(1, 1, call="b"))
        publisher.offer(_event(1, 1, call="c"))  # a third call: over the bound, dropped
        assert (publisher.queued, publisher.replaced, publisher.dropped) == (2, 1, 1)
        assert len(bus.published) == 1  # one batch in flight at a time
        bus.release()

        async def all_sent() -> bool:
            bus.release()
            return publisher.sent == 3

        await wait_for(all_sent)
    finally:
        bus.release(for_good=True)
        await publisher.stop()
    assert [(t, k, e.call_id, e.sequence) for t, k, e in bus.published] == [
        ("progress", b"r1", "a", 1), ("progress", b"r1", "a", 3), ("progress", b"r1", "b", 1),
    ]  # fmt: skip


async def test_offering_never_waits_for_the_producer() -> None:
    bus = _SlowBus()  # never acknowledges
    publisher = ProgressPublisher(bus)  # type: ignore[arg-type]
    publisher.start()
    try:
        for seq in range(1, 1_001):
            publisher.offer(_event(1, seq))  # plain calls: nothing here could wait
        assert publisher.queued <= 1
    finally:
        bus.release(for_good=True)
        await publisher.stop()


# --- the console's feed -------------------------------------------------------------------------


async def test_the_console_feed_passes_each_progress_event_on_once_for_its_tenant() -> None:
    feed = LiveFeed(Settings(), tenant="acme")
    subscribed = feed.subscribe(Filter())
    turns_only = feed.subscribe(Filter(), outcomes=False)
    assert subscribed is not None and turns_only is not None
    for event in [
        _event(1, 1),
        _event(1, 1),  # a duplicate
        _event(1, 1, tenant_id="globex"),  # another tenant's: not on acme's console
        _event(1, 2, message="x" * 2_000),
        _event(2, 1),  # the retry: its own attempt, from 1 again
        _event(1, 3),  # attempt 1, late: never after attempt 2 was shown
    ]:
        feed.take("progress", event.encode())
    shown = feed.recent(Filter())
    assert [(e.data["attempt"], e.data["sequence"]) for e in shown] == [(1, 1), (1, 2), (2, 1)]
    assert {(e.kind, e.tenant_id, e.data["call_id"], e.data["tool_name"]) for e in shown} == {
        ("progress", "acme", "c1", "t")
    }
    assert len(shown[1].data["message"].encode()) <= 500
    assert len(subscribed[0]) == 3
    assert len(turns_only[0]) == 0  # progress comes with the outcomes
    assert feed.recent(Filter(), outcomes=False) == []


def test_a_bounded_cursor_forgets_the_call_that_reported_least_recently() -> None:
    cursor = ProgressCursor(max_calls=2)
    assert cursor.accept(_event(1, 1, call="a"))
    assert cursor.accept(_event(1, 1, call="b"))
    assert cursor.accept(_event(1, 2, call="a"))  # a reported last: b is the least recent
    assert cursor.accept(_event(1, 1, call="c"))
    assert set(cursor) == {("acme", "r1", "a"), ("acme", "r1", "c")}


# --- an Agents SDK function tool ----------------------------------------------------------------


@function_tool
async def sdk_steps(n: int) -> str:
    """An SDK tool: the SDK has no progress API; the fleet's view of the call reports it."""
    ctx = current_tool_context()
    assert ctx is not None
    for i in range(1, n + 1):
        await ctx.report_progress(i, n)
    return "done"


async def test_an_sdk_function_tool_reports_through_the_fleets_view_of_its_call() -> None:
    tool = ToolRegistry().add_function_tool(sdk_steps, effect="read_only")
    env = ToolEnvironment()
    outcome = await env.run(tool, {"n": 2}, call_id="c9")
    assert outcome.status == "succeeded", outcome
    assert [(e.call_id, e.sequence, e.done, e.total) for e in env.progress] == [
        ("c9", 1, 1.0, 2.0), ("c9", 2, 2.0, 2.0),
    ]  # fmt: skip
