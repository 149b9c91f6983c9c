"""Consumer lag per group, topic and partition, measured by the services' own consumers.

Every consumer ``KafkaBus.consumer`` makes is tracked (weakly: a consumer nobody holds is
forgotten). ``LagMonitor.run``, started by ``toolfleet.app.service``, samples each partition
the process owns every ``LAG_SAMPLE_S`` and sets ``toolfleet_consumer_lag``; a partition the
process no longer owns loses its series at the next sample, so the new owner's is the only
one. No Kafka exporter is needed: the numbers are the ones the consumer itself sees.

``GroupLag`` is the outside view, for a process that consumes nothing of the group (the
console): the broker's committed offsets against the partitions' ends.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from kernel.adapters.dependencies import DEPENDENCIES, which_dependency
from kernel.adapters.logs import RecurringFailure
from kernel.adapters.metrics import CONSUMER_LAG
from kernel.adapters.security import kafka_options
from kernel.settings import Settings

log = logging.getLogger(__name__)

LAG_SAMPLE_S = 10.0
"""How often the lag is sampled: a third of a usual scrape interval, and one OffsetFetch per
owned partition each time."""

_FETCH_TIMEOUT_S = 5.0
"""How long one sample waits for the group's committed offsets (a rebalance can hold them)."""


def partition_lag(
    *, highwater: int | None, last_stable: int | None, committed: int | None, position: int | None
) -> int | None:
    """The records of one partition its group has not committed, or None when unknown yet.

    The end is the last stable offset: a ``read_committed`` consumer cannot read past it (an
    open transaction's records are not lag yet); brokers or clients that do not report it
    (None, or -1 under ``read_uncommitted``) leave the highwater. The start is the group's
    committed offset, what a restart would resume from (a record fetched but still being
    handled is still lag, as Kafka's own tools and KEDA count it); a group that never
    committed (the workers' cancellation listeners) counts from the consumer's position.
    Both ends are known only after the consumer's first fetch of the partition.
    """
    end = last_stable if last_stable is not None and last_stable >= 0 else highwater
    start = committed if committed is not None else position
    if end is None or start is None:
        return None
    return max(0, end - start)


@dataclass(frozen=True)
class PartitionLag:
    """One partition's lag, as ``toolfleet_consumer_lag`` labels it."""

    group: str
    topic: str
    partition: int
    lag: int


class LagMonitor:
    """The tracked consumers of this process and the lag gauge they feed."""

    def __init__(self) -> None:
        self._consumers: weakref.WeakKeyDictionary[AIOKafkaConsumer, str] = (
            weakref.WeakKeyDictionary()
        )
        self._reported: set[tuple[str, str, str]] = set()

    def track(self, consumer: AIOKafkaConsumer, group: str) -> None:
        """Measure ``consumer``'s partitions under ``group`` (its full group id)."""
        self._consumers[consumer] = group

    async def sample(self) -> list[PartitionLag]:
        """The lag of every partition a running tracked consumer owns now."""
        found: list[PartitionLag] = []
        for consumer, group in list(self._consumers.items()):
            # aiokafka has no public "stopped" flag; stop() sets _closed (None before
            # __init__ ran, False while open). A stopped consumer still lists its old
            # assignment, which is another instance's now.
            if getattr(consumer, "_closed", None) is not False:
                continue
            try:
                found += await _consumer_lag(consumer, group)
            except Exception as exc:  # a rebalance or an outage: the next sample tries again
                log.debug("lag sample failed", extra={"group": group, "error": repr(exc)})
        return found

    async def report(self) -> None:
        """Sample, set the gauge, and drop the series of partitions no longer owned."""
        current = {(p.group, p.topic, str(p.partition)): p.lag for p in await self.sample()}
        for labels in self._reported - current.keys():
            CONSUMER_LAG.remove(*labels)
        for labels, lag in current.items():
            CONSUMER_LAG.labels(*labels).set(lag)
        self._reported = set(current)

    async def run(self, every_s: float = LAG_SAMPLE_S) -> None:
        """Report every ``every_s`` until cancelled."""
        failing = RecurringFailure(log, "lag report failed")
        while True:
            try:
                await self.report()
            except Exception as exc:  # never let the sampler die: the gauge would go stale
                if which_dependency(exc) is not None or isinstance(exc, OSError | TimeoutError):
                    DEPENDENCIES.failed(exc)  # an outage: said once by the dependency monitor
                    log.debug("lag report failed", extra={"error": repr(exc)})
                else:
                    failing.failed(exc)
            else:
                failing.succeeded()
            await asyncio.sleep(every_s)


async def _consumer_lag(consumer: AIOKafkaConsumer, group: str) -> list[PartitionLag]:
    partitions = sorted(consumer.assignment())
    # The offsets the last fetch saw, read together before anything awaits (the assignment
    # cannot change in between).
    ends = {tp: (consumer.highwater(tp), consumer.last_stable_offset(tp)) for tp in partitions}
    committed = await asyncio.wait_for(
        asyncio.gather(*(consumer.committed(tp) for tp in partitions), return_exceptions=True),
        _FETCH_TIMEOUT_S,
    )
    found = []
    for tp, done in zip(partitions, committed, strict=True):
        highwater, last_stable = ends[tp]
        if isinstance(done, BaseException) or (highwater is None and last_stable is None):
            continue  # not fetched yet: no series rather than a made-up number
        position = None if done is not None else await _position(consumer, tp)
        lag = partition_lag(
            highwater=highwater, last_stable=last_stable, committed=done, position=position
        )
        if lag is not None:
            found.append(PartitionLag(group, tp.topic, tp.partition, lag))
    return found


async def _position(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int | None:
    """The consumer's position, without waiting for one it has not reset to yet."""
    try:
        return int(await asyncio.wait_for(consumer.position(tp), 1.0))
    except Exception:
        return None


LAG = LagMonitor()
"""The process's monitor: ``KafkaBus.consumer`` tracks into it, the service runs it."""


class GroupLag:
    """An operator's view (the console's pools page), from the broker's committed offsets:
    records of a topic that a consumer group has not committed yet, summed over the
    topic's partitions (a partition the group never committed counts from its start)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._admin = AIOKafkaAdminClient(**kafka_options(settings))
        self._ends = AIOKafkaConsumer(**kafka_options(settings), enable_auto_commit=False)

    async def __aenter__(self) -> Self:
        await self._admin.start()
        try:
            await self._ends.start()
        except BaseException:
            await self._admin.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._ends.stop()
        await self._admin.close()

    async def of(self, group: str, topic: str) -> int | None:
        """The lag of ``group`` (as services name it, without the prefix) on logical ``topic``;
        None when the broker cannot say (the topic does not exist, the broker is away)."""
        full = self.settings.topic(topic)
        try:
            [described] = await self._admin.describe_topics([full])
            partitions = [p["partition"] for p in described.get("partitions", [])]
            if described.get("error_code") or not partitions:
                return None
            tps = [TopicPartition(full, p) for p in sorted(partitions)]
            ends = await self._ends.end_offsets(tps)
            committed = await self._admin.list_consumer_group_offsets(
                f"{self.settings.topic_prefix}{group}", partitions=tps
            )
        except KafkaError:
            return None
        behind = 0
        for tp in tps:
            done = committed.get(tp)
            behind += max(0, int(ends[tp]) - (done.offset if done and done.offset >= 0 else 0))
        return behind
