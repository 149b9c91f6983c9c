"""The aggregator on the real Redis and Kafka: a plan and the outcomes right behind it in one
state update; a failed transaction that commits nothing and is read again; a turn whose update
fails for good is dead-lettered while every other run goes on."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError
from aiokafka.partitioner import DefaultPartitioner
from redis.asyncio import Redis

import kernel.adapters.bus
from aggregator.service import Aggregator
from kernel.adapters.bus import KafkaBus
from kernel.adapters.topics import ensure_topics
from kernel.settings import Settings
from kernel.stores.door import Stores
from schemas import CallOutcome, DeadLetter, PlannedCall, TurnPlan, TurnResult
from tests.conftest import aggregator_caught_up, wait_for
from toolfleet.testing import InMemoryBus

pytestmark = pytest.mark.integration


def _plan(run_id: str, calls: int = 2) -> TurnPlan:
    planned = [
        PlannedCall(call_id=f"{run_id}-{i}", tool_name="add", index=i, arguments="{}",
                    disposition="dispatch")
        for i in range(calls)
    ]  # fmt: skip
    return TurnPlan(
        tenant_id="t", run_id=run_id, turn_id=0, response_id="resp", agent_name="assistant",
        calls=planned, planned_at=1.0,
    )  # fmt: skip


def _outcome(run_id: str, i: int) -> CallOutcome:
    return CallOutcome(
        tenant_id="t", run_id=run_id, turn_id=0, call_id=f"{run_id}-{i}", tool_name="add",
        index=i, attempt=1, fencing_token=1, status="succeeded", effect="applied",
        output=f"out-{i}",
    )  # fmt: skip


async def test_a_plan_with_its_outcomes_in_one_update_emits_what_one_by_one_would(
    redis: Redis, settings: Settings
) -> None:
    aggregator = Aggregator(
        settings, bus=InMemoryBus(settings=settings), stores=Stores(redis, settings)
    )
    together, apart = f"run-{uuid.uuid4().hex}", f"run-{uuid.uuid4().hex}"
    # Outcomes finish out of model order; the result lists them in model order either way.
    emitted = await aggregator.on_outcomes(
        [(_outcome(together, 1), "o:1"), (_outcome(together, 0), "o:0")],
        plan=(_plan(together), "p:0"),
    )
    assert await aggregator.on_plan(_plan(apart), ["p:1"]) == []
    one_by_one = await aggregator.on_outcomes([(_outcome(apart, 1), "o:3")])
    one_by_one += await aggregator.on_outcomes([(_outcome(apart, 0), "o:2")])
    assert len(emitted) == len(one_by_one) == 1
    result, expected = emitted[0].result, one_by_one[0].result
    assert result.status == expected.status == "completed"
    assert [o.output for o in result.outputs] == [o.output for o in expected.outputs]
    assert [o.output for o in result.outputs] == ["out-0", "out-1"]
    assert [c.status for c in result.calls] == [c.status for c in expected.calls]
    # The run's turn is listed for cancellations, written in the same round trip.
    assert await redis.smembers(aggregator.keys.turns("t", together)) == {b"0"}
    assert await redis.ttl(aggregator.keys.turns("t", together)) > 0
    # A redelivered batch (its transaction never committed) emits again; a duplicate not.
    again = await aggregator.on_outcomes(
        [(_outcome(together, 0), "o:0")], plan=(_plan(together), "p:0")
    )
    assert [e.result.status for e in again] == ["completed"]
    late = await aggregator.on_outcomes([(_outcome(together, 1), "o:9")])
    assert late == []


async def test_a_resolution_before_the_plan_is_not_replaced_by_the_probes_outcome(
    redis: Redis, settings: Settings
) -> None:
    """Seed 34474: a call's unknown effect, the probe's outcome, the reconciler's resolution
    and the probe's again, all read before the turn's plan (another topic, a slower
    planner); the plan then finds the call settled and the turn's result goes out."""
    aggregator = Aggregator(
        settings, bus=InMemoryBus(settings=settings), stores=Stores(redis, settings)
    )
    run = f"run-{uuid.uuid4().hex}"
    unknown = _outcome(run, 0).model_copy(
        update={"status": "failed", "effect": "unknown", "resolved": False, "output": None}
    )
    probe = _outcome(run, 0).model_copy(update={"kind": "probe", "source": "reconciler"})
    resolution = _outcome(run, 0).model_copy(update={"source": "reconciler"})
    for n, early in enumerate([unknown, _outcome(run, 1), probe, resolution, probe, unknown]):
        assert await aggregator.on_outcomes([(early, f"o:{n}")]) == []
    emitted = await aggregator.on_plan(_plan(run), ["p:0"])
    assert [e.result.status for e in emitted] == ["completed"]
    assert [o.output for o in emitted[0].result.outputs] == ["out-0", "out-1"]


@pytest.fixture
async def own(settings: Settings) -> AsyncIterator[Settings]:
    """Topics of this test alone: no other aggregator of the session shares its group."""
    own = settings.model_copy(update={"topic_prefix": f"aggtxn-{uuid.uuid4().hex[:8]}."})
    names = await ensure_topics(own)
    yield own
    admin = AIOKafkaAdminClient(bootstrap_servers=own.kafka_servers())
    await admin.start()
    try:
        await admin.delete_topics(names)
    finally:
        await admin.close()


async def _publish_plans(bus: KafkaBus, runs: list[str], calls: int) -> None:
    for run in runs:
        await bus.publish_and_wait("plans", run, _plan(run, calls))


