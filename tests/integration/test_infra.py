"""`toolfleet infra` runs a real Apache Kafka broker and a real redis-server.

One private instance (its own state dir and free ports) serves the whole module, so the
shared instance on the default ports is never touched.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import redis
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from kernel.settings import Settings
from tests.conftest import port_is_free
from toolfleet.app import infra

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]

TOOLFLEET = Path(sys.executable).with_name("toolfleet")
# Variables that would point the private instance at other services.
FOREIGN_ENV = (
    "KAFKA_BOOTSTRAP_SERVERS",
    "TOOLFLEET_KAFKA_BOOTSTRAP_SERVERS",
    "REDIS_URL",
    "TOOLFLEET_REDIS_URL",
    "TOOLFLEET_INFRA",
)


@dataclass(frozen=True)
class Private:
    """A private infra instance: its Settings and the matching environment for the CLI."""

    settings: Settings
    env: dict[str, str]


def free_ports(count: int) -> list[int]:
    """Distinct ports that nothing listens on right now."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)  # wait-ok: polling interval of a deadline-bounded wait


def brokers(settings: Settings) -> list[psutil.Process]:
    """Every Kafka broker process serving this state dir, whoever started it."""
    marker = str(settings.state_dir)
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "kafka.Kafka" in cmdline and any(marker in arg for arg in cmdline):
            found.append(proc)
    return found


def redis_servers(settings: Settings) -> list[psutil.Process]:
    """Every redis-server process listening on this instance's port."""
    address = f"127.0.0.1:{settings.redis_port}"
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["name"] == "redis-server" and address in cmdline:
            found.append(proc)
    return found


def toolfleet(private: Private, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the installed ``toolfleet`` command against the private instance."""
    return subprocess.run(
        [str(TOOLFLEET), *args],
        env=private.env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Private]:
    """A private instance; always brought down at the end, whatever the tests did."""
    state_dir = tmp_path_factory.mktemp("infra-state")
    kafka_port, controller_port, redis_port = free_ports(3)
    settings = Settings(
        kafka_bootstrap_servers=None,
        redis_url=None,
        infra="local",
        state_dir=state_dir,
        kafka_port=kafka_port,
        kafka_controller_port=controller_port,
        redis_port=redis_port,
    )
    env = {key: value for key, value in os.environ.items() if key not in FOREIGN_ENV}
    env.update(
        TOOLFLEET_STATE_DIR=str(state_dir),
        TOOLFLEET_CACHE_DIR=str(settings.cache_dir),
        TOOLFLEET_KAFKA_PORT=str(kafka_port),
        TOOLFLEET_KAFKA_CONTROLLER_PORT=str(controller_port),
        TOOLFLEET_REDIS_PORT=str(redis_port),
    )
    try:
        yield Private(settings, env)
    finally:
        infra.down(settings)


@pytest.fixture
def running(private: Private) -> infra.InfraStatus:
    """The private instance, started if a previous test stopped it."""
    return infra.up(private.settings)


def test_cli_up_is_idempotent_and_down_stops_everything(private: Private) -> None:
    settings = private.settings
    first = toolfleet(private, "infra", "up")
    assert first.returncode == 0, first.stderr
    second = toolfleet(private, "infra", "up")
    assert second.returncode == 0, second.stderr

    assert len(brokers(settings)) == 1
    assert len(redis_servers(settings)) == 1
    addresses = [
        f"KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:{settings.kafka_port}",
        f"REDIS_URL=redis://127.0.0.1:{settings.redis_port}/0",
    ]
    expected = [f"export {line}" for line in addresses]
    assert first.stdout.splitlines() == expected
    assert second.stdout.splitlines() == expected
    assert "kafka: started" in first.stderr
    assert "kafka: already running" in second.stderr

    status = toolfleet(private, "infra", "status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.count(" running ") == 2

    # As a newcomer does it, in a real shell: `eval "$(toolfleet infra up)"` exports the
    # addresses (the shell's children see them), and `infra down` in that shell still stops
    # what `up` started (they are not "external").
    shell = subprocess.run(
        [
            "bash",
            "-c",
            f'eval "$({TOOLFLEET} infra up)" && env | sort && {TOOLFLEET} infra down',
        ],
        env=private.env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert shell.returncode == 0, shell.stderr
    assert set(addresses) <= set(shell.stdout.splitlines())
    assert "stopped" in shell.stdout
    assert "external" not in shell.stdout + shell.stderr
    wait_until(lambda: not brokers(settings), 30, "the broker to exit")
    wait_until(lambda: not redis_servers(settings), 30, "redis-server to exit")
    assert not (settings.state_dir / "kafka" / "kafka.pid").exists()
    assert not (settings.state_dir / "redis" / "redis.pid").exists()
    assert toolfleet(private, "infra", "status").returncode == 3


def test_external_addresses_start_nothing(private: Private) -> None:
    env = {
        **private.env,
        "KAFKA_BOOTSTRAP_SERVERS": "kafka.example:9092",
        "REDIS_URL": "redis://redis.example:6379/0",
    }
    done = toolfleet(Private(private.settings, env), "infra", "up")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "export KAFKA_BOOTSTRAP_SERVERS=kafka.example:9092",
        "export REDIS_URL=redis://redis.example:6379/0",
    ]
    assert not brokers(private.settings)
    assert not redis_servers(private.settings)


async def create_topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()


async def consume(
    bootstrap: str, topic: str, until: bytes, *, isolation_level: str = "read_uncommitted"
) -> list[bytes]:
    """Values of ``topic`` from the start up to and including the record ``until``."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level=isolation_level,
    )
    await consumer.start()
    values: list[bytes] = []
    try:
        async with asyncio.timeout(60):
            while until not in values:
                batches = await consumer.getmany(timeout_ms=500)
                values.extend(r.value for records in batches.values() for r in records)
    finally:
        await consumer.stop()
    return values


