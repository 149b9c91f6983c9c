"""The simulator's log: topics, partitions, consumer groups and transactions, in memory.

What the services see is the surface of aiokafka they use (``Bus``, the consumer calls of
``ConsumeLoop``, a transactional producer); what happens underneath is the simulator's, drawn
from the seed: when a record lands, in which order partitions are fetched, how many records a
fetch brings, when a group rebalances, whether a record is written twice (a producer's retry
after a lost answer that the broker did not recognise), whether a transaction's answer is lost.

Semantics kept from Kafka: per-partition order; a group's partitions are split among its
members, and every membership change revokes and reassigns them all (the eager protocol); a
member that crashed keeps its partitions until its session times out; positions start at the
committed offset; a commit of a partition the member no longer owns is refused; a read_committed
fetch stops at the first record of an open transaction and skips aborted ones; a transaction's
records and offsets commit together; a new epoch of a transactional id aborts the open
transaction of the old one and fences it.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, KafkaConnectionError, ProducerFenced

from kernel.adapters.bus import WORK_EPOCH, IndefiniteOutcome, Record
from kernel.adapters.redis import OutputGate
from kernel.adapters.tracing import Headers
from kernel.adapters.tracing import headers as trace_headers
from kernel.settings import Settings
from schemas import DeadLetter, Message
from toolfleet.testing._bus import ConsumedRecord

State = Literal["plain", "open", "committed", "aborted"]


@dataclass
class Entry:
    """One record in a partition's log."""

    record: ConsumedRecord
    state: State = "plain"


@dataclass
class Faults:
    """What the broker asks the simulator, each time it could go wrong."""

    delay: Callable[[], float] = lambda: 0.0
    """Seconds before a published record lands."""
    duplicate: Callable[[], bool] = lambda: False
    """Whether a published record lands twice."""
    lose_commit_answer: Callable[[], bool] = lambda: False
    """Whether a transaction's commit answer is lost (it may or may not have committed)."""
    commit_applied: Callable[[], bool] = lambda: True
    """When the answer is lost: whether the commit had been applied."""
    fetch_some: Callable[[int], int] = lambda n: n
    """How many of ``n`` available records a fetch returns (at least one)."""


@dataclass
class Group:
    """A consumer group: members, their assignment, committed offsets."""

    name: str
    members: list[SimConsumer] = field(default_factory=list)
    generation: int = 0
    committed: dict[TopicPartition, int] = field(default_factory=dict)


