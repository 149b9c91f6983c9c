"""A worker adds its slots to its pool's capacity only while it owns a partition of the pool's
topic: a worker beyond the partition count gets no command, so its slots must not let
admission send more commands than the other workers can run."""

from __future__ import annotations

import json
import os
import signal
import uuid

import pytest
from redis.asyncio import Redis

from kernel.adapters.redis import text
from kernel.adapters.topics import command_topic, ensure_topics
from kernel.settings import Settings
from kernel.stores.admission import SEP
from kernel.stores.keys import Keys
from tests.conftest import wait_for
from toolfleet.testing import LocalFleet

pytestmark = pytest.mark.integration

SLOTS = 3


async def test_a_worker_without_a_partition_adds_no_capacity(
    settings: Settings, topics: list[str], redis: Redis, keys: Keys
) -> None:
    pool = f"solo{uuid.uuid4().hex[:6]}"
    one_partition = settings.model_copy(update={"topic_partitions": {command_topic(pool): 1}})
    await ensure_topics(one_partition, pools=(pool,))
    fleet = LocalFleet(
        one_partition,
        tools="tests.integration.fleet_tools:tools",
        pool=pool,
        worker_args=["--concurrency", str(SLOTS)],
    )
    try:
        fleet.start_worker(0)
        fleet.start_worker(1)
        await fleet.ready()  # one worker owns the partition, the other none

        async def registered() -> list[int]:
            slots = await redis.hgetall(keys.admission("slots"))
            return sorted(int(n) for w, n in slots.items() if text(w).startswith(pool + SEP))

        async def one_workers_slots() -> bool:
            return await registered() == [0, SLOTS]

        await wait_for(one_workers_slots, within=30)

        # The owner stops (and unregisters); the other worker takes the partition over, and
        # with it, its slots count.
        owner = next(n for n in ("worker-0", "worker-1") if _owns_a_partition(fleet.logs(n)))
        os.kill(fleet.pid(owner), signal.SIGTERM)

        async def owner_gone() -> bool:
            return not fleet.alive(owner)

        await wait_for(owner_gone, within=60)

        async def the_other_workers_slots() -> bool:
            return await registered() == [SLOTS]

        await wait_for(the_other_workers_slots, within=60)
    finally:
        fleet.stop()


def _owns_a_partition(log: str) -> bool:
    """Whether a worker's latest logged assignment holds a partition."""
    latest: list[int] = []
    for line in log.splitlines():
        if line.startswith("{") and '"partitions assigned"' in line:
            latest = json.loads(line)["partitions"]
    return bool(latest)
