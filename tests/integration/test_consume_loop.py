"""The consume loop on a real broker: a slow record holds back only the records of its key,
and a partition's commit never passes a record that is not done."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import TopicPartition
from redis.asyncio import Redis

from kernel.adapters.bus import ConsumeLoop, KafkaBus, Record, release_slot
from kernel.adapters.metrics import MESSAGES
from kernel.adapters.redis import AutoPipelinedRedis, OutputGate
from kernel.settings import Settings
from tests.conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]


async def test_a_slow_record_holds_back_its_key_only_and_the_commit_stays_below_it(
    bus: KafkaBus,
) -> None:
    tag = uuid.uuid4().hex[:8]
    slow, fast = f"slow-{tag}".encode(), f"fast-{tag}".encode()
    topic = bus.topic("human-tasks")  # any topic: records of other tests are passed over
    tp = TopicPartition(topic, 0)
    handled: list[bytes] = []
    slow_started, let_slow_finish = asyncio.Event(), asyncio.Event()

    async def handle(record: Record) -> None:
        if record.key not in (slow, fast):
            return
        if record.value == b"first" and record.key == slow:
            slow_started.set()
            await let_slow_finish.wait()
        handled.append(record.value or b"")

    async def send(key: bytes, value: bytes) -> int:
        future = await bus.producer.send(topic, value, key=key, partition=0)
        return int((await future).offset)

    consumer = bus.consumer(["human-tasks"], group=f"loop-test-{tag}")
    await consumer.start()
    loop = ConsumeLoop(bus, consumer, handle)
    running = asyncio.create_task(loop.run())
    try:
        first = await send(slow, b"first")
        await asyncio.wait_for(slow_started.wait(), timeout=30)
        await send(fast, b"other key")
        second = await send(slow, b"second")

        async def other_key_done() -> bool:
            return b"other key" in handled

        await wait_for(other_key_done, within=30)  # not held back by the unfinished record

        async def committed_up_to_the_slow_record() -> bool:
            return bool(await consumer.committed(tp) == first)

        await wait_for(committed_up_to_the_slow_record, within=30)
        assert handled == [b"other key"]  # the slow key's second record waits its turn

        let_slow_finish.set()

        async def committed_past_both() -> bool:
            return (await consumer.committed(tp) or 0) > second

        await wait_for(committed_past_both, within=30)
        assert handled == [b"other key", b"first", b"second"]
    finally:
        loop.stop()
        let_slow_finish.set()
        await running
        await consumer.stop()


async def test_unordered_records_of_one_key_run_side_by_side_once_a_slot_is_given_back(
    bus: KafkaBus,
) -> None:
    """The workers' numbers: one slot, given back when the tool ends (``release_slot``), and
    two records in hand; a command's call id does not hold the next command back."""
    tag = uuid.uuid4().hex[:8]
    key = f"call-{tag}".encode()
    topic = bus.topic("human-tasks")
    tp = TopicPartition(topic, 0)
    first_released, second_started, finish_first = (
        asyncio.Event(), asyncio.Event(), asyncio.Event()
    )  # fmt: skip

    async def handle(record: Record) -> None:
        if record.key != key:
            return
        if record.value == b"first":
            release_slot()  # the tool ended; its outcome is still being published
            first_released.set()
            await finish_first.wait()
        else:
            second_started.set()

    consumer = bus.consumer(["human-tasks"], group=f"loop-test-{tag}")
    await consumer.start()
    loop = ConsumeLoop(bus, consumer, handle, concurrency=1, in_hand=2, ordered=False)
    running = asyncio.create_task(loop.run())
    try:
        first = await (await bus.producer.send(topic, b"first", key=key, partition=0))
        await asyncio.wait_for(first_released.wait(), timeout=30)
        await bus.producer.send(topic, b"second", key=key, partition=0)
        await asyncio.wait_for(second_started.wait(), timeout=30)
        assert not finish_first.is_set()  # the first is still in hand: its commit waits

        async def committed_at_the_first() -> bool:
            return bool(await consumer.committed(tp) == first.offset)

        await wait_for(committed_at_the_first, within=30)
        finish_first.set()

        async def committed_past_both() -> bool:
            return (await consumer.committed(tp) or 0) > first.offset + 1

        await wait_for(committed_past_both, within=30)
    finally:
        loop.stop()
        finish_first.set()
        await running
        await consumer.stop()


