"""Partitions per topic: the ceiling of instances of one consumer group that get work."""

from __future__ import annotations

import pytest

from kernel.settings import Settings


def test_a_topic_gets_its_own_partition_count_or_the_default() -> None:
    settings = Settings(partitions=6, topic_partitions={"commands.payments": 24})
    assert settings.partitions_of("commands.payments") == 24
    assert settings.partitions_of("outcomes") == 6


def test_partition_counts_come_from_the_environment_as_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLFLEET_TOPIC_PARTITIONS", '{"outcomes": 12}')
    assert Settings().partitions_of("outcomes") == 12