async def _publish_outcomes(bus: KafkaBus, runs: list[str], calls: int) -> None:
    for run in runs:
        for i in reversed(range(calls)):
            await bus.publish_and_wait("outcomes", run, _outcome(run, i))


async def _ends(settings: Settings, topic: str) -> dict[int, int]:
    """The end offset of each partition of ``topic``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_servers())
    await consumer.start()
    try:
        partitions = [TopicPartition(settings.topic(topic), p) for p in range(settings.partitions)]
        return {tp.partition: end for tp, end in (await consumer.end_offsets(partitions)).items()}
    finally:
        await consumer.stop()


async def _results(settings: Settings, topic: str = "turn-results") -> list[TurnResult]:
    """Every committed TurnResult on the topic."""
    return [TurnResult.decode(raw) for raw in await _committed(settings, topic)]


async def _committed(settings: Settings, topic: str) -> list[bytes]:
    """The value of every committed record on ``topic``."""
    partitions = [TopicPartition(settings.topic(topic), p) for p in range(settings.partitions)]
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_servers(),
        isolation_level="read_committed",
        enable_auto_commit=False,
    )
    consumer.assign(partitions)
    await consumer.start()
    try:
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        found: list[bytes] = []
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            batch = await consumer.getmany(timeout_ms=500)
            found += [r.value or b"" for rs in batch.values() for r in rs]
        return found
    finally:
        await consumer.stop()


def _runs_in(settings: Settings, partitions: set[int], count: int) -> list[str]:
    """Run ids whose records go to ``partitions`` (of every run-keyed topic)."""
    every = list(range(settings.partitions))
    runs: list[str] = []
    while len(runs) < count:
        run = f"run-{uuid.uuid4().hex}"
        if DefaultPartitioner()(run.encode(), every, every) in partitions:
            runs.append(run)
    return runs


async def test_a_failed_transaction_is_read_again_and_every_turn_is_emitted_once(
    own: Settings, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Turns of two calls on partition 0 and of one call on the others; the outcomes of the
    # latter come after the transaction that fails, whose batch holds all the rest.
    first = _runs_in(own, {0}, 10)
    later = _runs_in(own, set(range(1, own.partitions)), 10)
    bus = KafkaBus(own, service="test")
    await bus.start()
    for runs, calls in ((first, 2), (later, 1)):
        await _publish_plans(bus, runs, calls)
    await _publish_outcomes(bus, first, 2)
    ends = {"plans": await _ends(own, "plans"), "outcomes": await _ends(own, "outcomes")}
    service = Aggregator(own, bus=KafkaBus(own, service="aggregator"), stores=Stores(redis, own))
    failed: list[Any] = []
    done: dict[tuple[str, int], int] = {}

    class FailsOnce(AIOKafkaProducer):  # type: ignore[misc]
        """The real producer; the transaction of the batch that ends all that was published
        first fails as when a broker goes away."""

        async def send_offsets_to_transaction(self, offsets: Any, group_id: str) -> None:
            done.update({(tp.topic, tp.partition): o for tp, o in offsets.items()})
            everything = all(
                done.get((own.topic(topic), p), 0) >= end
                for topic, partitions in ends.items()
                for p, end in partitions.items()
            )
            if not failed and everything:
                failed.append(offsets)
                raise KafkaConnectionError("injected: the broker went away mid-transaction")
            await super().send_offsets_to_transaction(offsets, group_id)

    monkeypatch.setattr(kernel.adapters.bus, "AIOKafkaProducer", FailsOnce)
    task = asyncio.create_task(service.run())
    try:
        await wait_for(lambda: asyncio.sleep(0, failed))
        await _publish_outcomes(bus, later, 1)
        await wait_for(lambda: aggregator_caught_up(own), within=60)
    finally:
        service.stop()
        await task
        await bus.stop()
    emitted = Counter(r.run_id for r in await _results(own))
    assert emitted == dict.fromkeys(first + later, 1)


async def test_a_turn_whose_update_fails_for_good_is_dead_lettered_and_the_rest_go_on(
    own: Settings, redis: Redis
) -> None:
    """Something else holds the poisoned turn's key (a list): its update fails in Redis on
    every attempt. Crashing would meet the same records after every restart."""
    runs = [f"run-{uuid.uuid4().hex}" for _ in range(4)]
    poisoned = runs[1]
    service = Aggregator(own, bus=KafkaBus(own, service="aggregator"), stores=Stores(redis, own))
    await redis.rpush(service.keys.turn("t", poisoned, 0), "not a turn")
    bus = KafkaBus(own, service="test")
    await bus.start()
    await _publish_plans(bus, runs, 1)
    await _publish_outcomes(bus, runs, 1)
    task = asyncio.create_task(service.run())
    try:
        await wait_for(lambda: aggregator_caught_up(own), within=60)
        assert not task.done(), "the aggregator must keep running"
    finally:
        service.stop()
        await task
        await bus.stop()
    emitted = Counter(r.run_id for r in await _results(own))
    assert emitted == {run: 1 for run in runs if run != poisoned}
    letters = [DeadLetter.model_validate_json(raw) for raw in await _committed(own, "dead-letter")]
    assert sorted(letter.original_topic for letter in letters) == [
        own.topic("outcomes"), own.topic("plans"),
    ]  # fmt: skip
    assert all(letter.key == poisoned.encode() for letter in letters)
    assert all("WRONGTYPE" in letter.reason for letter in letters), letters[0].reason
