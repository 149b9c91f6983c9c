"""The Kafka edge: an idempotent producer, manually committed consumers, dead-lettering, and a
transactional producer that re-initialises after an indefinite error."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from asyncio import ensure_future as _ensure_future
from asyncio import wait as _wait
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Protocol, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordTooLargeError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from kernel.adapters._indefinite import (
    ProducerRetired,
    RequestGuard,
    is_indefinite,
    needs_new_producer,
)
from kernel.adapters.backoff import MESSAGE, Backoff, Interrupted, nap
from kernel.adapters.dependencies import DEPENDENCIES
from kernel.adapters.health import HEALTH
from kernel.adapters.lag import LAG
from kernel.adapters.metrics import DEAD_LETTERS, MESSAGES, labelled
from kernel.adapters.offsets import OffsetTracker
from kernel.adapters.redis import OutputGate
from kernel.adapters.security import kafka_options
from kernel.adapters.tracing import Headers
from kernel.adapters.tracing import headers as trace_headers
from kernel.errors import (
    CutOffError,
    InfrastructureError,
    InvalidMessageError,
    StateMayBeLostError,
)
from kernel.rules.limits import cut_text, digest
from kernel.rules.state_versions import client_id as state_client_id
from kernel.settings import Settings
from schemas import DeadLetter, Message

log = logging.getLogger(__name__)

PRODUCER_BATCH_BYTES = 262_144
"""Largest batch a producer sends to one partition. aiokafka's default (16 KiB, ~25 commands or
outcomes) fills under load, and a send into a full batch waits until that batch is acked:
bursts stalled on a round trip, and the broker got many small produce requests."""

TRANSACTION_RETRY_BACKOFF_MS = 2
"""How soon a transactional producer retries a refused request (see ``transactional_producer``).
Idle one-call turns, alternating runs: the hop from a turn result's send to its read had p90
12.2-15.7 ms at 10 ms and 8.6-10.3 ms at 2 ms (p50 5.3-6.1 either way)."""

COMMIT_INTERVAL_S = 0.2
"""How often a consumer commits what it has handled. Not after every polled batch: under load
that is hundreds of commits a second, each a write to the broker and a round trip the next
batch waits for. A crash redelivers at most this much more, and every handler is idempotent."""


class Record(Protocol):
    """The fields of a consumed Kafka record that toolfleet reads."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]
    """W3C trace context among them (``kernel.adapters.tracing``)."""


Handler = Callable[[Record], Awaitable[None]]

T = TypeVar("T")

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    KafkaError,
    RedisConnectionError,
    RedisTimeoutError,
    InfrastructureError,
    ConnectionError,
    TimeoutError,
)
"""Errors that say a dependency is unavailable, not that the message is bad: retried forever
(catch ``NEVER_FITS`` first: those are KafkaErrors too, and retrying them never helps)."""

NEVER_FITS: tuple[type[BaseException], ...] = (MessageSizeTooLargeError, RecordTooLargeError)
"""A record that Kafka will never take: a bug or a limit set wrong, never a passing outage."""