class Broker:
    """The in-memory log every ``SimBus`` of one simulation shares."""

    def __init__(self, settings: Settings, faults: Faults) -> None:
        self.settings = settings
        self.faults = faults
        self.logs: dict[TopicPartition, list[Entry]] = {}
        self.groups: dict[str, Group] = {}
        self.epochs: dict[str, int] = {}
        """Each transactional id's current epoch."""
        self.open: dict[str, Transaction] = {}
        """Each transactional id's open transaction."""
        self.changed = asyncio.Event()
        self.dead_letters: list[tuple[Record, str, str]] = []
        """(record, reason, service) of every dead letter."""
        self.members = 0
        """Consumers made so far (their member ids count up)."""
        self.counts: dict[str, int] = {}
        """Events of note (duplicates, rebalances, fenced epochs...), for coverage."""

    def count(self, what: str) -> None:
        """Count one event of note."""
        self.counts[what] = self.counts.get(what, 0) + 1

    # --- the log ----------------------------------------------------------------------------
    def partitions(self, topic: str) -> list[TopicPartition]:
        """The partitions of full topic name ``topic``."""
        name = topic.removeprefix(self.settings.topic_prefix)
        return [TopicPartition(topic, p) for p in range(self.settings.partitions_of(name))]

    def log(self, tp: TopicPartition) -> list[Entry]:
        """A partition's log (made on first use, as auto-created topics are)."""
        return self.logs.setdefault(tp, [])

    def partition_for(self, topic: str, key: bytes | None) -> TopicPartition:
        """The partition a key's records go to (stable, as Kafka's partitioner is)."""
        partitions = self.partitions(topic)
        return partitions[zlib.crc32(key or b"") % len(partitions)]

    def append(self, tp: TopicPartition, record: ConsumedRecord, state: State) -> Entry:
        """Append one record; wake every fetch."""
        log = self.log(tp)
        entry = Entry(
            ConsumedRecord(
                tp.topic, record.value, record.key, tp.partition, len(log), record.headers
            ),
            state,
        )
        log.append(entry)
        self._wake()
        return entry

    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def stable_end(self, tp: TopicPartition) -> int:
        """The last stable offset: below the first record of an open transaction."""
        for entry in self.log(tp):
            if entry.state == "open":
                return entry.record.offset
        return len(self.log(tp))

    def visible(self, tp: TopicPartition, position: int, committed_only: bool) -> list[Entry]:
        """The records a fetch from ``position`` may return (skipping aborted ones)."""
        end = self.stable_end(tp) if committed_only else len(self.log(tp))
        return [e for e in self.log(tp)[position:end] if e.state != "aborted" or not committed_only]

    def read(self, topic: str, committed_only: bool = True) -> list[ConsumedRecord]:
        """Every record of ``topic`` a reader sees, partition by partition."""
        found: list[ConsumedRecord] = []
        for tp in self.partitions(topic):
            found += [e.record for e in self.visible(tp, 0, committed_only)]
        return found

    # --- groups -----------------------------------------------------------------------------
    def join(self, consumer: SimConsumer) -> None:
        """``consumer`` joins its group: every member's partitions are reassigned."""
        group = self.groups.setdefault(consumer.group, Group(consumer.group))
        group.members.append(consumer)
        self.rebalance(group)

    def leave(self, consumer: SimConsumer) -> None:
        """``consumer`` leaves its group (stopped, or its session timed out)."""
        group = self.groups.get(consumer.group)
        if group is not None and consumer in group.members:
            group.members.remove(consumer)
            self.rebalance(group)

    def rebalance(self, group: Group) -> None:
        """Split the group's partitions among its members; each learns it at its next poll."""
        group.generation += 1
        self.count("rebalance")
        members = sorted(group.members, key=lambda m: m.member_id)
        topics = sorted({t for m in members for t in m.subscription})
        partitions = [tp for t in topics for tp in self.partitions(t)]
        share: dict[int, set[TopicPartition]] = {id(m): set() for m in members}
        for n, tp in enumerate(partitions):
            eligible = [m for m in members if tp.topic in m.subscription]
            if eligible:
                share[id(eligible[n % len(eligible)])].add(tp)
        for member in members:
            member.pending = (group.generation, share[id(member)])
        self._wake()


