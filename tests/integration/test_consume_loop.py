"""The consume loop on a real broker: a slow record holds back only the records of its key,
and a partition's commit never passes a record that is not done."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import TopicPartition

from kernel.adapters.bus import ConsumeLoop, KafkaBus, Record
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
