"""Kafka and Redis in Docker containers, for test fixtures when TOOLFLEET_INFRA=containers.

testcontainers is an optional dependency (``pip install 'toolfleet[containers]'``) and is
imported only when containers are asked for. Containers live as long as the ``with`` block
(testcontainers' reaper removes them if the process dies), which is why ``toolfleet infra
up`` never uses them.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator
from typing import Any

from kernel.errors import InfrastructureError
from kernel.settings import Settings
from toolfleet.app.infra import InfraStatus
from toolfleet.app.infra.process import ServiceStatus

log = logging.getLogger(__name__)

# testcontainers' KafkaContainer drives Confluent's image (KRaft from 7.x); 7.9 ships
# Apache Kafka 3.9, the newest release its start-up script supports.
KAFKA_IMAGE = "confluentinc/cp-kafka:7.9.0"
REDIS_IMAGE = "redis:7.4"


def docker_available() -> bool:
    """Whether the Docker SDK (a testcontainers dependency) is installed and a daemon answers."""
    try:
        # Imported by name: the SDK is optional and ships no type information.
        docker = importlib.import_module("docker")
    except ImportError:
        return False
    try:
        client = docker.from_env()
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # any failure to reach the daemon means "no Docker here"
        return False


@contextlib.contextmanager
def run_containers(
    settings: Settings | None = None,
    *,
    kafka_image: str = KAFKA_IMAGE,
    redis_image: str = REDIS_IMAGE,
) -> Iterator[InfraStatus]:
    """Run a single-node KRaft Kafka and an AOF Redis in containers for the ``with`` block.

    Services given by KAFKA_BOOTSTRAP_SERVERS / REDIS_URL are used as they are instead.
    Raises InfrastructureError, saying what to install, without testcontainers or Docker.
    """
    settings = settings or Settings()
    with contextlib.ExitStack() as stack:
        kafka = _external_kafka(settings) or _kafka(stack, kafka_image)
        redis = _external_redis(settings) or _redis(stack, redis_image)
        yield InfraStatus(kafka=kafka, redis=redis)


def _external_kafka(settings: Settings) -> ServiceStatus | None:
    if settings.kafka_bootstrap_servers:
        return ServiceStatus("kafka", "external", settings.kafka_bootstrap_servers)
    return None


def _external_redis(settings: Settings) -> ServiceStatus | None:
    if settings.redis_url:
        return ServiceStatus("redis", "external", settings.redis_url)
    return None


def _kafka(stack: contextlib.ExitStack, image: str) -> ServiceStatus:
    _require_docker()
    from testcontainers.kafka import KafkaContainer

    container: Any = KafkaContainer(image).with_kraft()
    # Single broker: the internal topics of transactions cannot have three replicas.
    for name, value in (
        ("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1"),
        ("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1"),
        ("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0"),
    ):
        container.with_env(name, value)
    started = stack.enter_context(container)
    address = str(started.get_bootstrap_server())
    log.info("kafka container %s on %s", image, address)
    return ServiceStatus("kafka", "running", address)


def _redis(stack: contextlib.ExitStack, image: str) -> ServiceStatus:
    _require_docker()
    from testcontainers.redis import RedisContainer

    container: Any = RedisContainer(image).with_command(
        "redis-server --appendonly yes --appendfsync everysec --hash-max-listpack-value 1024"
    )
    started = stack.enter_context(container)
    host = started.get_container_host_ip()
    port = started.get_exposed_port(6379)
    address = f"redis://{host}:{port}/0"
    log.info("redis container %s on %s", image, address)
    return ServiceStatus("redis", "running", address)


def _require_docker() -> None:
    try:
        importlib.import_module("testcontainers")
    except ImportError as exc:
        raise InfrastructureError(
            "TOOLFLEET_INFRA=containers needs testcontainers: pip install 'toolfleet[containers]'"
            ", or unset TOOLFLEET_INFRA to use the local processes of `toolfleet infra up`."
        ) from exc
    if not docker_available():
        raise InfrastructureError(
            "TOOLFLEET_INFRA=containers but no Docker daemon answers. Start Docker (or set "
            "DOCKER_HOST), or unset TOOLFLEET_INFRA to use `toolfleet infra up`."
        )