class SimBus:
    """A ``Bus`` over the simulator's ``Broker``, for one service."""

    def __init__(self, broker: Broker, settings: Settings, service: str) -> None:
        self.broker = broker
        self.settings = settings
        self.service = service
        self.severed = False
        """The service crashed: it sends nothing more."""
        self.gate: OutputGate | None = None
        self._last_landing: dict[TopicPartition, float] = {}

    async def start(self) -> None:
        """Nothing to connect."""

    async def stop(self) -> None:
        """Nothing to flush: every record is on its way already."""

    def topic(self, name: str) -> str:
        """The full name of a logical topic."""
        return self.settings.topic(name)

    def _check(self) -> None:
        if self.severed:
            raise KafkaConnectionError(f"simulated: {self.service} crashed")

    async def publish(
        self,
        topic: str,
        key: str | bytes | None,
        value: Message | bytes,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[Any]:
        """Queue one record; it lands after the delay the simulator draws (in order per
        partition), maybe twice; as the fleet's bus, first through its ``gate``."""
        self._check()
        if self.gate is not None:
            await self.gate.open(WORK_EPOCH.get())
        return self._send(topic, key, value, headers, partition)

    def _send(
        self,
        topic: str,
        key: str | bytes | None,
        value: Message | bytes,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[Any]:
        raw_key = key.encode() if isinstance(key, str) else key
        raw = value.encode() if isinstance(value, Message) else value
        full = self.topic(topic)
        tp = (
            TopicPartition(full, partition)
            if partition is not None
            else self.broker.partition_for(full, raw_key)
        )
        record = ConsumedRecord(
            full, raw, raw_key, headers=(trace_headers() if headers is None else headers) or []
        )
        loop = asyncio.get_running_loop()
        landing = max(loop.time() + self.broker.faults.delay(), self._last_landing.get(tp, 0.0))
        self._last_landing[tp] = landing
        done: asyncio.Future[Any] = loop.create_future()
        copies = 2 if self.broker.faults.duplicate() else 1
        if copies == 2:
            self.broker.count("duplicate record")

        def land() -> None:
            for _ in range(copies):
                self.broker.append(tp, record, "plain")
            if not done.done():
                done.set_result(None)

        loop.call_at(landing, land)
        return done

    async def publish_and_wait(
        self, topic: str, key: str | bytes | None, value: Message | bytes
    ) -> None:
        """Publish one record and wait until it landed."""
        await (await self.publish(topic, key, value))

    async def dead_letter(self, record: Record, reason: str) -> None:
        """Keep the dead letter (the simulator checks there are none) and put it on the topic."""
        self.broker.dead_letters.append((record, reason, self.service))
        letter = DeadLetter(
            original_topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            key=record.key,
            value=record.value,
            reason=reason,
            service=self.service,
            dead_lettered_at=asyncio.get_running_loop().time(),
        )
        await self._send("dead-letter", record.key, letter.model_dump_json().encode())

    def consumer(self, topics: Iterable[str], group: str, **options: Any) -> SimConsumer:
        """A consumer of logical ``topics`` in group ``group``."""
        consumer = SimConsumer(self, self.settings.group(group), options)
        names = [self.topic(t) for t in topics]
        if names:
            consumer.subscribe(names)
        return consumer

    def reader(self, **options: Any) -> SimConsumer:
        """A consumer in no group, of the partitions its caller assigns (aiokafka's default
        isolation, read_uncommitted, unless ``options`` name one)."""
        return SimConsumer(self, "", {"isolation_level": "read_uncommitted", **options})

    async def partitions(self, topic: str) -> list[TopicPartition]:
        """Every partition of logical ``topic``."""
        return self.broker.partitions(self.topic(topic))

    def transactional_producer(self, transactional_id: str) -> SimTransactionalProducer:
        """A producer for transactions under ``transactional_id``."""
        return SimTransactionalProducer(self, transactional_id)


class SimConsumer:
    """The consumer calls the services make, over the simulator's log."""

    def __init__(self, bus: SimBus, group: str, options: dict[str, Any]) -> None:
        bus.broker.members += 1
        self.member_id = f"{bus.service}-{bus.broker.members:06d}"
        self.bus = bus
        self.broker = bus.broker
        self.group = group
        self.latest = options.get("auto_offset_reset") == "latest"
        self.committed_only = options.get("isolation_level", "read_committed") == "read_committed"
        self.subscription: set[str] = set()
        self.listener: Any = None
        self.generation = 0
        self.pending: tuple[int, set[TopicPartition]] | None = None
        self.assigned: set[TopicPartition] = set()
        self.positions: dict[TopicPartition, int] = {}
        self.manual = False
        self.started = False
        self._buffer: list[Record] = []

    def subscribe(self, topics: Iterable[str], listener: Any = None) -> None:
        """Take the group's share of these full topic names."""
        self.subscription = set(topics)
        self.listener = listener

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read these partitions, outside any group."""
        self.manual = True
        self.assigned = set(partitions)

    async def start(self) -> None:
        """Join the group (if subscribed)."""
        self.started = True
        if self.subscription and not self.manual:
            self.broker.join(self)

    async def stop(self) -> None:
        """Leave the group (nothing is committed here)."""
        if self.started and not self.bus.severed:
            self.broker.leave(self)
        self.started = False

    def assignment(self) -> set[TopicPartition]:
        """The partitions this member owns now."""
        return set(self.assigned)

    async def _rebalanced(self) -> None:
        """Apply a pending assignment: revoke everything, then take the new share."""
        if self.pending is None:
            return
        generation, share = self.pending
        self.pending = None
        if self.listener is not None and self.assigned:
            await self.listener.on_partitions_revoked(set(self.assigned))
        self.generation = generation
        self.assigned = set(share)
        group = self.broker.groups[self.group]
        for tp in share:
            committed = group.committed.get(tp)
            if committed is not None:
                self.positions[tp] = committed
            else:
                self.positions[tp] = len(self.broker.log(tp)) if self.latest else 0
        if self.listener is not None:
            await self.listener.on_partitions_assigned(set(share))

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> Any:
        """Records from the owned partitions' positions, waiting up to ``timeout_ms``."""
        self.bus._check()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            await self._rebalanced()
            found: dict[TopicPartition, list[Record]] = {}
            budget = max_records or 500
            for tp in sorted(self.assigned):
                entries = self.broker.visible(tp, self._position(tp), self.committed_only)
                if not entries or budget <= 0:
                    continue
                take = min(budget, self.broker.faults.fetch_some(len(entries)))
                chosen = entries[:take]
                self.positions[tp] = chosen[-1].record.offset + 1
                budget -= take
                # ConsumedRecord's fields are read-only; Record's are what a consumer reads.
                picked = cast("list[Record]", [e.record for e in chosen if e.state != "aborted"])
                if picked:
                    found[tp] = picked
            if found or loop.time() >= deadline:
                return found
            changed = self.broker.changed
            try:
                async with asyncio.timeout_at(deadline):
                    await changed.wait()
            except TimeoutError:
                return {}

    def __aiter__(self) -> SimConsumer:
        return self

    async def __anext__(self) -> Record:
        """The next record (``async for record in consumer``), waiting as long as it takes."""
        while not self._buffer:
            for records in (await self.getmany(timeout_ms=60_000)).values():
                self._buffer.extend(records)
        return self._buffer.pop(0)

    def _position(self, tp: TopicPartition) -> int:
        return self.positions.setdefault(tp, 0)

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit offsets of partitions this member owns in the group's current generation."""
        self.bus._check()
        group = self.broker.groups.get(self.group)
        if group is None:
            raise CommitFailedError("simulated: not a member of the group")
        if self.pending is not None or self.generation != group.generation:
            raise CommitFailedError("simulated: the group rebalanced")
        if set(offsets) - self.assigned:
            raise CommitFailedError("simulated: a partition is no longer assigned")
        group.committed.update(offsets)

    async def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of ``tp``."""
        self.bus._check()
        group = self.broker.groups.get(self.group)
        return None if group is None else group.committed.get(tp)

    async def position(self, tp: TopicPartition) -> int:
        """The next offset a fetch of ``tp`` returns."""
        return self._position(tp)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Fetch ``tp`` from ``offset`` next."""
        self.positions[tp] = offset

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Fetch these partitions from their end."""
        for tp in partitions:
            self.positions[tp] = len(self.broker.log(tp))

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Fetch these partitions from their start."""
        for tp in partitions:
            self.positions[tp] = 0

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The end a reader of this isolation level sees."""
        return {tp: self._end(tp) for tp in partitions}

    def _end(self, tp: TopicPartition) -> int:
        return self.broker.stable_end(tp) if self.committed_only else len(self.broker.log(tp))

    def highwater(self, tp: TopicPartition) -> int:
        """The partition's end."""
        return len(self.broker.log(tp))

    def last_stable_offset(self, tp: TopicPartition) -> int:
        """Below the first open transaction's first record."""
        return self.broker.stable_end(tp)

    async def topics(self) -> set[str]:
        """The topics with a log."""
        return {tp.topic for tp in self.broker.logs}


@dataclass
class Transaction:
    """An open transaction: its records and the offsets it sends."""

    epoch: int
    entries: list[Entry] = field(default_factory=list)
    offsets: dict[str, dict[TopicPartition, int]] = field(default_factory=dict)


class _InTransaction:
    """What a transaction's body is handed: aiokafka's ``send`` and
    ``send_offsets_to_transaction``."""

    def __init__(self, producer: SimTransactionalProducer, transaction: Transaction) -> None:
        self._producer = producer
        self._transaction = transaction

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Any = None,
        partition: int | None = None,
    ) -> asyncio.Future[Any]:
        """Append one record to the transaction (visible once it commits)."""
        self._producer._check(self._transaction)
        broker = self._producer.bus.broker
        tp = (
            TopicPartition(topic, partition)
            if partition is not None
            else broker.partition_for(topic, key)
        )
        record = ConsumedRecord(topic, value, key, headers=list(headers or []))
        self._transaction.entries.append(broker.append(tp, record, "open"))
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        await asyncio.sleep(0)
        return done

    async def send_offsets_to_transaction(
        self, offsets: dict[TopicPartition, int], group: str
    ) -> None:
        """Commit these offsets of ``group`` with the transaction."""
        self._producer._check(self._transaction)
        self._transaction.offsets.setdefault(group, {}).update(offsets)
        await asyncio.sleep(0)


class SimTransactionalProducer:
    """``TransactionalProducer``'s surface: transactions that commit or abort whole; a lost
    commit answer re-initialises the producer (a new epoch, which ends the old transaction for
    good) and raises ``IndefiniteOutcome``."""

    def __init__(self, bus: SimBus, transactional_id: str) -> None:
        self.bus = bus
        self.transactional_id = transactional_id
        self.epoch: int | None = None
        self.reinitialised = 0

    async def start(self) -> None:
        """InitProducerId: a new epoch; the old epoch's open transaction is aborted."""
        if self.epoch is not None:
            return
        self.bus._check()
        broker = self.bus.broker
        self.epoch = broker.epochs.get(self.transactional_id, 0) + 1
        broker.epochs[self.transactional_id] = self.epoch
        stale = broker.open.pop(self.transactional_id, None)
        if stale is not None:
            broker.count("transaction aborted by a new epoch")
            _end(broker, stale, commit=False)
        await asyncio.sleep(0)

    async def stop(self) -> None:
        """Nothing to flush."""
        self.epoch = None

    def _check(self, transaction: Transaction) -> None:
        self.bus._check()
        if self.bus.broker.epochs.get(self.transactional_id) != transaction.epoch:
            raise ProducerFenced()

    async def transaction(self, body: Callable[[Any], Awaitable[None]]) -> None:
        """Run ``body`` in one transaction and commit it."""
        await self.start()
        assert self.epoch is not None
        broker = self.bus.broker
        transaction = Transaction(self.epoch)
        broker.open[self.transactional_id] = transaction
        try:
            await body(_InTransaction(self, transaction))
            self._check(transaction)
        except BaseException:
            if broker.open.get(self.transactional_id) is transaction:
                broker.open.pop(self.transactional_id)
                _end(broker, transaction, commit=False)
            raise
        if broker.faults.lose_commit_answer():
            broker.count("transaction answer lost")
            if broker.faults.commit_applied():
                broker.open.pop(self.transactional_id)
                _end(broker, transaction, commit=True)
            self.epoch = None
            self.reinitialised += 1
            await self.start()  # fences the old epoch; aborts the transaction if still open
            raise IndefiniteOutcome(
                f"simulated: the commit answer of {self.transactional_id!r} was lost"
            )
        broker.open.pop(self.transactional_id)
        _end(broker, transaction, commit=True)
        await asyncio.sleep(0)


def _end(broker: Broker, transaction: Transaction, *, commit: bool) -> None:
    for entry in transaction.entries:
        entry.state = "committed" if commit else "aborted"
    if commit:
        for group, offsets in transaction.offsets.items():
            broker.groups.setdefault(group, Group(group)).committed.update(offsets)
    broker._wake()
