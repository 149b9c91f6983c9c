"""Which offset may be committed when records of a partition finish out of order."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from aiokafka import TopicPartition


@dataclass
class OffsetTracker:
    """Tracks in-flight records per partition; commits stop below the oldest unfinished one.

    At-least-once with concurrency: a record is only covered by a commit once it and every
    earlier record of its partition are done, so a crash never skips unfinished work.
    """

    _pending: dict[TopicPartition, set[int]] = field(default_factory=lambda: defaultdict(set))
    _highest: dict[TopicPartition, int] = field(default_factory=dict)

    def started(self, tp: TopicPartition, offset: int) -> None:
        """A record was handed to a worker task."""
        self._pending[tp].add(offset)
        self._highest[tp] = max(offset, self._highest.get(tp, -1))

    def done(self, tp: TopicPartition, offset: int) -> None:
        """A record's effect is durable."""
        self._pending[tp].discard(offset)

    def committable(self) -> dict[TopicPartition, int]:
        """Per partition, the next offset to commit (Kafka commits 'the next one to read')."""
        result = {}
        for tp, highest in self._highest.items():
            pending = self._pending.get(tp)
            result[tp] = min(pending) if pending else highest + 1
        return result

    def forget(self, partitions: set[TopicPartition]) -> None:
        """Drop revoked partitions: their unfinished records will be redelivered elsewhere."""
        for tp in partitions:
            self._pending.pop(tp, None)
            self._highest.pop(tp, None)
