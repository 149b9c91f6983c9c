"""Which Kafka errors leave a request's outcome unknown, which leave a producer unusable, and
the guard that lets nothing out of a producer after the first such error."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import (
    ConcurrentTransactions,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    CorrelationIdError,
    InvalidProducerEpoch,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NodeNotReadyError,
    NotCoordinatorError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderForPartitionError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    RequestTimedOutError,
    TopicAuthorizationFailedError,
    UnknownProducerId,
    UnknownTopicOrPartitionError,
)
from aiokafka.protocol.produce import ProduceResponse_v8
from aiokafka.protocol.transaction import (
    AddPartitionsToTxnResponse_v0,
    EndTxnRequest_v0,
    EndTxnResponse_v0,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from kernel.adapters._indefinite import ProducerRetired, RequestGuard, answer_errors
from kernel.adapters.bus import is_indefinite, needs_new_producer

INDEFINITE = [
    RequestTimedOutError(),
    KafkaTimeoutError(),
    TimeoutError(),
    KafkaConnectionError("connection lost with a request in flight"),
    CorrelationIdError(),
    NotEnoughReplicasAfterAppendError(),
    NotLeaderForPartitionError(),
]

DEFINITE = [
    NodeNotReadyError(),  # the request never left
    NotEnoughReplicasError(),  # refused before the append
    UnknownTopicOrPartitionError(),
    CoordinatorLoadInProgressError(),
    NotCoordinatorError(),  # refused: asked again of the coordinator looked up anew
    CoordinatorNotAvailableError(),
    ConcurrentTransactions(),
    MessageSizeTooLargeError(),
    TopicAuthorizationFailedError(),
    ValueError("a bug, not the broker"),
    RedisConnectionError(),
]

BROKEN = [
    ProducerFenced(),
    InvalidProducerEpoch(),
    OutOfOrderSequenceNumber(),
    UnknownProducerId(),
]


@pytest.mark.parametrize("error", INDEFINITE, ids=lambda e: type(e).__name__)
def test_an_error_that_leaves_the_outcome_unknown_is_indefinite(error: BaseException) -> None:
    assert is_indefinite(error)
    assert needs_new_producer(error)


@pytest.mark.parametrize("error", DEFINITE, ids=lambda e: type(e).__name__)
def test_an_error_the_broker_answered_for_sure_is_not(error: BaseException) -> None:
    assert not is_indefinite(error)
    assert not needs_new_producer(error)


@pytest.mark.parametrize("error", BROKEN, ids=lambda e: type(e).__name__)
def test_a_fenced_or_out_of_step_producer_is_replaced_though_its_outcome_is_known(
    error: BaseException,
) -> None:
    assert not is_indefinite(error)
    assert needs_new_producer(error)


def test_an_error_raised_from_an_indefinite_one_is_indefinite() -> None:
    try:
        try:
            raise RequestTimedOutError()
        except RequestTimedOutError as timeout:
            raise KafkaError("Unexpected error during batch delivery") from timeout
    except KafkaError as wrapped:
        assert is_indefinite(wrapped)
    assert not is_indefinite(None)
    assert not needs_new_producer(None)


def test_the_errors_an_answer_names_are_read_at_its_top_and_per_partition() -> None:
    assert answer_errors(EndTxnResponse_v0(0, 0)) == []
    assert answer_errors(EndTxnResponse_v0(0, 16)) == [NotCoordinatorError]
    added = AddPartitionsToTxnResponse_v0(0, [("t", [(0, 0), (1, 7)])])
    assert answer_errors(added) == [RequestTimedOutError]
    produced = ProduceResponse_v8([("t", [(0, 6, -1, -1, -1, [], None)])], 0)
    assert answer_errors(produced) == [NotLeaderForPartitionError]


class _Client:
    """Stands in for aiokafka's client: answers or raises what the test says, per call."""

    def __init__(self, *results: Any) -> None:
        self.results = list(results)
        self.sent: list[Any] = []

    async def send(self, node_id: int, request: Any, **options: Any) -> Any:
        self.sent.append(request)
        result = self.results.pop(0)
        if isinstance(result, BaseException):
            raise result
        return result


async def test_the_guard_lets_nothing_out_after_an_indefinite_error_until_retired() -> None:
    end = EndTxnRequest_v0("txn", 1, 0, True)
    client = _Client(RequestTimedOutError(), EndTxnResponse_v0(0, 0))
    guard = RequestGuard(client)
    first = asyncio.ensure_future(client.send(0, end))
    await asyncio.wait_for(guard.tripped.wait(), 1)
    assert isinstance(guard.error, RequestTimedOutError)
    assert not first.done()  # held: its caller (aiokafka's sender) cannot retry yet
    again = asyncio.ensure_future(client.send(0, end))  # a retry all the same
    guard.retire()
    for held in (first, again):
        with pytest.raises(ProducerRetired):
            await held
    assert len(client.sent) == 1  # the retry never reached the broker


async def test_the_guard_trips_on_an_answer_that_names_an_indefinite_error() -> None:
    end = EndTxnRequest_v0("txn", 1, 0, True)
    client = _Client(EndTxnResponse_v0(0, 16), EndTxnResponse_v0(0, 7))
    guard = RequestGuard(client)
    assert (await client.send(0, end)).error_code == 16  # not the coordinator: refused
    assert guard.error is None
    answer = asyncio.ensure_future(client.send(0, end))
    await asyncio.wait_for(guard.tripped.wait(), 1)
    assert isinstance(guard.error, RequestTimedOutError)
    guard.retire()
    with pytest.raises(ProducerRetired):
        await answer


async def test_the_guard_passes_definite_errors_and_other_requests_unchanged() -> None:
    class Metadata:
        API_KEY = 3

    client = _Client(RequestTimedOutError(), NodeNotReadyError())
    guard = RequestGuard(client)
    with pytest.raises(RequestTimedOutError):  # a metadata request: retried, nothing changed
        await client.send(0, Metadata())
    with pytest.raises(NodeNotReadyError):  # never sent
        await client.send(0, EndTxnRequest_v0("txn", 1, 0, True))
    assert guard.error is None
