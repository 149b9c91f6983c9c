"""Commits never pass an unfinished record."""

from aiokafka import TopicPartition

from kernel.adapters.offsets import OffsetTracker

TP = TopicPartition("t", 0)


def test_commit_stops_below_the_oldest_unfinished_record() -> None:
    tracker = OffsetTracker()
    for offset in (10, 11, 12):
        tracker.started(TP, offset)
    tracker.done(TP, 12)
    tracker.done(TP, 11)
    assert tracker.committable() == {TP: 10}
    tracker.done(TP, 10)
    assert tracker.committable() == {TP: 13}


def test_revoked_partitions_are_forgotten() -> None:
    tracker = OffsetTracker()
    tracker.started(TP, 5)
    tracker.forget({TP})
    assert tracker.committable() == {}