class Bus(Protocol):
    """What a service needs of the message bus; services take one in their constructor.

    ``KafkaBus`` is the implementation the application builds from ``Settings``;
    ``toolfleet.testing.InMemoryBus`` records what a service publishes, for tests that drive a
    service's handlers directly.
    """

    service: str
    """Who publishes: dead letters and client ids name it."""

    gate: OutputGate | None
    """What a record waits for before it is sent (the service's Redis writes replicated;
    ``OutputGate``), and what a consume loop asks before it commits offsets. None: nothing."""

    async def start(self) -> None:
        """Connect; a service calls it at the start of ``run``."""

    async def stop(self) -> None:
        """Flush and disconnect; a service calls it when ``run`` returns."""

    def topic(self, name: str) -> str:
        """The full name of a logical topic."""

    async def publish(
        self,
        topic: str,
        key: str | bytes | None,
        value: Message | bytes,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[Any]:
        """Queue one record; the returned future resolves when the broker has it. Its headers
        carry ``headers`` or, by default, the current trace context; ``partition`` overrides
        the key's (the key still travels with the record)."""

    async def publish_and_wait(
        self, topic: str, key: str | bytes | None, value: Message | bytes
    ) -> None:
        """Publish one record and wait until the broker has it."""

    async def dead_letter(self, record: Record, reason: str) -> None:
        """Put a record's original bytes on the dead-letter topic, with the reason."""

    def consumer(self, topics: Iterable[str], group: str, **options: Any) -> AIOKafkaConsumer:
        """A consumer of logical ``topics`` whose offsets only the caller commits."""

    def reader(self, **options: Any) -> AIOKafkaConsumer:
        """A consumer in no group, of the partitions its caller assigns (a client's view of
        a topic); ``options`` are aiokafka's (``isolation_level``, say)."""

    async def partitions(self, topic: str) -> list[TopicPartition]:
        """Every partition of logical ``topic``, once the broker's metadata names them."""

    def transactional_producer(self, transactional_id: str) -> TransactionalProducer:
        """A producer whose records a ``read_committed`` reader sees only once committed."""


class KafkaBus:
    """One process's connection to Kafka: publishes with an idempotent, acks=all producer.

    After an error that leaves that producer fenced or out of step with the broker, or a
    batch's fate unknown to its caller (``needs_new_producer``), the producer is replaced
    before the next record is sent; see ``publish`` for why a lost answer alone is not such
    an error.
    """

    def __init__(self, settings: Settings, service: str) -> None:
        self.settings = settings
        self.service = service
        self.gate: OutputGate | None = None
        self._producer: AIOKafkaProducer | None = None
        self._stale: AIOKafkaProducer | None = None
        """The producer to replace before anything else is sent (None: it is fine)."""
        self._renewing = asyncio.Lock()

    async def start(self) -> None:
        """Connect the producer."""
        producer = self._idempotent_producer()
        await producer.start()
        self._producer = producer

    def _idempotent_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            **kafka_options(self.settings),
            client_id=f"toolfleet-{self.service}",
            enable_idempotence=True,
            acks="all",
            linger_ms=self.settings.kafka_linger_ms,
            max_batch_size=PRODUCER_BATCH_BYTES,
            request_timeout_ms=self.settings.kafka_request_timeout_ms,
        )

    async def stop(self) -> None:
        """Flush and disconnect the producer."""
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    @property
    def producer(self) -> AIOKafkaProducer:
        """The started producer."""
        if self._producer is None:
            raise InfrastructureError("KafkaBus used before start(); await bus.start() first")
        return self._producer

    def topic(self, name: str) -> str:
        """Full name of a logical topic."""
        return self.settings.topic(name)

    async def publish(
        self,
        topic: str,
        key: str | bytes | None,
        value: Message | bytes,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[Any]:
        """Queue one record on logical ``topic``; await the returned future for the broker's ack.

        Returning the future lets a caller queue many records and await them together, which
        keeps the producer's batches full while preserving per-key order. The record's headers
        are ``headers`` or, by default, the current trace context; ``partition`` overrides the
        key's.

        With a ``gate``, the record waits until the Redis writes made so far are replicated,
        and is refused (``StateMayBeLostError``) when a Redis connection was lost since the
        work of the record being handled began: what it says may have been taken back.
        """
        if self.gate is not None:
            await self.gate.open(WORK_EPOCH.get())
        return await self._send(topic, key, value, headers, partition)

    async def _send(
        self,
        topic: str,
        key: str | bytes | None,
        value: Message | bytes,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[Any]:
        raw_key = key.encode() if isinstance(key, str) else key
        raw = value.encode() if isinstance(value, Message) else value
        producer = await self._usable_producer()
        try:
            future: asyncio.Future[Any] = await producer.send(
                self.topic(topic),
                raw,
                key=raw_key,
                partition=partition,
                headers=(trace_headers() if headers is None else headers) or None,
            )
        except Exception as exc:
            self._met(producer, exc)
            raise
        future.add_done_callback(lambda done: self._met(producer, _failure(done)))
        return future

    def _met(self, producer: AIOKafkaProducer, error: BaseException | None) -> None:
        """``producer`` raised ``error`` to a caller: replace it before the next send if it
        can no longer go on as it is.

        Not after a lost answer that aiokafka retries itself: the retry carries the same
        producer id, epoch and sequence numbers, so the broker recognises a batch it already
        has and answers with its first offset; records of one partition stay in order (one
        request in flight per broker). A new producer id there would turn that retry into a
        duplicate, and could let the old producer's batch land behind the new one's. Such a
        wait is bounded by ``kafka_request_timeout_ms`` per attempt: the connection is then
        dropped and the batch sent again. What reaches a caller is different: a batch failed
        (or the producer's sender died), the caller sends its record again, and a producer
        whose sequence numbers may no longer match the broker's would have every later batch
        of that partition refused. A fresh producer id starts a fresh sequence space; the
        record sent again may then be a duplicate, which every consumer of the fleet
        tolerates (outcomes are recorded per call and fencing token, commands per call)."""
        if producer is not self._producer or self._stale is producer:
            return
        if (error is not None and needs_new_producer(error)) or _sender_died(producer):
            self._stale = producer
            log.warning(
                "the producer will be replaced before its next record",
                extra={"service": self.service, "error": repr(error)},
            )

    async def _usable_producer(self) -> AIOKafkaProducer:
        """The producer, replaced first when the last error said it must be."""
        producer = self.producer
        if self._stale is not producer:
            return producer
        async with self._renewing:
            if self._stale is self._producer and self._producer is not None:
                old = self._producer
                await _discard(old, self.settings.kafka_request_timeout_ms / 1000)
                fresh = self._idempotent_producer()
                await fresh.start()
                self._producer, self._stale = fresh, None
                log.info("producer replaced", extra={"service": self.service})
        return self.producer

    async def publish_and_wait(
        self, topic: str, key: str | bytes | None, value: Message | bytes
    ) -> None:
        """Publish one record and wait until the broker has it (acks=all)."""
        await (await self.publish(topic, key, value))

    async def dead_letter(self, record: Record, reason: str) -> None:
        """Put ``record``'s original bytes on the dead-letter topic with where it came from.

        Never too big to send: a value over ``dead_letter_value_max_bytes`` keeps a prefix,
        with the original's size and sha256 (and, with ``dead_letter_overflow_dir``, the whole
        value in a file named by that digest); the key and the reason are cut too.
        """
        value = record.value
        limit = self.settings.dead_letter_value_max_bytes
        cut = value is not None and len(value) > limit
        if cut and value is not None and self.settings.dead_letter_overflow_dir is not None:
            _overflow(self.settings.dead_letter_overflow_dir, value)
        key = record.key[:_KEY_MAX_BYTES] if record.key is not None else None
        letter = DeadLetter(
            tenant_id=_tenant_of(value) if not cut else None,
            original_topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            key=key,
            value=value[:limit] if value is not None else None,
            reason=cut_text(reason, _REASON_MAX_BYTES),
            service=self.service,
            dead_lettered_at=time.time(),
            value_size=len(value) if value is not None else None,
            value_sha256=digest(value) if value is not None else None,
            value_cut=cut,
        )
        raw = letter.model_dump_json(exclude_none=True).encode()
        if len(raw) > self.settings.max_message_bytes:  # a settings mistake: keep no bytes
            stripped = letter.model_copy(update={"value": None, "key": None, "value_cut": True})
            raw = stripped.model_dump_json(exclude_none=True).encode()
        await (await self._send("dead-letter", key, raw))  # depends on no Redis write
        DEAD_LETTERS.labels(self.service, record.topic).inc()
        log.warning(
            "dead-lettered a message",
            extra={
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "reason": reason,
            },
        )

    def transactional_producer(self, transactional_id: str) -> TransactionalProducer:
        """A producer for transactions under ``transactional_id`` (not started), re-initialised
        after an indefinite error (``TransactionalProducer``)."""

        def make() -> AIOKafkaProducer:
            return AIOKafkaProducer(
                **kafka_options(self.settings),
                client_id=f"toolfleet-{self.service}",
                transactional_id=transactional_id,
                enable_idempotence=True,
                acks="all",
                linger_ms=self.settings.kafka_linger_ms,
                max_batch_size=PRODUCER_BATCH_BYTES,
                request_timeout_ms=self.settings.kafka_request_timeout_ms,
                # A killed instance's open transaction blocks read_committed readers of
                # turn-results until it times out; its successor has a new transactional id.
                transaction_timeout_ms=10_000,
                # A transaction begun right after the last commit meets CONCURRENT_TRANSACTIONS
                # until the broker has written the commit markers (a few ms; KAFKA-5477), and
                # aiokafka retries it after this backoff: 100 ms by default, a tail on a turn.
                retry_backoff_ms=TRANSACTION_RETRY_BACKOFF_MS,
            )

        return TransactionalProducer(make, transactional_id, self.service)

    def consumer(self, topics: Iterable[str], group: str, **options: Any) -> AIOKafkaConsumer:
        """A consumer of logical ``topics`` whose offsets are committed only by the caller."""
        config: dict[str, Any] = {
            **kafka_options(self.settings),
            "group_id": self.settings.group(group),
            # Names the state version of this release: `toolfleet migrate --finish` waits
            # until no member of a service's group is of an earlier one.
            "client_id": state_client_id(self.service),
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "isolation_level": "read_committed",
            "session_timeout_ms": self.settings.session_timeout_ms,
            "heartbeat_interval_ms": max(1_000, self.settings.session_timeout_ms // 6),
            # aiokafka sends one fetch per broker at a time and leaves out partitions whose
            # records are still buffered: if that fetch holds only quiet partitions, the
            # others wait for it to time out (500 ms by default), a tail on every hop.
            "fetch_max_wait_ms": 50,
        }
        consumer = AIOKafkaConsumer(**(config | options))
        LAG.track(consumer, config["group_id"])  # toolfleet_consumer_lag
        names = [self.topic(t) for t in topics]
        if names:
            consumer.subscribe(names, listener=_LogAssignments())
        return consumer

    def reader(self, **options: Any) -> AIOKafkaConsumer:
        """A consumer in no group, of the partitions its caller assigns (a client's view of
        a topic); ``options`` are aiokafka's (``isolation_level``, say)."""
        return AIOKafkaConsumer(**kafka_options(self.settings), enable_auto_commit=False, **options)

    async def partitions(self, topic: str) -> list[TopicPartition]:
        """Every partition of logical ``topic``, once the broker's metadata names them."""
        full = self.topic(topic)
        return [TopicPartition(full, p) for p in sorted(await self.producer.partitions_for(full))]


class IndefiniteOutcome(InfrastructureError):
    """A transaction's outcome is unknown: an answer it needed never came. Its producer has
    been re-initialised (the old epoch fenced, the transaction committed or aborted for good
    by the coordinator); what the transaction committed tells whether it did (a
    consume-transform-produce loop reads its group's committed offsets), and its work is
    redone only if it did not."""


class TransactionalProducer:
    """A transactional producer that re-initialises after an indefinite error.

    Each ``transaction`` is begun, filled by its body and committed. aiokafka retries a lost
    answer itself, with the same epoch, and that retry is what Jepsen showed can land in the
    wrong transaction; so every request of the producer passes a ``RequestGuard``, which lets
    nothing more out after the first request whose outcome is unknown (a timeout, a dropped
    connection, an answer naming such an error). The producer is then closed and a new one
    started under the same transactional id: its InitProducerId makes the coordinator finish
    a transaction whose commit it already has or abort the open one, and bumps the epoch, so
    nothing of the old epoch can land anywhere afterwards. Only then does ``transaction``
    raise ``IndefiniteOutcome``; the caller decides from what it can read whether to redo
    the transaction's work.
    """

    def __init__(
        self, make: Callable[[], AIOKafkaProducer], transactional_id: str, service: str
    ) -> None:
        self._make = make
        self.transactional_id = transactional_id
        self.service = service
        self._producer: AIOKafkaProducer | None = None
        self._guard: RequestGuard | None = None
        self.reinitialised = 0
        """How many times an indefinite error made this producer start again."""

    async def start(self) -> None:
        """Start the producer unless it runs (an InitProducerId: once it returns, every
        transaction of an earlier epoch of this transactional id is committed or aborted)."""
        if self._producer is not None:
            return
        producer = self._make()
        guard = RequestGuard(producer.client)
        try:
            await producer.start()
        except BaseException:
            guard.retire()
            await _discard(producer, 0)
            raise
        self._producer, self._guard = producer, guard

    async def stop(self) -> None:
        """Flush and disconnect (a producer met by an indefinite error is simply closed)."""
        producer, guard = self._producer, self._guard
        self._producer = self._guard = None
        if producer is None or guard is None:
            return
        if guard.error is None:
            await producer.stop()
        else:
            guard.retire()
            await _discard(producer, 0)

    async def transaction(self, body: Callable[[AIOKafkaProducer], Awaitable[None]]) -> None:
        """Run ``body`` (it sends records and offsets with the producer it is given) in one
        transaction and commit it.

        Raises ``IndefiniteOutcome`` when the transaction's outcome is unknown, once the
        producer has been closed and (broker permitting) re-initialised: call ``start``, which
        re-initialises it if that could not be done yet, before reading what the transaction
        committed. Raises any other error once the transaction was aborted (nothing of it is
        visible to a read_committed reader).
        """
        await self.start()  # again after a re-initialisation that could not start
        producer, guard = self._producer, self._guard
        assert producer is not None and guard is not None
        work = _ensure_future(self._transact(producer, guard, body))
        tripped = _ensure_future(guard.tripped.wait())
        try:
            await _wait((work, tripped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            tripped.cancel()
            if not work.done():  # the guard tripped (or the caller was cancelled)
                work.cancel()
                await _wait((work,))
        failure = None if work.cancelled() else work.exception()
        if guard.error is None and failure is None:
            return
        if guard.error is None and failure is not None and not needs_new_producer(failure):
            raise failure  # the transaction was aborted
        cause = guard.error or failure
        await self._reinitialise(cause)
        if failure is None and not work.cancelled():
            return  # committed: the answer to its EndTxn came; a later request lost its own
        raise IndefiniteOutcome(
            f"the outcome of a transaction of {self.transactional_id!r} is unknown "
            f"({cause!r}): its producer was re-initialised; what it committed says whether "
            "to redo it"
        ) from cause

    async def _transact(
        self,
        producer: AIOKafkaProducer,
        guard: RequestGuard,
        body: Callable[[AIOKafkaProducer], Awaitable[None]],
    ) -> None:
        await producer.begin_transaction()
        try:
            await body(producer)
        except BaseException as exc:
            # After an indefinite error nothing more is sent under this epoch (not even an
            # abort): the next InitProducerId aborts the transaction.
            if guard.error is None and not needs_new_producer(exc):
                await producer.abort_transaction()
            raise
        await producer.commit_transaction()

    async def _reinitialise(self, cause: BaseException | None) -> None:
        """Close the producer (it sends nothing more) and start a new one under the same
        transactional id, which fences the old epoch. If the broker cannot be reached for
        that now, the next ``start`` (before any transaction) does it."""
        old, guard = self._producer, self._guard
        self._producer = self._guard = None
        fenced = _producer_id(old)
        if guard is not None:
            guard.retire()
        if old is not None:
            await _discard(old, 0)
        self.reinitialised += 1
        try:
            await self.start()
        except Exception as exc:
            log.warning(
                "transactional producer not started again yet",
                extra={"transactional_id": self.transactional_id, "error": repr(exc)},
            )
            return
        log.warning(
            "transactional producer re-initialised after an indefinite error",
            extra={
                "service": self.service,
                "transactional_id": self.transactional_id,
                "error": repr(cause),
                "fenced": fenced,
                "now": _producer_id(self._producer),
            },
        )


def _failure(done: asyncio.Future[Any]) -> BaseException | None:
    return None if done.cancelled() else done.exception()


def _sender_died(producer: AIOKafkaProducer) -> bool:
    """Whether the producer's sender task has ended: every later send raises what ended it
    (aiokafka keeps no public flag for it)."""
    task = getattr(getattr(producer, "_sender", None), "sender_task", None)
    return task is not None and task.done()


def _producer_id(producer: AIOKafkaProducer | None) -> str | None:
    """The producer id and epoch of a started producer, as "id/epoch" for the log."""
    manager = getattr(producer, "_txn_manager", None)
    if manager is None or not manager.has_pid():
        return None
    return f"{manager.producer_id}/{manager.producer_epoch}"


async def _discard(producer: AIOKafkaProducer, flush_within: float) -> None:
    """Close ``producer`` without waiting on batches it can no longer deliver.

    What it delivers within ``flush_within`` seconds is delivered; the rest fail with
    ``ProducerRetired`` (their senders re-send them through the next producer, or the
    transaction's work is redone). aiokafka's ``stop`` alone would wait for every batch, for
    ever when the broker never answers; failing them goes through its accumulator, which has
    no public method for it.
    """
    if flush_within > 0 and not _sender_died(producer):
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(flush_within):
                await producer.flush()
    _fail_batches(producer, ProducerRetired("the producer was replaced"))
    try:
        async with asyncio.timeout(_CLOSE_WITHIN_S):
            await producer.stop()
    except Exception as exc:  # closing what is being thrown away: nothing to do about it
        log.debug("a replaced producer did not close cleanly", extra={"error": repr(exc)})


def _fail_batches(producer: AIOKafkaProducer, error: BaseException) -> None:
    """Fail every batch ``producer`` still holds with ``error``; the futures aiokafka keeps for
    itself are marked retrieved (nothing else awaits them once the producer is closed)."""
    accumulator = getattr(producer, "_message_accumulator", None)
    if accumulator is None:
        return
    held = [b for batches in accumulator._batches.values() for b in batches]
    held += list(accumulator._pending_batches)
    accumulator.fail_all(error)
    for batch in held:
        for future in (batch.future, getattr(batch, "_drain_waiter", None)):
            if future is not None and future.done() and not future.cancelled():
                future.exception()


_CLOSE_WITHIN_S = 5.0


class _LogAssignments(ConsumerRebalanceListener):  # type: ignore[misc]
    """Logs every assignment: operators (and tests) see when an instance owns what."""

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """Nothing to do: uncommitted records are redelivered to the next owner."""

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """Log the new assignment."""
        partitions = sorted(f"{tp.topic}:{tp.partition}" for tp in assigned)
        log.info("consumer assignment", extra={"partitions": partitions})
        HEALTH.set("assigned", True)  # the group has taken the instance in (/readyz)


_KEY_MAX_BYTES = 1_024
_REASON_MAX_BYTES = 4_096


def _overflow(directory: Path, value: bytes) -> None:
    """Keep a value too big for its dead letter, whole, in a file named by its sha256."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{digest(value)}.bin"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(value)
        tmp.replace(path)


def _tenant_of(raw: bytes | None) -> str | None:
    try:
        tenant = json.loads(raw or b"").get("tenant_id")
    except (ValueError, AttributeError, RecursionError):  # whatever the bytes are
        return None
    return tenant if isinstance(tenant, str) else None


class ConsumeLoop:
    """The one consume loop of every service: polls, hands records over, commits offsets only
    for what is done, and applies the one failure policy.

    Per record (the planner, the reconciler, the workers: ``handler``): records with the same
    key (a run_id; a command's call_id) are handled one after the other, in offset order, when
    ``ordered``; records with different keys concurrently, up to ``concurrency`` at once: a
    service waits on Kafka and Redis round trips, not on its CPU. Polling goes on while
    handlers run, so a record is handled as soon as it is fetched, not after the slowest
    record of the batch before it (a new turn never waits for another tenant's outcomes to be
    done); a partition's commit stops below its oldest unfinished record. A handler may give
    its concurrency slot back before it is done (``release_slot``: a worker's tool ended, its
    outcome is being published); ``in_hand`` then bounds the records not yet done.

    Per batch (the aggregator: ``batches``): each polled batch is handed over whole; the
    handler commits it itself (in the Kafka transaction of its results), and ``idle`` runs when
    a poll brings nothing. A batch that fails on a dependency is read again, from its first
    offsets, with backoff, until the cut-off.

    The failure policy, the same for every service:

    - ``InvalidMessageError`` from the handler dead-letters the record and moves on;
    - a record Kafka refuses for good (``NEVER_FITS``) is dead-lettered with the reason;
    - a transient error (Kafka, Redis, connection) retries the same record with backoff
      (``kernel.adapters.backoff.MESSAGE`` unless told otherwise: capped, with jitter; at once
      when the dependency monitor sees it back), until the cut-off: an outage must not turn
      good messages into dead letters. Past ``cut_off_after_s`` the loop raises
      ``CutOffError`` once in-flight records are done or left to the partitions' next owner;
    - any other exception retries up to ``max_attempts`` times, then dead-letters the record
      with the error as the reason, so one poison message never becomes a crash loop;
    - stopping ends a retry's wait: the record is left uncommitted, to the partition's next
      owner (every handler is idempotent).

    ``wanted`` picks the records the handler gets; the others (a service reading a busy topic
    for a few of its records) are only committed past, at no cost per record.
    """

    def __init__(
        self,
        bus: Bus,
        consumer: AIOKafkaConsumer,
        handler: Handler | None = None,
        *,
        batches: BatchHandler | None = None,
        idle: Callable[[], Awaitable[None]] | None = None,
        max_attempts: int = 5,
        backoff_s: float = MESSAGE.first_s,
        max_backoff_s: float = MESSAGE.cap_s,
        concurrency: int = 512,
        in_hand: int | None = None,
        ordered: bool = True,
        poll_ms: int = 100,
        max_records: int = 500,
        wanted: Callable[[Record], bool] | None = None,
        cut_off_after_s: float = Settings.model_fields["cut_off_after_s"].default,
        on_rewind: Callable[[], None] | None = None,
    ) -> None:
        if (handler is None) == (batches is None):
            raise ValueError("a consume loop takes a handler per record or per batch, not both")
        self.bus = bus
        self.on_rewind = on_rewind
        """Called when the loop reads again from the committed offsets (``rewind``)."""
        self.cut_off_after_s = cut_off_after_s
        self.wanted = wanted
        self.consumer = consumer
        self.handler = handler
        self.batches = batches
        self.idle = idle
        self.ordered = ordered
        self.poll_ms = poll_ms
        self.max_records = max_records
        self._slots = asyncio.Semaphore(concurrency)
        self._concurrency = concurrency
        self._taken = 0
        """Slots held by records now (given back by ``_Slot``)."""
        self._fetched = 0
        """Records of the last poll not started yet (each will take a slot)."""
        self._in_hand = asyncio.Semaphore(in_hand) if in_hand is not None else None
        self.max_attempts = max_attempts
        self.backoff = Backoff(backoff_s, max(backoff_s, max_backoff_s))
        """Between attempts at one record (the project's policy, ``kernel.adapters.backoff``)."""
        self._stopping = asyncio.Event()
        self._offsets = OffsetTracker()
        self._last: dict[tuple[TopicPartition, bytes | None], asyncio.Task[bool]] = {}
        """The newest task of each (partition, key): the next record of that key waits for it."""
        self._running: set[asyncio.Task[bool]] = set()
        self._touched: set[TopicPartition] = set()
        """Partitions with records started or done since the last commit (only those are
        committed: a partition handed to a peer and back must not go back to our offset)."""
        self._failure: BaseException | None = None
        self._epoch: int | None = None
        """The Redis epoch (``OutputGate.epoch``) when what is to be committed began."""
        self._batch_failures = 0
        self._unreachable_since: float | None = None
        """Since when batches have failed on a dependency (monotonic; None: they do not)."""

    @property
    def free_slots(self) -> int:
        """Slots no record holds and no fetched record is about to take (none once stopping):
        what more this loop could start at once."""
        if self._stopping.is_set():
            return 0
        return max(0, self._concurrency - self._taken - self._fetched)

    @property
    def stopping(self) -> bool:
        """Whether ``stop`` was called (or a cut-off stopped the loop)."""
        return self._stopping.is_set()

    def stop(self) -> None:
        """Finish the records in hand, commit, and return from ``run``."""
        self._stopping.set()

    def forget(self, partitions: set[TopicPartition]) -> None:
        """Partitions revoked from this consumer (a rebalance listener calls it): their
        unfinished records are redelivered to the new owner, and never committed here."""
        self._offsets.forget(partitions)
        self._touched -= partitions

    async def run(self) -> None:
        """Consume until ``stop`` is called (or a CutOffError, raised once in-flight records
        are done or left to the partitions' next owner)."""
        last_commit = time.monotonic()
        self._epoch = self._gate_epoch()
        try:
            while not self._stopping.is_set():
                batches = await self.consumer.getmany(
                    timeout_ms=self.poll_ms, max_records=self.max_records
                )
                if self.batches is not None:
                    await self._hand_over(batches)
                    continue
                self._fetched = sum(len(records) for records in batches.values())
                for tp, records in batches.items():
                    for record in records:
                        await self._start(tp, record)
                        self._fetched -= 1
                if time.monotonic() - last_commit >= COMMIT_INTERVAL_S:
                    await self._commit()
                    last_commit = time.monotonic()
        finally:
            self._stopping.set()  # records retrying give up; the next owner has them
            if self._running:
                await asyncio.wait(set(self._running))
            if self.batches is None:
                await self._commit()
        if self._failure is not None:
            raise self._failure  # CutOffError: uncommitted records go to this group's peers

    async def _hand_over(self, batches: dict[TopicPartition, list[Record]]) -> None:
        """Hand a polled batch to the batch handler; on a dependency error, read it again."""
        if not batches:
            if self.idle is not None:
                await self.idle()
            return
        assert self.batches is not None
        WORK_EPOCH.set(self._gate_epoch())
        try:
            await self.batches(batches)
        except StateMayBeLostError:
            # What was handled since the last commit may be gone from Redis: read it again. (The
            # dependency monitor says once that Redis went away: not a line per rewind.)
            log.debug("a Redis connection was lost; reading again from the committed offsets")
            await self.rewind()
            return
        except TRANSIENT_ERRORS as exc:
            # Nothing of the batch is committed: read it again (handling is idempotent). The
            # dependency monitor says once that Kafka or Redis is away, not every attempt.
            DEPENDENCIES.failed(exc)
            log.debug("batch failed; re-reading it", extra={"error": repr(exc)})
            self._unreachable_since = self._unreachable_since or time.monotonic()
            self._batch_failures += 1
            cut = cut_off(self._unreachable_since, self.cut_off_after_s, exc)
            if cut is not None:
                raise cut from exc
            if self._gate_epoch() != WORK_EPOCH.get():
                await self.rewind()  # the connection went: writes of earlier batches too
            else:
                for tp, records in batches.items():
                    self.consumer.seek(tp, records[0].offset)
            with contextlib.suppress(Interrupted):
                await nap(
                    self.backoff.delay(self._batch_failures),
                    until=self._stopping,
                    wake=DEPENDENCIES.back,
                )
            return
        self._unreachable_since = None
        self._batch_failures = 0

    def _gate_epoch(self) -> int | None:
        gate = self.bus.gate
        return None if gate is None else gate.epoch()

    async def rewind(self) -> None:
        """Read every assigned partition again from its committed offset (from its start
        without one), forgetting what was handled since: a Redis failover may have taken
        its writes back. Records still in hand finish, but count for nothing."""
        self._offsets = OffsetTracker()
        self._touched = set()
        self._epoch = self._gate_epoch()
        if self.on_rewind is not None:
            self.on_rewind()
        for tp in sorted(self.consumer.assignment()):
            MESSAGES.labels(self.bus.service, tp.topic, "rewound").inc()
            committed = await self.consumer.committed(tp)
            if committed is None:
                await self.consumer.seek_to_beginning(tp)
            else:
                self.consumer.seek(tp, committed)

    async def isolated(self, records: Sequence[Record], update: Awaitable[T]) -> T | None:
        """Run one piece of a batch (``update``, made from ``records``); if it fails for a
        reason other than Kafka or Redis being away, dead-letter its records (None) and go on:
        one bad turn must not stop every other run's results (a crash here would meet the
        same records after every restart). A dependency error is raised: the batch is read
        again."""
        try:
            return await update
        except NEVER_FITS as exc:
            await self._dead_letter(records, _never_fits(exc))
        except TRANSIENT_ERRORS:
            raise
        except Exception as exc:
            log.exception("handling failed", extra={"records": len(records)})
            await self._dead_letter(records, self._failed(exc, 1))
        return None

    async def _start(self, tp: TopicPartition, record: Record) -> None:
        """Hand ``record`` to a task, behind the unfinished record of its key (if any)."""
        self._offsets.started(tp, record.offset)
        self._touched.add(tp)
        if self.wanted is not None and not self.wanted(record):
            self._offsets.done(tp, record.offset)
            return
        if self._in_hand is not None:
            await self._in_hand.acquire()
        await self._slots.acquire()
        self._taken += 1
        slot = _Slot(self._slots, self._given_back)
        key = (tp, record.key if self.ordered else None)
        previous = self._last.get(key) if self.ordered else None
        task = asyncio.create_task(self._after(previous, tp, record, slot))
        if self.ordered:
            self._last[key] = task
        self._running.add(task)

        def finished(done: asyncio.Task[bool]) -> None:
            self._running.discard(done)
            slot.release()
            if self._in_hand is not None:
                self._in_hand.release()
            if self._last.get(key) is done:
                del self._last[key]
            error = None if done.cancelled() else done.exception()
            if error is not None and self._failure is None:
                self._failure = error
                self._stopping.set()

        task.add_done_callback(finished)

    def _given_back(self) -> None:
        self._taken -= 1

    async def _after(
        self, previous: asyncio.Task[bool] | None, tp: TopicPartition, record: Record, slot: _Slot
    ) -> bool:
        """Handle ``record`` once the record of its key before it is done; whether it was
        handled (a record left unhandled keeps its partition's commit below it)."""
        if previous is not None:
            await asyncio.wait([previous])
            if previous.cancelled() or previous.exception() is not None or not previous.result():
                return False  # left to the next owner, and so is everything after it
        _SLOT.set(slot)
        offsets = self._offsets  # a rewind while it runs makes it count for nothing
        handled = await self._handle(record)
        if handled and offsets is self._offsets:
            offsets.done(tp, record.offset)
            self._touched.add(tp)
        return handled

    async def _commit(self) -> None:
        """Commit what was handled, for the partitions still ours: a revoked partition's
        records are redelivered to its new owner, and every handler is idempotent."""
        assigned = self.consumer.assignment()
        touched, self._touched = self._touched, set()
        committable = self._offsets.committable()
        offsets = {tp: committable[tp] for tp in touched if tp in assigned and tp in committable}
        if not offsets:
            return
        if self.bus.gate is not None:
            # An offset says its record's writes are in Redis for good: they must be
            # replicated, and no connection may have been lost since they were made.
            try:
                await self.bus.gate.open(self._epoch)
            except StateMayBeLostError:
                log.debug("a Redis connection was lost; reading again from the committed offsets")
                await self.rewind()
                return
            except TRANSIENT_ERRORS as exc:
                DEPENDENCIES.failed(exc)
                self._touched |= touched  # committed with the next commit
                if self._gate_epoch() != self._epoch:
                    await self.rewind()
                return
        try:
            await self.consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError) as exc:
            log.warning("offset commit refused (rebalance)", extra={"error": repr(exc)})

    async def _handle(self, record: Record) -> bool:
        """Process one record; False only when stopping left it unprocessed (uncommitted).

        Raises CutOffError when Kafka or Redis stayed unreachable for longer than
        ``cut_off_after_s``: this instance must let its partitions go to its peers.
        """
        assert self.handler is not None
        attempt = 0
        unreachable_since: float | None = None
        while True:
            attempt += 1
            WORK_EPOCH.set(self._gate_epoch())  # each record's task has a context of its own
            try:
                await self.handler(record)
            except InvalidMessageError as exc:
                await self._dead_letter([record], exc.reason)
                return True
            except NEVER_FITS as exc:
                log.error("a produced record can never fit", extra={"topic": record.topic})
                await self._dead_letter([record], _never_fits(exc))
                return True
            except Interrupted:
                return False  # the handler saw the loop stopping before it began
            except TRANSIENT_ERRORS as exc:
                # Not a line per attempt: the dependency monitor says once that Kafka or
                # Redis is away (it checks at once), and once that it is back.
                DEPENDENCIES.failed(exc)
                log.debug(
                    "dependency unavailable; retrying the same message",
                    extra={"topic": record.topic, "offset": record.offset, "error": repr(exc)},
                )
                MESSAGES.labels(self.bus.service, record.topic, "retried").inc()
                unreachable_since = unreachable_since or time.monotonic()
                cut = cut_off(unreachable_since, self.cut_off_after_s, exc)
                if cut is not None:
                    raise cut from exc
            except Exception as exc:
                if attempt >= self.max_attempts:
                    log.exception("giving up on a message", extra={"topic": record.topic})
                    await self._dead_letter([record], self._failed(exc, attempt))
                    return True
                log.warning(
                    "handler failed; retrying",
                    extra={"topic": record.topic, "offset": record.offset, "error": repr(exc)},
                )
                MESSAGES.labels(self.bus.service, record.topic, "retried").inc()
            else:
                labelled(MESSAGES, self.bus.service, record.topic, "processed").inc()
                return True
            try:
                await nap(self.backoff.delay(attempt), until=self._stopping, wake=DEPENDENCIES.back)
            except Interrupted:
                return False  # stopping mid-retry: the next owner of the partition retries it

    def _failed(self, exc: BaseException, attempts: int) -> str:
        """The dead letter's reason for a record whose handling raised ``exc``."""
        if attempts > 1:
            return f"handler failed {attempts} times: {type(exc).__name__}: {exc}"
        return f"{self.bus.service} failed: {type(exc).__name__}: {exc}"

    async def _dead_letter(self, records: Sequence[Record], reason: str) -> None:
        for record in records:
            await self.bus.dead_letter(record, reason)
            MESSAGES.labels(self.bus.service, record.topic, "dead_lettered").inc()


BatchHandler = Callable[[dict[TopicPartition, list[Record]]], Awaitable[None]]
"""Handles one polled batch whole (``ConsumeLoop(batches=...)``), committing it itself."""


class _Slot:
    """One record's concurrency slot in its consume loop; given back exactly once."""

    def __init__(self, slots: asyncio.Semaphore, given_back: Callable[[], None]) -> None:
        self._slots: asyncio.Semaphore | None = slots
        self._given_back = given_back

    def release(self) -> None:
        """Give the slot back (again is a no-op)."""
        if self._slots is not None:
            self._slots.release()
            self._slots = None
            self._given_back()


_SLOT: ContextVar[_Slot | None] = ContextVar("toolfleet_consume_slot", default=None)

WORK_EPOCH: ContextVar[int | None] = ContextVar("toolfleet_work_epoch", default=None)
"""The Redis epoch (``OutputGate.epoch``) at which the work in hand began: a record it
publishes is refused if a connection was lost since (set by consume loops per attempt)."""
"""The slot of the record the current task handles (each record's task has its own)."""


def release_slot() -> None:
    """Give the current record's concurrency slot back before its handler is done: the next
    record may start while this one finishes (a worker's tool ended; its outcome is still
    being written and published, bounded by the loop's ``in_hand``). Outside a consume loop's
    handler it does nothing."""
    slot = _SLOT.get()
    if slot is not None:
        slot.release()


def _never_fits(exc: BaseException) -> str:
    return f"handling it produced a record Kafka refuses: {type(exc).__name__}"


def cut_off(since: float, bound_s: float, exc: BaseException) -> CutOffError | None:
    """The CutOffError to raise once a dependency has been unreachable since ``since``
    (monotonic) for longer than ``bound_s``; None while the bound holds."""
    if time.monotonic() - since <= bound_s:
        return None
    return CutOffError(
        f"Kafka or Redis unreachable for more than {bound_s:g} s ({exc!r}); giving up this "
        "instance's partitions to its peers until both answer again"
    )


__all__ = [
    "NEVER_FITS",
    "TRANSIENT_ERRORS",
    "BatchHandler",
    "Bus",
    "ConsumeLoop",
    "IndefiniteOutcome",
    "KafkaBus",
    "Record",
    "TopicPartition",
    "TransactionalProducer",
    "is_indefinite",
    "needs_new_producer",
    "release_slot",
]
