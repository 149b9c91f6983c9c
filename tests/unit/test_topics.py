"""The topics a deployment needs: the plan, its Strimzi form, and what a service says when
topics are missing (pure: no broker)."""

from __future__ import annotations

from kernel.adapters.topics import (
    SHARED_TOPICS,
    TopicsMissingError,
    plan_topics,
    strimzi_topics,
)
from kernel.settings import Settings


def test_the_plan_has_every_shared_topic_and_one_commands_topic_per_pool() -> None:
    settings = Settings(
        partitions=12,
        topic_partitions={"commands.payments": 24},
        replication_factor=3,
        topic_replication_factors={"dead-letter": 5},
    )
    plan = {t.logical: t for t in plan_topics(settings, ["default", "payments", "default"])}
    assert list(plan) == [*SHARED_TOPICS, "commands.default", "commands.payments"]
    assert plan["commands.payments"].partitions == 24
    assert plan["outcomes"].partitions == 12
    assert plan["outcomes"].name == "toolfleet.outcomes"
    assert (plan["outcomes"].replication_factor, plan["dead-letter"].replication_factor) == (3, 5)
    # acks=all survives one broker's loss: one replica fewer than the factor must be in sync.
    assert plan["outcomes"].configs == {"min.insync.replicas": "2"}
    assert plan_topics(Settings(), ["default"])[0].configs == {}  # one replica: nothing to say
    # The tool directory keeps each tool version's last announcement, whatever its age.
    assert plan["tools"].configs == {"min.insync.replicas": "2", "cleanup.policy": "compact"}
    single = {t.logical: t for t in plan_topics(Settings(), ["default"])}
    assert single["tools"].configs == {"cleanup.policy": "compact"}


def test_strimzi_resources_name_the_exact_topic_under_a_valid_resource_name() -> None:
    plan = plan_topics(Settings(replication_factor=3), ["Payments_EU"])
    text = strimzi_topics(plan, cluster="prod", namespace="kafka")
    documents = text.split("---\n")[1:]
    assert len(documents) == len(plan)
    last = documents[-1]
    assert "name: toolfleet.commands.payments-eu\n" in last  # lowercase, '-' for '_'
    assert 'topicName: "toolfleet.commands.Payments_EU"' in last  # the real name
    assert "strimzi.io/cluster: prod" in last and "namespace: kafka" in last
    assert "replicas: 3" in last and 'min.insync.replicas: "2"' in last


def test_missing_topics_are_named_with_how_to_create_them() -> None:
    error = TopicsMissingError(["toolfleet.plans", "toolfleet.commands.gpu"], ["default", "gpu"])
    text = str(error)
    assert "toolfleet.plans, toolfleet.commands.gpu" in text
    assert "toolfleet topics apply --pool default --pool gpu" in text
    assert "--strimzi" in text and "TOOLFLEET_TOPICS_AUTO_CREATE" in text
