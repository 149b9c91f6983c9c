"""Topic names and their creation."""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from kernel.adapters.security import kafka_options
from kernel.errors import InfrastructureError
from kernel.settings import Settings

log = logging.getLogger(__name__)

SHARED_TOPICS = (
    "model-responses",
    "approvals",
    "cancellations",
    "plans",
    "outcomes",
    "turn-results",
    "human-tasks",
    "task-resolutions",
    "dead-letter",
)
"""Logical names of every topic that does not depend on a worker pool."""

_TOPIC_ALREADY_EXISTS = 36


def command_topic(pool: str) -> str:
    """Logical name of the command topic of one worker pool."""
    return f"commands.{pool}"


async def ensure_topics(settings: Settings, pools: tuple[str, ...] = ("default",)) -> list[str]:
    """Create every shared topic and the command topics of ``pools`` when missing.

    Returns the full names. Safe to call from every service at start: creation is idempotent.
    """
    logical = {settings.topic(t): t for t in (*SHARED_TOPICS, *map(command_topic, pools))}
    names = list(logical)
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [n for n in names if n not in existing]
        if missing:
            response = await admin.create_topics(
                [
                    NewTopic(n, settings.partitions_of(logical[n]), settings.replication_factor)
                    for n in missing
                ]
            )
            for topic, code, *rest in response.topic_errors:
                if code not in (0, _TOPIC_ALREADY_EXISTS):
                    raise InfrastructureError(
                        f"could not create topic {topic} (Kafka error {code}: {rest}); "
                        "check the broker's log and the partition/replication settings"
                    )
            log.info("created topics", extra={"topics": missing})
            await _wait_for_leaders(admin, missing)
    finally:
        await admin.close()
    return names


async def _wait_for_leaders(admin: AIOKafkaAdminClient, topics: list[str]) -> None:
    """Until every partition of fresh ``topics`` has a leader: a client that sends before
    that gets NotLeaderForPartitionError (retried, but printed as warnings at start-up)."""
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        described = await admin.describe_topics(topics)
        leaders = [
            p.get("leader", p.get("leader_id", -1))
            for topic in described
            for p in topic.get("partitions", [])
        ]
        if len(leaders) >= len(topics) and all(leader >= 0 for leader in leaders):
            return
        await asyncio.sleep(0.1)  # wait-ok: polling interval of a deadline-bounded wait
    log.warning("topics created but some partitions have no leader yet", extra={"topics": topics})
