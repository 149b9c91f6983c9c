"""An in-memory ``Bus``: records what a service publishes, for tests that call its handlers.

A service takes its bus in its constructor; give it an ``InMemoryBus`` and call its handlers
(``Planner.handle``, ``Reconciler.handle``...) with records you build, then assert on
``published`` and ``dead_letters``. Consuming needs Kafka: ``consumer`` and
``transactional_producer`` refuse, with a message that says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from aiokafka import TopicPartition

from kernel.adapters.bus import Record
from kernel.adapters.tracing import Headers
from kernel.adapters.tracing import headers as trace_headers
from kernel.errors import UsageError
from kernel.settings import Settings
from schemas import Message


@dataclass(frozen=True)
class ConsumedRecord:
    """A record as a consumer would hand it to a service's handler (satisfies ``Record``)."""

    topic: str
    """The full topic name (``settings.topic(name)``)."""
    value: bytes | None
    key: bytes | None = None
    partition: int = 0
    offset: int = 0
    headers: Sequence[tuple[str, bytes]] = ()

    @classmethod
    def of(
        cls, settings: Settings, topic: str, message: Message, *, key: str | None = None
    ) -> ConsumedRecord:
        """``message`` as consumed from logical ``topic``, keyed by ``key``."""
        return cls(settings.topic(topic), message.encode(), key.encode() if key else None)


@dataclass(frozen=True)
class Published:
    """One record a service published: logical topic, key and the encoded value."""

    topic: str
    key: bytes | None
    value: bytes
    headers: Headers = field(default_factory=list)


@dataclass(frozen=True)
class DeadLettered:
    """One record a service dead-lettered, with its reason."""

    record: Record
    reason: str


@dataclass
class InMemoryBus:
    """A ``Bus`` that keeps what is published in lists instead of sending it anywhere."""

    service: str = "test"
    settings: Settings = field(default_factory=Settings)
    published: list[Published] = field(default_factory=list)
    dead_letters: list[DeadLettered] = field(default_factory=list)
    started: bool = False

    async def start(self) -> None:
        """Mark the bus started (nothing to connect)."""
        self.started = True

    async def stop(self) -> None:
        """Mark the bus stopped."""
        self.started = False

    def topic(self, name: str) -> str:
        """The full name of a logical topic, as the settings' prefix makes it."""
        return self.settings.topic(name)

    async def publish(
        self,
        topic: str,
        key: str | bytes | None,
        value: Message | bytes,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[Any]:
        """Record one message (with ``headers``, or the current trace context's; the in-memory
        bus has no partitions, so ``partition`` is ignored); the returned future is already
        resolved."""
        raw_key = key.encode() if isinstance(key, str) else key
        raw = value.encode() if isinstance(value, Message) else value
        kept = trace_headers() if headers is None else headers
        self.published.append(Published(topic, raw_key, raw, kept))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    async def publish_and_wait(
        self, topic: str, key: str | bytes | None, value: Message | bytes
    ) -> None:
        """Record one message."""
        await self.publish(topic, key, value)

    async def dead_letter(self, record: Record, reason: str) -> None:
        """Record a dead letter."""
        self.dead_letters.append(DeadLettered(record, reason))

    def on(self, topic: str) -> list[bytes]:
        """The values published on logical ``topic``, in order."""
        return [p.value for p in self.published if p.topic == topic]

    def consumer(self, topics: Iterable[str], group: str, **options: Any) -> NoReturn:
        """Refused: consuming needs a broker (use LocalFleet, or call the handlers)."""
        raise UsageError(
            "InMemoryBus cannot consume; call the service's handlers with records, or run the "
            "service against Kafka (toolfleet.testing.LocalFleet)"
        )

    def reader(self, **options: Any) -> NoReturn:
        """Refused: reading needs a broker."""
        raise UsageError(
            "InMemoryBus cannot consume; run against Kafka (toolfleet.testing.LocalFleet)"
        )

    async def partitions(self, topic: str) -> list[TopicPartition]:
        """The partitions the settings give ``topic``."""
        full = self.settings.topic(topic)
        return [TopicPartition(full, p) for p in range(self.settings.partitions_of(topic))]

    def transactional_producer(self, transactional_id: str) -> NoReturn:
        """Refused: transactions need a broker."""
        raise UsageError("InMemoryBus has no transactions; run the service against Kafka")
