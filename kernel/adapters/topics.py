"""Topic names, the topics a deployment needs (its plan), and their creation."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from kernel.adapters.security import kafka_options
from kernel.errors import ConfigurationError, InfrastructureError
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
    "tools",
    "progress",
    "completions",
)
"""Logical names of every topic that does not depend on a worker pool."""

COMPACTED_TOPICS = frozenset({"tools"})
"""Topics that keep the last record of each key (``cleanup.policy=compact``): ``tools``, the
fleet's tool directory as the workers announce it, read from its beginning by clients."""

RETENTION_MS = {"progress": 24 * 3600 * 1000}
"""Topics kept shorter than the broker's default retention (``retention.ms``): ``progress``,
a gauge of running calls that nobody reads a day later."""

_TOPIC_ALREADY_EXISTS = 36


def command_topic(pool: str) -> str:
    """Logical name of the command topic of one worker pool."""
    return f"commands.{pool}"


@dataclass(frozen=True)
class PlannedTopic:
    """One topic a deployment needs, as it should be created."""

    name: str
    """The full name (``topic_prefix`` + logical name)."""
    logical: str
    partitions: int
    replication_factor: int
    configs: dict[str, str] = field(default_factory=dict)
    """Topic configs: with replicas, ``min.insync.replicas`` so an acks=all write survives
    the loss of one broker."""


def plan_topics(settings: Settings, pools: Iterable[str] = ("default",)) -> list[PlannedTopic]:
    """Every topic the services and the worker ``pools`` use, with partitions, replication
    factor and configs from the settings (``partitions_of``, ``replication_of``)."""
    logical = [*SHARED_TOPICS, *(command_topic(p) for p in dict.fromkeys(pools))]
    plan = []
    for name in logical:
        replicas = settings.replication_of(name)
        configs = {"min.insync.replicas": str(replicas - 1)} if replicas >= 3 else {}
        if name in COMPACTED_TOPICS:
            configs["cleanup.policy"] = "compact"
        if name in RETENTION_MS:
            configs["retention.ms"] = str(RETENTION_MS[name])
        plan.append(
            PlannedTopic(
                settings.topic(name), name, settings.partitions_of(name), replicas, configs
            )
        )
    return plan


def strimzi_topics(plan: Iterable[PlannedTopic], *, cluster: str, namespace: str | None) -> str:
    """The plan as Strimzi ``KafkaTopic`` resources (YAML documents), for ``kubectl apply``."""
    documents = []
    for topic in plan:
        lines = [
            "apiVersion: kafka.strimzi.io/v1beta2",
            "kind: KafkaTopic",
            "metadata:",
            f"  name: {_resource_name(topic.name)}",
            *([f"  namespace: {namespace}"] if namespace else []),
            "  labels:",
            f"    strimzi.io/cluster: {cluster}",
            "spec:",
            f"  topicName: {json.dumps(topic.name)}",
            f"  partitions: {topic.partitions}",
            f"  replicas: {topic.replication_factor}",
        ]
        if topic.configs:
            lines.append("  config:")
            lines += [f"    {key}: {json.dumps(value)}" for key, value in topic.configs.items()]
        documents.append("\n".join(lines))
    return "---\n" + "\n---\n".join(documents) + "\n"


def _resource_name(topic: str) -> str:
    """A Kubernetes resource name (lowercase letters, digits, '-' and '.') for a topic."""
    cleaned = re.sub(r"[^a-z0-9.-]+", "-", topic.lower()).strip("-.")
    return cleaned[:253] or "topic"


class TopicsMissingError(ConfigurationError):
    """Topics a service needs do not exist and creating them is off (``topics_auto_create``)."""

    def __init__(self, missing: list[str], pools: Iterable[str]) -> None:
        flags = " ".join(f"--pool {p}" for p in dict.fromkeys(pools))
        super().__init__(
            f"missing Kafka topics: {', '.join(missing)}. Create them with `toolfleet topics "
            f"apply {flags}` (or apply the KafkaTopic resources of `toolfleet topics plan "
            f"{flags} --strimzi CLUSTER`), or set TOOLFLEET_TOPICS_AUTO_CREATE=true"
        )
        self.missing = missing


@dataclass(frozen=True)
class TopicsReport:
    """What ``apply_topics`` found and did."""

    created: list[str]
    existing: list[str]
    different: dict[str, str]
    """Existing topics whose partition count differs from the plan: name -> what differs."""


async def apply_topics(settings: Settings, pools: Iterable[str] = ("default",)) -> TopicsReport:
    """Create the planned topics that are missing; report the ones that differ from the plan
    (partitions cannot be lowered; raising them moves keys to other partitions)."""
    plan = plan_topics(settings, pools)
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    await admin.start()
    try:
        missing, existing = await _partition(admin, plan)
        if missing:
            await _create(admin, missing)
        different: dict[str, str] = {}
        if existing:
            described = await admin.describe_topics([t.name for t in existing])
            counts = {d["topic"]: len(d.get("partitions", [])) for d in described}
            for topic in existing:
                actual = counts.get(topic.name, topic.partitions)
                if actual != topic.partitions:
                    different[topic.name] = f"{actual} partitions, planned {topic.partitions}"
    finally:
        await admin.close()
    return TopicsReport([t.name for t in missing], [t.name for t in existing], different)


async def ensure_topics(settings: Settings, pools: tuple[str, ...] = ("default",)) -> list[str]:
    """Make sure every topic a service uses exists; the full names.

    With ``topics_auto_create`` (local development) missing topics are created; safe to call
    from every service at start, creation is idempotent. Without it, TopicsMissingError names
    them and says how to create them.
    """
    plan = plan_topics(settings, pools)
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    await admin.start()
    try:
        missing, _ = await _partition(admin, plan)
        if missing and not settings.topics_auto_create:
            raise TopicsMissingError([t.name for t in missing], pools)
        if missing:
            await _create(admin, missing)
    finally:
        await admin.close()
    return [t.name for t in plan]


async def _partition(
    admin: AIOKafkaAdminClient, plan: list[PlannedTopic]
) -> tuple[list[PlannedTopic], list[PlannedTopic]]:
    """The planned topics the broker lacks, and those it has."""
    present = set(await admin.list_topics())
    return [t for t in plan if t.name not in present], [t for t in plan if t.name in present]


async def _create(admin: AIOKafkaAdminClient, topics: list[PlannedTopic]) -> None:
    response = await admin.create_topics(
        [
            NewTopic(t.name, t.partitions, t.replication_factor, topic_configs=t.configs)
            for t in topics
        ]
    )
    for topic, code, *rest in response.topic_errors:
        if code not in (0, _TOPIC_ALREADY_EXISTS):
            raise InfrastructureError(
                f"could not create topic {topic} (Kafka error {code}: {rest}); "
                "check the broker's log and the partition/replication settings"
            )
    names = [t.name for t in topics]
    log.info("created topics", extra={"topics": names})
    await _wait_for_leaders(admin, names)


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
