"""Consumer lag: the arithmetic, and the monitor over a consumer that answers like aiokafka's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition

from kernel.adapters.lag import LagMonitor, PartitionLag, partition_lag
from kernel.adapters.metrics import CONSUMER_LAG, REGISTRY


@pytest.mark.parametrize(
    ("highwater", "last_stable", "committed", "position", "lag"),
    [
        (120, 120, 100, 110, 20),  # committed, not position: fetched is not handled
        (120, 115, 100, 110, 15),  # an open transaction's records are not lag yet
        (120, -1, 100, 110, 20),  # read_uncommitted reports -1: the highwater
        (120, None, 100, 110, 20),  # an old broker reports none: the highwater
        (120, 120, None, 110, 10),  # a group that never committed: from the position
        (120, 120, 130, 110, 0),  # a commit ahead of a stale fetch is no negative lag
        (None, None, 100, 110, None),  # nothing fetched yet: unknown, not 0
        (120, 120, None, None, None),
    ],
)
def test_partition_lag(
    highwater: int | None,
    last_stable: int | None,
    committed: int | None,
    position: int | None,
    lag: int | None,
) -> None:
    found = partition_lag(
        highwater=highwater, last_stable=last_stable, committed=committed, position=position
    )
    assert found == lag


class FakeConsumer:
    """The part of AIOKafkaConsumer the monitor reads, with offsets a test sets."""

    def __init__(self, offsets: dict[TopicPartition, tuple[int | None, int | None, int | None]]):
        self.offsets = offsets  # tp -> (highwater, committed, position)
        self._closed: bool | None = False

    def assignment(self) -> set[TopicPartition]:
        return set(self.offsets)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.offsets[tp][0]

    def last_stable_offset(self, tp: TopicPartition) -> int | None:
        return self.offsets[tp][0]

    async def committed(self, tp: TopicPartition) -> int | None:
        return self.offsets[tp][1]

    async def position(self, tp: TopicPartition) -> int:
        position = self.offsets[tp][2]
        if position is None:  # aiokafka waits for a reset position: one that never comes
            await asyncio.get_running_loop().create_future()
        assert position is not None
        return position


def _gauge() -> dict[tuple[str, ...], float]:
    return {
        (s.labels["group"], s.labels["topic"], s.labels["partition"]): s.value
        for family in REGISTRY.collect()
        if family.name == "toolfleet_consumer_lag"
        for s in family.samples
    }


async def test_the_monitor_reports_owned_partitions_and_forgets_lost_ones() -> None:
    CONSUMER_LAG.clear()
    a, b = TopicPartition("t.commands.default", 0), TopicPartition("t.commands.default", 1)
    commands = FakeConsumer({a: (50, 40, 45), b: (None, None, None)})
    cancels = FakeConsumer({TopicPartition("t.cancellations", 3): (9, None, 7)})
    monitor = LagMonitor()
    monitor.track(commands, "t.workers.default")  # type: ignore[arg-type]
    monitor.track(cancels, "t.cancel-listeners.w1")  # type: ignore[arg-type]
    assert sorted(await monitor.sample(), key=lambda p: p.group) == [
        PartitionLag("t.cancel-listeners.w1", "t.cancellations", 3, 2),
        PartitionLag("t.workers.default", "t.commands.default", 0, 10),
    ]  # b has not been fetched: no series rather than a made-up 0
    await monitor.report()
    assert _gauge() == {
        ("t.workers.default", "t.commands.default", "0"): 10,
        ("t.cancel-listeners.w1", "t.cancellations", "3"): 2,
    }
    # A rebalance moves partition 0 to another instance and brings 1; the listener stops.
    commands.offsets = {b: (80, 60, 70)}
    cancels._closed = True
    await monitor.report()
    assert _gauge() == {("t.workers.default", "t.commands.default", "1"): 20}


async def test_a_consumer_that_fails_is_skipped_not_fatal() -> None:
    class Broken(FakeConsumer):
        async def committed(self, tp: TopicPartition) -> Any:
            raise RuntimeError("coordinator not available")

    monitor = LagMonitor()
    broken = Broken({TopicPartition("t.plans", 0): (5, 1, 1)})
    fine = FakeConsumer({TopicPartition("t.plans", 1): (5, 1, 1)})
    monitor.track(broken, "t.aggregator")  # type: ignore[arg-type]
    monitor.track(fine, "t.aggregator")  # type: ignore[arg-type]
    assert await monitor.sample() == [PartitionLag("t.aggregator", "t.plans", 1, 4)]


async def test_a_consumer_nobody_holds_is_forgotten() -> None:
    monitor = LagMonitor()
    monitor.track(FakeConsumer({TopicPartition("t.plans", 0): (5, 1, 1)}), "g")  # type: ignore[arg-type]
    assert await monitor.sample() == []
