"""ConsumeLoop on the real broker: per-key order, no batch barrier, commits below unfinished."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.conftest import wait_for
from toolfleet.bus import ConsumeLoop, KafkaBus, Record
from toolfleet.settings import Settings

pytestmark = pytest.mark.integration


async def test_a_slow_record_holds_back_only_its_key_and_the_commit_stops_below_it(
    bus: KafkaBus, settings: Settings
) -> None:
    tag = uuid.uuid4().hex[:8]
    slow_key, other_key = f"{tag}-a", f"{tag}-b"
    release = asyncio.Event()
    seen: list[str] = []

    async def handle(record: Record) -> None:
        if not (record.key or b"").startswith(tag.encode()):
            return  # other tests of the session share the topic
        value = (record.value or b"").decode()
        if value == "slow":
            await release.wait()
        seen.append(value)

    slow_at = await (await bus.publish("cancellations", slow_key, b"slow"))
    await bus.publish_and_wait("cancellations", slow_key, b"after-slow")
    await bus.publish_and_wait("cancellations", other_key, b"other-key")
    group = f"consume-loop-{tag}"
    loop = ConsumeLoop(bus, ["cancellations"], group, handle)
    task = asyncio.create_task(loop.run())
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_servers())
    await admin.start()
    slow_tp = TopicPartition(slow_at.topic, slow_at.partition)

    async def committed() -> int:
        offsets = await admin.list_consumer_group_offsets(f"{settings.topic_prefix}{group}")
        meta = offsets.get(slow_tp)
        return -1 if meta is None else meta.offset

    async def has(value: str) -> bool:
        return value in seen

    async def committed_at_slow() -> bool:
        return await committed() == int(slow_at.offset)

    async def committed_past_slow() -> bool:
        return await committed() > int(slow_at.offset)

    try:
        # Another key is not held back by the slow record (no batch waits for its slowest)...
        await wait_for(lambda: has("other-key"))
        # ...but the slow record's own key is, and the commit stops right below it.
        await wait_for(committed_at_slow)
        assert "after-slow" not in seen
        release.set()
        await wait_for(lambda: has("after-slow"))
        assert [v for v in seen if v in ("slow", "after-slow")] == ["slow", "after-slow"]
        await wait_for(committed_past_slow)
    finally:
        release.set()
        loop.stop()
        await task
        await admin.close()
