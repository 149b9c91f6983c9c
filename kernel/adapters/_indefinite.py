"""Indefinite errors: a Kafka request whose answer never came may or may not have been applied.

Jepsen's analysis of a Kafka-compatible broker (Bufstream, 2024) showed what a client that
retries after such an error can do to transactions: a retried or late AddPartitionsToTxn,
produce or EndTxn of an old transaction lands in the next one (commit and abort markers travel
over other connections than the records), so reads abort, writes are lost, transactions tear.
The advice, followed here: after an indefinite error a transactional producer sends nothing
more under its epoch; it is re-initialised (a new InitProducerId, which makes the coordinator
finish or abort the old transaction and fences the old epoch) before anything else is sent,
and the caller decides from what it can read whether the transaction committed.

``is_indefinite`` and ``needs_new_producer`` are the pure decisions; ``RequestGuard`` watches
the requests of one producer's client and stops it from sending anything after the first
request whose outcome is unknown.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka.errors import (
    CorrelationIdError,
    IllegalStateError,
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    InvalidTxnState,
    KafkaConnectionError,
    KafkaError,
    KafkaProtocolError,
    KafkaStorageError,
    KafkaTimeoutError,
    NotEnoughReplicasAfterAppendError,
    NotLeaderForPartitionError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    RequestTimedOutError,
    TransactionCoordinatorFenced,
    UnknownError,
    UnknownProducerId,
    for_code,
)

INDEFINITE_ERRORS: tuple[type[BaseException], ...] = (
    # The answer did not come in time, or the connection it would have come on is gone.
    RequestTimedOutError,
    KafkaTimeoutError,
    TimeoutError,
    KafkaConnectionError,
    CorrelationIdError,
    KafkaProtocolError,
    # The broker took the request and cannot say how it ended: a produce appended by a leader
    # that lost its leadership (or its replicas) before acks=all was met, an error the broker
    # does not name.
    NotEnoughReplicasAfterAppendError,
    NotLeaderForPartitionError,
    KafkaStorageError,
    UnknownError,
)
"""Errors after which the client cannot know whether the broker applied its request. When in
doubt an error is here: a producer re-initialised for nothing costs one InitProducerId, an
outcome taken for known when it is not costs a duplicate or a torn transaction.

Not here: ``NotCoordinatorError`` and ``CoordinatorNotAvailableError``. A broker that is not
(or not yet) the coordinator refuses the request before handling it; aiokafka looks the
coordinator up again and asks it the same request under the same epoch, which a coordinator
answers the same way however often it is asked (a TxnOffsetCommit of the same offsets, the
EndTxn of a transaction already ending that way)."""
BROKEN_PRODUCER_ERRORS: tuple[type[BaseException], ...] = (
    ProducerFenced,
    InvalidProducerEpoch,
    TransactionCoordinatorFenced,
    OutOfOrderSequenceNumber,
    UnknownProducerId,
    InvalidProducerIdMapping,
    InvalidTxnState,
    IllegalStateError,
)
"""Errors after which a producer cannot go on as it is: its epoch was fenced, or its sequence
numbers no longer match the broker's (every later batch of that partition would be refused)."""

TRANSACTIONAL_API_KEYS = frozenset({0, 24, 25, 26, 28})
"""Requests that carry a producer's epoch or change its transaction: Produce,
AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit. A lost answer to FindCoordinator,
Metadata or InitProducerId changes nothing anyone reads, and is simply retried."""


def is_indefinite(error: BaseException | None) -> bool:
    """Whether ``error`` (or an error it was raised from) leaves a request's outcome unknown."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, INDEFINITE_ERRORS):
            return True
        seen.add(id(error))
        error = error.__cause__
    return False


def needs_new_producer(error: BaseException | None) -> bool:
    """Whether a producer that met ``error`` must be replaced before it sends anything else:
    the error is indefinite, or the producer is fenced or out of step with the broker."""
    seen: set[int] = set()
    cause = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, BROKEN_PRODUCER_ERRORS):
            return True
        seen.add(id(cause))
        cause = cause.__cause__
    return is_indefinite(error)


def answer_errors(response: Any) -> list[type[BaseException]]:
    """The error classes a Kafka response names, at its top or per topic and partition (the
    shapes of Produce, AddPartitionsToTxn, EndTxn, AddOffsetsToTxn, TxnOffsetCommit)."""
    codes: list[int] = []
    code = getattr(response, "error_code", None)
    if isinstance(code, int):
        codes.append(code)
    for field in ("topics", "errors"):
        for entry in getattr(response, field, None) or ():
            for partition in entry[1] if len(entry) > 1 else ():
                if isinstance(partition, tuple) and len(partition) > 1:
                    codes.append(partition[1])
    return [for_code(code) for code in codes if code]


class ProducerRetired(KafkaError):  # type: ignore[misc]
    """Raised to a retired producer's own sender for every request it still tries: the
    producer met an indefinite error and is being replaced."""

    retriable = False


class RequestGuard:
    """Watches every request of one producer's client; after the first request of
    ``TRANSACTIONAL_API_KEYS`` whose outcome is unknown (an indefinite error raised, or one
    named in the answer), lets nothing else go out: the producer's own retries wait until
    ``retire`` and are then refused. Its ``tripped`` event is set at that moment."""

    def __init__(self, client: Any) -> None:
        self._send = client.send
        client.send = self.send  # the sender calls client.send for every request it makes
        self.error: BaseException | None = None
        """The first indefinite error (None: none yet)."""
        self.tripped = asyncio.Event()
        self._retired = asyncio.Event()

    async def send(self, node_id: int, request: Any, **options: Any) -> Any:
        """``AIOKafkaClient.send`` unless the guard has tripped."""
        await self._hold()
        try:
            response = await self._send(node_id, request, **options)
        except Exception as exc:
            if request.API_KEY in TRANSACTIONAL_API_KEYS and is_indefinite(exc):
                self.trip(exc)
                await self._hold()
            raise
        if request.API_KEY in TRANSACTIONAL_API_KEYS:
            named = [e for e in answer_errors(response) if issubclass(e, INDEFINITE_ERRORS)]
            if named:
                self.trip(named[0]())
                await self._hold()
        return response

    def trip(self, error: BaseException) -> None:
        """Remember the first indefinite error and stop every request from now on."""
        if self.error is None:
            self.error = error
            self.tripped.set()

    def retire(self) -> None:
        """Let the held requests fail: the producer is being closed."""
        self.trip(ProducerRetired("the producer was retired"))
        self._retired.set()

    async def _hold(self) -> None:
        """Nothing passes a tripped guard: wait until retired, then refuse."""
        if self.error is None:
            return
        await self._retired.wait()
        raise ProducerRetired(
            f"this producer met an indefinite error ({self.error!r}) and was replaced"
        )