async def test_a_batch_failing_on_a_dependency_is_read_again_from_its_first_offsets(
    bus: KafkaBus,
) -> None:
    """The aggregator's way (per batch): nothing of a failed batch was committed, so the
    loop reads it again, after a backoff, and the handler sees the same records."""
    tag = uuid.uuid4().hex[:8]
    key = f"run-{tag}".encode()
    topic = bus.topic("human-tasks")
    seen: list[list[int]] = []
    again = asyncio.Event()

    async def batch(batches: dict[TopicPartition, list[Record]]) -> None:
        mine = [r.offset for records in batches.values() for r in records if r.key == key]
        if not mine:
            return
        seen.append(mine)
        if len(seen) == 1:
            raise ConnectionError("injected: Redis went away mid-batch")
        again.set()

    consumer = bus.consumer(["human-tasks"], group=f"loop-test-{tag}", auto_offset_reset="latest")
    await consumer.start()
    await wait_for(lambda: asyncio.sleep(0, bool(consumer.assignment())), within=30)
    for tp in consumer.assignment():
        await consumer.position(tp)  # from now on: this test's records only
    sent = [await bus.producer.send(topic, b"x", key=key, partition=0) for _ in range(3)]
    offsets = [int((await future).offset) for future in sent]
    loop = ConsumeLoop(bus, consumer, batches=batch, backoff_s=0.01)
    running = asyncio.create_task(loop.run())
    try:
        await asyncio.wait_for(again.wait(), timeout=30)
        # The failed batch's records again, from its first offset on (a batch may be cut
        # where the fetch ended: the same records, and perhaps more behind them).
        assert seen[0][0] == offsets[0]
        assert seen[1][: len(seen[0])] == seen[0]
    finally:
        loop.stop()
        await running
        await consumer.stop()


async def test_free_slots_counts_the_records_the_loop_could_start_at_once(bus: KafkaBus) -> None:
    """What a worker offers its own admission passes: slots neither held by a record nor
    given back early, and none once stopping."""
    tag = uuid.uuid4().hex[:8]
    key = f"slots-{tag}".encode()
    topic = bus.topic("human-tasks")
    hold = asyncio.Event()

    async def handle(record: Record) -> None:
        if record.key != key:
            return
        if record.value == b"ended":
            release_slot()  # its tool ended: the slot is free while the outcome is written
        await hold.wait()

    consumer = bus.consumer(["human-tasks"], group=f"loop-test-{tag}")
    await consumer.start()
    loop = ConsumeLoop(bus, consumer, handle, concurrency=3, in_hand=4, ordered=False)
    assert loop.free_slots == 3
    running = asyncio.create_task(loop.run())
    try:
        await bus.producer.send(topic, b"running", key=key, partition=0)

        async def free(n: int) -> bool:
            return loop.free_slots == n

        await wait_for(lambda: free(2))
        await bus.producer.send(topic, b"ended", key=key, partition=0)
        await bus.producer.send(topic, b"running", key=key, partition=0)
        await wait_for(lambda: free(1))  # two tools run; the ended one holds no slot
        hold.set()
        await wait_for(lambda: free(3))
    finally:
        loop.stop()
        hold.set()
        await running
        await consumer.stop()
    assert loop.free_slots == 0


async def test_a_lost_redis_connection_reads_again_from_the_committed_offsets(
    bus: KafkaBus, settings: Settings, redis: Redis
) -> None:
    """What a handler wrote before its Redis connection dropped may be gone (a failover
    promotes a replica that lacked it): the loop commits nothing handled since, and reads
    again from the last committed offset. Records committed before are not read again."""
    tag = uuid.uuid4().hex[:8]
    key = f"loop-{tag}".encode()
    topic = bus.topic("human-tasks")
    tp = TopicPartition(topic, 0)
    state = AutoPipelinedRedis.from_url(settings.redis_address(), client_name=f"gate-{tag}")
    bus.gate = OutputGate(state)
    handled: list[bytes] = []
    cut: list[bool] = []

    async def cut_the_gate_client() -> None:
        for client in await redis.client_list():
            if client.get("name") == f"gate-{tag}":
                await redis.client_kill_filter(_id=client["id"])

    async def handle(record: Record) -> None:
        if record.key != key:
            return
        await state.incr(f"{{loop}}:{tag}:{record.value!r}")
        if record.value == b"c" and not cut:
            cut.append(True)
            await cut_the_gate_client()
            await state.incr(f"{{loop}}:{tag}:after-cut")  # fails: the handler runs again
        handled.append(record.value or b"")

    async def send(value: bytes) -> int:
        future = await bus.producer.send(topic, value, key=key, partition=0)
        return int((await future).offset)

    consumer = bus.consumer(["human-tasks"], group=f"loop-rewind-{tag}")
    await consumer.start()
    loop = ConsumeLoop(bus, consumer, handle)
    running = asyncio.create_task(loop.run())
    try:
        await send(b"a")
        b = await send(b"b")

        async def committed_past(offset: int) -> bool:
            return bool((await consumer.committed(tp) or 0) > offset)

        await wait_for(lambda: committed_past(b), within=30)
        epoch = bus.gate.epoch()
        rewound = MESSAGES.labels(bus.service, topic, "rewound")
        rewinds = rewound._value.get()
        c = await send(b"c")
        await wait_for(lambda: committed_past(c), within=30)
        assert bus.gate.epoch() > epoch  # the cut was seen
        # c's first handling failed, its retry finished (after the cut), and the loop read c
        # again from the committed offset instead of committing past it.
        assert handled == [b"a", b"b", b"c", b"c"]
        # Counted, for the dashboards: once per partition read again.
        assert rewound._value.get() == rewinds + len(consumer.assignment())
    finally:
        loop.stop()
        await running
        await consumer.stop()
        await state.aclose()
