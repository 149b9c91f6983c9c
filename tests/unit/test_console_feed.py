"""The console's live feed without Kafka: summaries, filters, the ring and bounded queues."""

from __future__ import annotations

from kernel.settings import Settings
from schemas import CallOutcome, CallRecord, Interruption, TurnResult
from toolfleet.app.console._feed import Dropped, FeedEvent, Filter, LiveFeed, StatusChange


def _result(tenant: str, run: str, tool: str = "lookup") -> bytes:
    return TurnResult(
        tenant_id=tenant,
        run_id=run,
        turn_id=0,
        status="interrupted",
        calls=[CallRecord(call_id=f"{run}-a", tool_name=tool, status="succeeded",
                          effect="applied", attempts=1)],
        interruptions=[Interruption(call_id=f"{run}-b", tool_name="transfer",
                                    arguments='{"to": "secret"}')],
    ).encode()  # fmt: skip


def _outcome(tenant: str, run: str) -> bytes:
    return CallOutcome(
        tenant_id=tenant, run_id=run, turn_id=0, call_id=f"{run}-a", tool_name="lookup",
        index=0, attempt=1, fencing_token=1, status="succeeded", effect="applied",
        output="Lisbon: sunny",
    ).encode()  # fmt: skip


def _feed(**kw: object) -> LiveFeed:
    return LiveFeed(Settings(), **kw)  # type: ignore[arg-type]


async def test_a_turn_is_summarised_without_arguments_or_outputs() -> None:
    feed = _feed()
    feed.take("turn-results", _result("acme", "r1"))
    feed.take("outcomes", _outcome("acme", "r1"))
    turn, outcome = feed.recent(Filter())
    assert (turn.kind, outcome.kind) == ("turn", "outcome") and turn.seq < outcome.seq
    assert turn.data["calls"][0]["tool_name"] == "lookup"
    assert turn.data["interruptions"] == [
        {"call_id": "r1-b", "tool_name": "transfer", "reason": None}
    ]
    assert "secret" not in str(turn.data) and "sunny" not in str(outcome.data)
    assert turn.tools == {"lookup", "transfer"}


async def test_filters_match_tenant_run_and_tool_and_a_scoped_feed_drops_other_tenants() -> None:
    feed = _feed()
    for tenant, run, tool in [("acme", "r1", "lookup"), ("globex", "r2", "pay"),
                              ("acme", "r3", "pay")]:  # fmt: skip
        feed.take("turn-results", _result(tenant, run, tool))
    runs = [e.run_id for e in feed.recent(Filter(tenant="acme"))]
    assert runs == ["r1", "r3"]
    assert [e.run_id for e in feed.recent(Filter(tool="pay"))] == ["r2", "r3"]
    assert [e.run_id for e in feed.recent(Filter(tenant="acme", run="r3"))] == ["r3"]

    scoped = _feed(tenant="acme")
    scoped.take("turn-results", _result("globex", "r2"))
    scoped.take("outcomes", _outcome("globex", "r2"))
    assert scoped.recent(Filter()) == []


async def test_invalid_records_are_counted_and_skipped() -> None:
    feed = _feed()
    feed.take("turn-results", b"not json")
    feed.take("outcomes", b'{"tenant_id": "acme"}')
    assert (feed.invalid, feed.recent(Filter())) == (2, [])


async def test_the_ring_keeps_the_newest_and_a_subscriber_gets_the_backlog_then_live() -> None:
    feed = _feed(ring_size=3)
    for n in range(5):
        feed.take("turn-results", _result("acme", f"r{n}"))
    subscribed = feed.subscribe(Filter(), after=3)
    assert subscribed is not None
    subscription, backlog = subscribed
    assert [e.run_id for e in backlog] == ["r3", "r4"]  # kept: r2..r4; seen up to seq 3
    feed.take("turn-results", _result("acme", "r5"))
    feed.take("turn-results", _result("globex", "r6"))
    item = await subscription.next()
    assert isinstance(item, FeedEvent) and item.run_id == "r5"
    assert len(subscription) == 1  # every tenant: r6 too


async def test_a_slow_subscriber_loses_events_not_memory_and_is_told_how_many() -> None:
    feed = _feed(queue_size=2)
    subscribed = feed.subscribe(Filter(tenant="acme"), outcomes=False)
    assert subscribed is not None
    subscription, _ = subscribed
    for n in range(10):
        feed.take("turn-results", _result("acme", f"r{n}"))
        feed.take("turn-results", _result("globex", f"g{n}"))  # filtered out: not counted
        feed.take("outcomes", _outcome("acme", f"r{n}"))  # not wanted: not counted
    assert len(subscription) == 3  # two events and one notice, however many arrive
    got = [await subscription.next() for _ in range(3)]
    assert [e.run_id for e in got[:2] if isinstance(e, FeedEvent)] == ["r0", "r1"]
    assert got[2] == Dropped(8)
    feed.take("turn-results", _result("acme", "r10"))
    latest = await subscription.next()
    assert isinstance(latest, FeedEvent) and latest.run_id == "r10"


async def test_subscribers_are_limited_hear_state_changes_and_are_closed_on_stop() -> None:
    feed = _feed(max_subscribers=1)
    first = feed.subscribe(Filter())
    assert first is not None and feed.subscribe(Filter()) is None
    subscription, _ = first
    feed._set_state("live")
    assert await subscription.next() == StatusChange("live")
    await feed.stop()
    assert await subscription.next() is None
    feed.unsubscribe(subscription)
    assert feed.subscribers == 0
