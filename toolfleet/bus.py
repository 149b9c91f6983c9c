"""The Kafka edge: an idempotent producer, manually committed consumers, dead-lettering."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from aiokafka import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    TopicPartition,
)
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from schemas import DeadLetter, Message
from toolfleet.errors import InfrastructureError, InvalidMessageError
from toolfleet.metrics import DEAD_LETTERS, MESSAGES
from toolfleet.offsets import OffsetTracker
from toolfleet.settings import Settings

log = logging.getLogger(__name__)


class Record(Protocol):
    """The fields of a consumed Kafka record that toolfleet reads."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


Handler = Callable[[Record], Awaitable[None]]

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    KafkaError,
    RedisConnectionError,
    RedisTimeoutError,
    InfrastructureError,
    ConnectionError,
    TimeoutError,
)
"""Errors that say a dependency is unavailable, not that the message is bad: retried forever."""


class KafkaBus:
    """One process's connection to Kafka: publishes with an idempotent, acks=all producer."""

    def __init__(self, settings: Settings, service: str) -> None:
        self.settings = settings
        self.service = service
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        """Connect the producer."""
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.kafka_servers(),
            client_id=f"toolfleet-{self.service}",
            enable_idempotence=True,
            acks="all",
            linger_ms=2,
        )
        await self._producer.start()

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
        self, topic: str, key: str | bytes | None, value: Message | bytes
    ) -> asyncio.Future[Any]:
        """Queue one record on logical ``topic``; await the returned future for the broker's ack.

        Returning the future lets a caller queue many records and await them together, which
        keeps the producer's batches full while preserving per-key order.
        """
        raw_key = key.encode() if isinstance(key, str) else key
        raw = value.encode() if isinstance(value, Message) else value
        future: asyncio.Future[Any] = await self.producer.send(self.topic(topic), raw, key=raw_key)
        return future

    async def publish_and_wait(
        self, topic: str, key: str | bytes | None, value: Message | bytes
    ) -> None:
        """Publish one record and wait until the broker has it (acks=all)."""
        await (await self.publish(topic, key, value))

    async def dead_letter(self, record: Record, reason: str) -> None:
        """Put ``record``'s original bytes on the dead-letter topic with where it came from."""
        letter = DeadLetter(
            tenant_id=_tenant_of(record.value),
            original_topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            key=record.key,
            value=record.value,
            reason=reason,
            service=self.service,
            dead_lettered_at=time.time(),
        )
        await self.publish_and_wait("dead-letter", record.key, letter.model_dump_json().encode())
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

    def consumer(self, topics: Iterable[str], group: str, **options: Any) -> AIOKafkaConsumer:
        """A consumer of logical ``topics`` whose offsets are committed only by the caller."""
        config: dict[str, Any] = {
            "bootstrap_servers": self.settings.kafka_servers(),
            "group_id": f"{self.settings.topic_prefix}{group}",
            "client_id": f"toolfleet-{self.service}",
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "isolation_level": "read_committed",
            "session_timeout_ms": self.settings.session_timeout_ms,
            "heartbeat_interval_ms": max(1_000, self.settings.session_timeout_ms // 6),
        }
        return AIOKafkaConsumer(*(self.topic(t) for t in topics), **(config | options))


def _tenant_of(raw: bytes | None) -> str | None:
    try:
        tenant = json.loads(raw or b"").get("tenant_id")
    except (ValueError, AttributeError):
        return None
    return tenant if isinstance(tenant, str) else None


class ConsumeLoop:
    """Feeds records to a handler as they arrive; commits what every handler has finished.

    Records with the same key (a run_id everywhere in toolfleet) are handled one after the
    other, in offset order; records with different keys concurrently, up to ``concurrency``
    at once: a service waits on Kafka and Redis round trips, not on its CPU. Records are
    handed out as soon as they are polled (no batch waits for its slowest record), and a
    partition's offset is committed up to its oldest unfinished record, every
    ``commit_interval_s``. A revoked partition's handlers are given ``handover_s`` to finish
    and be committed before the partition goes to its new owner.

    - ``InvalidMessageError`` from the handler dead-letters the record and moves on;
    - a transient error (Kafka, Redis, connection) retries the same record with backoff,
      forever: an outage must not turn good messages into dead letters;
    - any other exception retries up to ``max_attempts`` times, then dead-letters the record
      with the error as the reason, so one poison message never becomes a crash loop.

    ``wanted`` picks the records the handler gets; the others (a service reading a busy topic
    for a few of its records) are only committed past, at no cost per record.
    """

    def __init__(
        self,
        bus: KafkaBus,
        topics: Iterable[str],
        group: str,
        handler: Handler,
        *,
        max_attempts: int = 5,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        concurrency: int = 64,
        wanted: Callable[[Record], bool] | None = None,
        commit_interval_s: float = 0.1,
        handover_s: float = 10.0,
    ) -> None:
        self.bus = bus
        self.wanted = wanted
        # The loop owns its consumer: it must subscribe with its rebalance listener first.
        self.consumer = bus.consumer([], group=group)
        self.consumer.subscribe([bus.topic(t) for t in topics], listener=_Handover(self))
        self.handler = handler
        self._slots = asyncio.Semaphore(concurrency)
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.commit_interval_s = commit_interval_s
        self.handover_s = handover_s
        self._stopping = asyncio.Event()
        self._offsets = OffsetTracker()
        self._last: dict[tuple[TopicPartition, bytes | None], asyncio.Task[bool]] = {}
        """The latest task per (partition, key): the next record of that key waits for it."""

    def stop(self) -> None:
        """Finish the records in hand, commit, and return from ``run``."""
        self._stopping.set()

    async def run(self) -> None:
        """Consume until ``stop`` is called."""
        await self.consumer.start()
        last_commit = time.monotonic()
        try:
            while not self._stopping.is_set():
                batches = await self.consumer.getmany(timeout_ms=50, max_records=500)
                for tp, records in batches.items():
                    for record in records:
                        await self._dispatch(tp, record)
                if time.monotonic() - last_commit >= self.commit_interval_s:
                    await self._commit()
                    last_commit = time.monotonic()
        finally:
            try:
                await self._drain(set(self.consumer.assignment()), within=None)
                await self._commit()
            finally:
                await self.consumer.stop()

    async def _dispatch(self, tp: TopicPartition, record: Record) -> None:
        self._offsets.started(tp, record.offset)
        if self.wanted is not None and not self.wanted(record):
            self._offsets.done(tp, record.offset)
            return
        await self._slots.acquire()
        key = (tp, record.key)
        task = asyncio.create_task(self._after(self._last.get(key), tp, record))
        self._last[key] = task
        task.add_done_callback(lambda t: self._last.pop(key) if self._last.get(key) is t else None)

    async def _after(
        self, previous: asyncio.Task[bool] | None, tp: TopicPartition, record: Record
    ) -> bool:
        """Handle ``record`` once its key's previous record is; False if left unhandled."""
        try:
            # A record left unhandled (stopping) leaves the rest of its key unhandled too.
            if previous is not None and not await asyncio.shield(previous):
                return False
            if not await self._handle(record):
                return False
            self._offsets.done(tp, record.offset)
            return True
        finally:
            self._slots.release()

    async def _commit(self) -> None:
        assigned = self.consumer.assignment()
        offsets = {tp: o for tp, o in self._offsets.committable().items() if tp in assigned}
        if not offsets:
            return
        try:
            await self.consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError) as exc:
            # A rebalance took partitions away: their records are redelivered to the new
            # owner, which the handlers' idempotence makes safe.
            log.warning("offset commit refused (rebalance)", extra={"error": repr(exc)})

    async def _drain(self, partitions: set[TopicPartition], within: float | None) -> None:
        """Wait (up to ``within`` seconds) for the handlers of records of ``partitions``."""
        running = [t for (tp, _), t in self._last.items() if tp in partitions]
        if running:
            await asyncio.wait(running, timeout=within)

    async def handover(self, revoked: set[TopicPartition]) -> None:
        """Partitions are being revoked: finish and commit what is in hand, then forget them."""
        await self._drain(revoked, within=self.handover_s)
        await self._commit()
        self._offsets.forget(revoked)

    async def _handle(self, record: Record) -> bool:
        """Process one record; False only when stopping left it unprocessed (uncommitted)."""
        attempt = 0
        while True:
            attempt += 1
            try:
                await self.handler(record)
            except InvalidMessageError as exc:
                await self.bus.dead_letter(record, exc.reason)
                MESSAGES.labels(self.bus.service, record.topic, "dead_lettered").inc()
                return True
            except TRANSIENT_ERRORS as exc:
                log.warning(
                    "dependency unavailable; retrying the same message",
                    extra={"topic": record.topic, "offset": record.offset, "error": repr(exc)},
                )
                MESSAGES.labels(self.bus.service, record.topic, "retried").inc()
            except Exception as exc:
                if attempt >= self.max_attempts:
                    reason = f"handler failed {attempt} times: {type(exc).__name__}: {exc}"
                    log.exception("giving up on a message", extra={"topic": record.topic})
                    await self.bus.dead_letter(record, reason)
                    MESSAGES.labels(self.bus.service, record.topic, "dead_lettered").inc()
                    return True
                log.warning(
                    "handler failed; retrying",
                    extra={"topic": record.topic, "offset": record.offset, "error": repr(exc)},
                )
                MESSAGES.labels(self.bus.service, record.topic, "retried").inc()
            else:
                MESSAGES.labels(self.bus.service, record.topic, "processed").inc()
                return True
            delay = min(self.max_backoff_s, self.backoff_s * 2 ** min(attempt - 1, 10))
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=delay)
            except TimeoutError:
                continue
            return False  # stopping mid-retry: the next owner of the partition retries it


class _Handover(ConsumerRebalanceListener):  # type: ignore[misc]
    """Lets a ConsumeLoop finish and commit a revoked partition's records before it moves."""

    def __init__(self, loop: ConsumeLoop) -> None:
        self.loop = loop

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """Finish, commit and forget the revoked partitions' records."""
        await self.loop.handover(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """Positions come from the committed offsets."""


__all__ = ["ConsumeLoop", "KafkaBus", "Record", "TopicPartition"]
