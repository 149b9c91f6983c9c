"""Waiting for a fleet to go quiet: every record on its topics consumed and committed.

A service commits what it handled every ``COMMIT_INTERVAL_S`` and when it stops, but a record
it has not fetched yet (the reconciler lets the broker gather records for 100 ms) is not
handled by a stop: with a test fleet's topics deleted after it, such a record would be lost
unseen. Stopping once each group has committed up to the end of its topics leaves nothing.
"""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from kernel.adapters.security import kafka_options
from kernel.adapters.topics import command_topic
from kernel.settings import Settings

_READS = {
    "planner": ("model-responses", "approvals", "cancellations", "outcomes"),
    "aggregator": ("plans", "outcomes", "cancellations"),
    "reconciler": ("outcomes", "task-resolutions"),
}
"""The topics each service's consumer group reads (a worker pool's: its command topic)."""


def groups_of(pool: str) -> dict[str, tuple[str, ...]]:
    """Consumer group (without prefix) -> the logical topics it reads, for a fleet of
    ``pool``. The workers' cancellation listeners never commit (they read from the latest)."""
    return {**_READS, f"workers.{pool}": (command_topic(pool),)}


async def until_quiet(settings: Settings, pool: str, within: float) -> list[str]:
    """Wait, at most ``within`` seconds, until every consumer group of the fleet has committed
    each partition it reads up to its end; what still lags then (``group topic:partition``),
    empty when the fleet went quiet."""
    groups = groups_of(pool)
    reads = [
        (settings.topic_prefix + group, TopicPartition(settings.topic(t), p))
        for group, topics in groups.items()
        for t in topics
        for p in range(settings.partitions_of(t))
    ]
    # It learns the partitions' leaders one topic per metadata round, each after the retry
    # backoff (100 ms by default): short, or a fleet of nine topics takes most of a second.
    ends_reader = AIOKafkaConsumer(
        **kafka_options(settings), enable_auto_commit=False, retry_backoff_ms=5
    )
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    await ends_reader.start()
    await admin.start()
    deadline = time.monotonic() + within
    try:
        while True:
            ends = await ends_reader.end_offsets(list({tp for _, tp in reads}))
            committed = {
                group: await admin.list_consumer_group_offsets(group)
                for group in {group for group, _ in reads}
            }
            lagging = [
                f"{group} {tp.topic}:{tp.partition}"
                for group, tp in reads
                if ends[tp] > getattr(committed[group].get(tp), "offset", 0)
            ]
            if not lagging or time.monotonic() >= deadline:
                return lagging
            await asyncio.sleep(0.05)  # wait-ok: polling interval of a deadline-bounded wait
    finally:
        await admin.close()
        await ends_reader.stop()
