"""Local infrastructure: a real Apache Kafka broker and a real redis-server, run by toolfleet.

Everything is parametrised by :class:`~kernel.settings.Settings`, so a test can run a
private instance (own ``state_dir`` and ports) beside the shared one. All functions block;
from async code call them through ``asyncio.to_thread``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernel.errors import ConfigurationError, InfrastructureError
from kernel.settings import Settings
from toolfleet.app.infra.kafka import kafka_status, start_kafka, stop_kafka
from toolfleet.app.infra.process import ServiceStatus
from toolfleet.app.infra.redis import redis_status, start_redis, stop_redis
from toolfleet.app.infra.redis_cluster import cluster_status, start_cluster, stop_cluster

__all__ = [
    "InfraStatus",
    "ServiceStatus",
    "addresses",
    "down",
    "kafka_status",
    "redis_status",
    "start_kafka",
    "start_redis",
    "status",
    "stop_kafka",
    "stop_redis",
    "up",
]


@dataclass(frozen=True)
class InfraStatus:
    """Kafka and Redis as one pair, with the addresses clients should use."""

    kafka: ServiceStatus
    redis: ServiceStatus
    cluster: ServiceStatus | None = None
    """The local Redis Cluster, when TOOLFLEET_REDIS_CLUSTER_MASTERS asks for one."""

    @property
    def bootstrap_servers(self) -> str:
        """Value for KAFKA_BOOTSTRAP_SERVERS."""
        return self.kafka.address

    @property
    def redis_url(self) -> str:
        """Value for REDIS_URL."""
        return self.redis.address

    @property
    def available(self) -> bool:
        """Whether both services can be used."""
        cluster = self.cluster is None or self.cluster.available
        return self.kafka.available and self.redis.available and cluster

    def env(self) -> dict[str, str]:
        """The environment variables that point every toolfleet process at these services."""
        env = {"KAFKA_BOOTSTRAP_SERVERS": self.bootstrap_servers, "REDIS_URL": self.redis_url}
        if self.cluster is not None:
            env["TOOLFLEET_REDIS_CLUSTER_URL"] = self.cluster.address
        return env


def up(settings: Settings | None = None) -> InfraStatus:
    """Start whatever is not running yet (idempotent) and wait until both answer clients.

    Services given by KAFKA_BOOTSTRAP_SERVERS / REDIS_URL are not started, only reported.
    """
    settings = settings or Settings()
    _require_local(settings)
    # Redis first: it is ready in milliseconds, so a missing redis-server fails fast instead
    # of after Kafka's start-up.
    redis = start_redis(settings)
    cluster = start_cluster(settings) if settings.redis_cluster_masters else None
    kafka = start_kafka(settings)
    return InfraStatus(kafka=kafka, redis=redis, cluster=cluster)


def down(settings: Settings | None = None) -> InfraStatus:
    """Stop exactly the processes ``up`` started for ``settings``; data is kept.

    Returns the status *before* stopping, so callers can report which pids were stopped.
    """
    settings = settings or Settings()
    before = status(settings)
    stop_kafka(settings)
    stop_redis(settings)
    stop_cluster(settings)
    return before


def status(settings: Settings | None = None) -> InfraStatus:
    """Running / stopped / external for each service, with pid and address."""
    settings = settings or Settings()
    cluster = cluster_status(settings) if settings.redis_cluster_masters else None
    return InfraStatus(kafka=kafka_status(settings), redis=redis_status(settings), cluster=cluster)


def addresses(settings: Settings | None = None) -> tuple[str, str]:
    """(bootstrap servers, Redis URL) that ``settings`` point at, whether or not they run."""
    settings = settings or Settings()
    return settings.kafka_servers(), settings.redis_address()


def _require_local(settings: Settings) -> None:
    if settings.infra == "local":
        return
    if settings.infra == "containers":
        raise InfrastructureError(
            "TOOLFLEET_INFRA=containers: containers live only as long as the process that "
            "starts them, so `toolfleet infra up` does not run them. Tests get them from "
            "toolfleet.app.infra.containers.run_containers; unset TOOLFLEET_INFRA to run local "
            "processes instead."
        )
    raise ConfigurationError(
        f"TOOLFLEET_INFRA={settings.infra!r} is not known; use 'local' or 'containers'."
    )