async def test_idempotent_producer(running: infra.InfraStatus) -> None:
    topic = f"idempotent-{uuid.uuid4().hex}"
    await create_topic(running.bootstrap_servers, topic)
    producer = AIOKafkaProducer(
        bootstrap_servers=running.bootstrap_servers, enable_idempotence=True, acks="all"
    )
    await producer.start()
    try:
        sent = [f"record-{i}".encode() for i in range(20)]
        for value in sent:
            await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()
    assert await consume(running.bootstrap_servers, topic, until=sent[-1]) == sent


async def test_transactions_hide_aborted_records(running: infra.InfraStatus) -> None:
    topic = f"transactional-{uuid.uuid4().hex}"
    await create_topic(running.bootstrap_servers, topic)
    producer = AIOKafkaProducer(
        bootstrap_servers=running.bootstrap_servers, transactional_id=f"tx-{uuid.uuid4().hex}"
    )
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed-1")
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"aborted")
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed-2")
    finally:
        await producer.stop()

    bootstrap = running.bootstrap_servers
    committed = await consume(bootstrap, topic, b"committed-2", isolation_level="read_committed")
    assert committed == [b"committed-1", b"committed-2"]
    everything = await consume(bootstrap, topic, b"committed-2")
    assert b"aborted" in everything


async def test_records_survive_a_broker_restart(
    private: Private, running: infra.InfraStatus
) -> None:
    topic = f"durable-{uuid.uuid4().hex}"
    await create_topic(running.bootstrap_servers, topic)
    producer = AIOKafkaProducer(
        bootstrap_servers=running.bootstrap_servers, enable_idempotence=True, acks="all"
    )
    await producer.start()
    sent = [f"before-restart-{i}".encode() for i in range(10)]
    try:
        for value in sent:
            await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()

    old_pid = await asyncio.to_thread(infra.stop_kafka, private.settings)
    assert old_pid is not None
    assert not brokers(private.settings)
    restarted = await asyncio.to_thread(infra.start_kafka, private.settings)
    assert restarted.state == "running"
    assert restarted.pid != old_pid

    assert await consume(running.bootstrap_servers, topic, until=sent[-1]) == sent


async def test_redis_data_survives_a_restart(private: Private, running: infra.InfraStatus) -> None:
    keys = {f"durable:{uuid.uuid4().hex}:{i}": f"value-{i}" for i in range(50)}
    client = aioredis.Redis.from_url(running.redis_url, decode_responses=True)
    try:
        await client.mset(keys)
        # The append-only file, fsynced on every write, is the only persistence; ledger
        # entries (which hold their outcome) stay compact listpacks.
        config = await client.config_get(
            "appendonly", "appendfsync", "save", "hash-max-listpack-value"
        )
        assert config == {
            "appendonly": "yes", "appendfsync": "always", "save": "",
            "hash-max-listpack-value": "1024",
        }  # fmt: skip
    finally:
        await client.aclose()

    old_pid = await asyncio.to_thread(infra.stop_redis, private.settings)
    assert old_pid is not None
    assert not redis_servers(private.settings)
    assert any((private.settings.state_dir / "redis" / "appendonlydir").iterdir())
    restarted = await asyncio.to_thread(infra.start_redis, private.settings)
    assert restarted.pid != old_pid

    client = aioredis.Redis.from_url(running.redis_url, decode_responses=True)
    try:
        assert await client.mget(list(keys)) == list(keys.values())
    finally:
        await client.aclose()


def test_a_local_redis_cluster_forms_serves_every_slot_and_stops(tmp_path: Path) -> None:
    """Three masters with a replica each, from the same redis-server binary, on loopback."""
    from toolfleet.app.infra.redis_cluster import cluster_status, start_cluster, stop_cluster

    # Below the ephemeral range (32768+), with each node's cluster bus port (+10000) too.
    base = next(
        b for b in range(21_000, 22_700, 10)
        if all(port_is_free(p) and port_is_free(p + 10_000) for p in range(b, b + 6))
    )  # fmt: skip
    settings = Settings(
        state_dir=tmp_path, redis_cluster_masters=3, redis_cluster_replicas=1,
        redis_cluster_port=base,
    )  # fmt: skip
    try:
        started = start_cluster(settings)
        assert (started.state, started.started) == ("running", True)
        assert start_cluster(settings).started is False  # idempotent: nothing new to start
        client = redis.Redis(host="127.0.0.1", port=base)
        try:
            info = client.execute_command("CLUSTER", "INFO").decode()
            assert "cluster_state:ok" in info
            assert "cluster_slots_assigned:16384" in info
            assert "cluster_size:3" in info
            roles = [line.split()[2] for line in client.execute_command("CLUSTER", "NODES")
                     .decode().splitlines()]  # fmt: skip
            assert sum("master" in r for r in roles) == 3
            assert sum("slave" in r for r in roles) == 3
        finally:
            client.close()
    finally:
        assert len(stop_cluster(settings)) == 6
    assert cluster_status(settings).state == "stopped"
