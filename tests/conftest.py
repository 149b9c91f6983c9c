"""Fixtures shared by every test: real Kafka and Redis, started by the project itself."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TypeVar

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from redis.asyncio import Redis

from kernel.adapters.bus import KafkaBus
from kernel.adapters.redis import connect_redis
from kernel.adapters.topics import ensure_topics
from kernel.settings import Settings
from kernel.stores.keys import Keys
from toolfleet.app import infra

T = TypeVar("T")


@pytest.fixture(scope="session")
def infra_env() -> Iterator[dict[str, str]]:
    """KAFKA_BOOTSTRAP_SERVERS / REDIS_URL of running services, starting them when needed.

    Order of preference: services named by those variables; testcontainers when
    TOOLFLEET_INFRA=containers and Docker answers; else the local processes of `infra up`.
    ``TOOLFLEET_TEST_REDIS=cluster`` runs the suite on the local Redis Cluster instead of the
    single Redis (3 masters unless TOOLFLEET_REDIS_CLUSTER_MASTERS says otherwise); run it
    without the ``single_redis``, ``own_cluster``, ``long_scenario``, ``agent_runtime`` and
    ``layout_free`` tests, as `make test` does (they need one server, bring their own
    cluster, or ran in the first pass).
    """
    base = Settings()
    if os.environ.get("TOOLFLEET_TEST_REDIS") == "cluster":
        if not base.redis_cluster_masters:
            base = base.model_copy(update={"redis_cluster_masters": 3})
        env = infra.up(base).env()
        yield {**env, "REDIS_URL": env["TOOLFLEET_REDIS_CLUSTER_URL"]}
        return
    if base.infra == "containers":
        from toolfleet.app.infra.containers import run_containers

        with run_containers() as env:
            yield env
        return
    yield infra.up(base).env()


@pytest.fixture(scope="session")
def settings(infra_env: dict[str, str]) -> Settings:
    """Settings for this test session: real services, and topics no earlier run has used."""
    run = uuid.uuid4().hex[:8]
    return Settings(
        kafka_bootstrap_servers=infra_env["KAFKA_BOOTSTRAP_SERVERS"],
        redis_url=infra_env["REDIS_URL"],
        topic_prefix=f"test-{run}.",
        partitions=int(os.environ.get("TOOLFLEET_TEST_PARTITIONS", "4")),
        # Every decision is signed and verified, with one key for the session's tenants.
        decision_auth="hmac",
        decision_keys={"*": f"test-session-{run}"},
    )


@pytest.fixture(scope="session")
def keys(settings: Settings) -> Keys:
    """The Redis key layout of this test session's namespace."""
    return Keys.of(settings)


async def purge_namespace(settings: Settings) -> None:
    """Delete every topic of ``settings``' prefix and every Redis key of its namespace."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_servers())
    await admin.start()
    try:
        mine = [t for t in await admin.list_topics() if t.startswith(settings.topic_prefix)]
        if mine:
            await admin.delete_topics(mine)
    finally:
        await admin.close()
    client = connect_redis(settings)
    try:
        pattern = f"{Keys.of(settings).namespace}:*"
        leftovers = [key async for key in client.scan_iter(match=pattern, count=1000)]
        for start in range(0, len(leftovers), 1000):  # one key per command: any slot
            await asyncio.gather(*(client.unlink(k) for k in leftovers[start : start + 1000]))
    finally:
        await client.aclose()


@pytest.fixture(scope="session")
async def topics(settings: Settings) -> AsyncIterator[list[str]]:
    """Every shared topic and the command topics of the test pools, created once; deleted
    with every other topic and Redis key of this session's namespace when the session ends
    (a developer's broker would otherwise gather a dozen topics per run)."""
    yield await ensure_topics(settings, pools=("default", "slow"))
    await purge_namespace(settings)


@pytest.fixture
async def bus(settings: Settings, topics: list[str]) -> AsyncIterator[KafkaBus]:
    """A started Kafka bus for the test's own publishing."""
    kafka = KafkaBus(settings, service="test")
    await kafka.start()
    yield kafka
    await kafka.stop()


@pytest.fixture
async def redis(settings: Settings) -> AsyncIterator[Redis]:
    """A Redis client on the real server."""
    client = connect_redis(settings)
    yield client
    await client.aclose()


def port_is_free(port: int) -> bool:
    """Whether nothing holds ``port`` on loopback (for tests that start servers of their own)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


async def wait_for(
    probe: Callable[[], Awaitable[T]], *, within: float = 30.0, interval: float = 0.05
) -> T:
    """Poll ``probe`` until it returns something truthy, or fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within:.0f} s (last: {value!r})")
        await asyncio.sleep(interval)  # wait-ok: polling interval of a deadline-bounded wait


async def aggregator_caught_up(settings: Settings) -> bool:
    """Whether the aggregator group has committed every plan and outcome there is."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_servers(),
        group_id=f"{settings.topic_prefix}aggregator",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        partitions = [
            TopicPartition(settings.topic(t), p)
            for t in ("plans", "outcomes")
            for p in range(settings.partitions)
        ]
        ends = await consumer.end_offsets(partitions)
        committed = [await consumer.committed(tp) or 0 for tp in partitions]
        return all(c >= ends[tp] for c, tp in zip(committed, partitions, strict=True))
    finally:
        await consumer.stop()
