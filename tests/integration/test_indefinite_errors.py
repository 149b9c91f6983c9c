"""Indefinite errors against the real broker: the answer to a transaction's AddPartitionsToTxn,
produce or EndTxn, or to an idempotent produce, is lost or comes too late; a request reaches
the broker after its client gave up; an answer says the producer is out of step.

Jepsen's analysis of a Kafka-compatible broker (Bufstream, 2024) showed that a client that
retries after such an error can abort reads, lose writes and tear transactions, and advised
re-initialising producers. Here one service of an in-process fleet reaches Kafka through
``KafkaProxy``, which bends the requests and answers a test picks and records every one; what
the tests read is the broker's own word (the epochs its InitProducerId answers grant, the
requests that reached it) and the topics read back with read_committed and read_uncommitted.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.asyncio import Redis

from executors import ToolRegistry
from kernel.adapters.bus import KafkaBus
from kernel.settings import Settings
from kernel.stores.ledger import Ledger
from schemas import AgentRef, CallOutcome, ModelResponseEvent, TurnResult
from tests.conftest import aggregator_caught_up, wait_for
from tests.integration.proxy import (
    ADD_PARTITIONS_TO_TXN,
    END_TXN,
    INIT_PRODUCER_ID,
    PRODUCE,
    TXN_OFFSET_COMMIT,
    Fault,
    KafkaAnswer,
    KafkaProxy,
    KafkaRequest,
    Late,
    Once,
    Refused,
)
from toolfleet.testing import InProcessFleet

# A proxy in front of the one broker, and fleets of their own: the single-Redis pass runs them.
pytestmark = [pytest.mark.integration, pytest.mark.layout_free]

TENANT = "indefinite"
OUT_OF_ORDER_SEQUENCE, UNKNOWN_PRODUCER_ID = 45, 59
COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR = 15, 16
REQUEST_TIMEOUT_MS = 2_000
"""The proxied service's request timeout: past it an answer counts as lost."""
LATE = 3.0
"""How late a delayed answer comes: after the request timed out."""

tools = ToolRegistry()


@tools.tool(effect="read_only")
async def echo(text: str) -> str:
    """Says it back."""
    return text


class _Proxied(InProcessFleet):
    """An in-process fleet whose service ``proxied`` reaches Kafka through ``proxy``."""

    def __init__(self, settings: Settings, proxy: KafkaProxy, proxied: str) -> None:
        super().__init__(settings, echo, workers=1)
        self.proxy, self.proxied = proxy, proxied

    def _bus(self, service: str) -> KafkaBus:
        # The one place InProcessFleet builds a service's bus (a private hook: this test
        # module is its only other user).
        if service != self.proxied:
            return super()._bus(service)
        through = {
            "kafka_bootstrap_servers": self.proxy.address,
            "kafka_request_timeout_ms": REQUEST_TIMEOUT_MS,
        }
        return KafkaBus(self.settings.model_copy(update=through), service=service)


async def _fleet(settings: Settings, proxied: str) -> AsyncIterator[tuple[_Proxied, KafkaProxy]]:
    host, port = settings.kafka_servers().split(",")[0].rsplit(":", 1)
    proxy = KafkaProxy(host, int(port))
    await proxy.start()
    fleet = _Proxied(settings, proxy, proxied)
    try:
        async with fleet:
            yield fleet, proxy
    finally:
        await proxy.stop()


def turn(text: str) -> ModelResponseEvent:
    """One call of ``echo`` in a run of its own."""
    run = f"run-{uuid.uuid4().hex[:12]}"
    return ModelResponseEvent(
        tenant_id=TENANT, run_id=run, turn_id=0, agent=AgentRef(name="tester"),
        response_id=f"resp-{run}",
        items=[{"type": "function_call", "call_id": "c1", "name": "echo",
                "arguments": json.dumps({"text": text})}],
    )  # fmt: skip


async def _run(fleet: InProcessFleet, texts: list[str]) -> list[ModelResponseEvent]:
    """Submit a turn per text at once; each must end with its text as its one output."""
    events = [turn(text) for text in texts]
    for event in events:
        await fleet.client.submit(event)
    for event, text in zip(events, texts, strict=True):
        result = await fleet.client.result(event.run_id, 0, within=30)
        assert result.status == "completed", result
        assert [o.output for o in result.outputs] == [text]
    return events


async def _records(settings: Settings, topic: str, isolation: str) -> list[bytes]:
    """The value of every record on ``topic`` a reader with ``isolation`` sees."""
    partitions = [TopicPartition(settings.topic(topic), p) for p in range(settings.partitions)]
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_servers(),
        isolation_level=isolation,
        enable_auto_commit=False,
    )
    consumer.assign(partitions)
    await consumer.start()
    try:
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        found: list[bytes] = []
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            batch = await consumer.getmany(timeout_ms=500)
            found += [r.value or b"" for rs in batch.values() for r in rs]
        return found
    finally:
        await consumer.stop()


def _after(proxy: KafkaProxy, request: KafkaRequest) -> list[KafkaRequest]:
    """The requests that reached the proxy after ``request``."""
    return proxy.requests[proxy.requests.index(request) + 1 :]


@pytest.fixture(scope="class")
async def aggregating(settings: Settings) -> AsyncIterator[tuple[_Proxied, KafkaProxy]]:
    """A fleet whose aggregator reaches Kafka through the proxy."""
    async for running in _fleet(settings, "aggregator"):
        yield running


def _transactional_id(fleet: InProcessFleet, proxy: KafkaProxy) -> str:
    """The aggregator's transactional id, as its first InitProducerId named it."""
    prefix = f"{fleet.settings.topic_prefix}aggregator-"
    for request in proxy.requests:
        if request.api_key == INIT_PRODUCER_ID and (request.transactional_id or "").startswith(
            prefix
        ):
            return request.transactional_id or ""
    raise AssertionError("the aggregator's transactional producer never started")


def _matcher(kind: int, transactional_id: str) -> Callable[[KafkaRequest], bool]:
    """Picks the aggregator's first request of ``kind`` in a transaction that carries turn
    results (an EndTxn: of a transaction that added a partition of turn-results)."""
    added = False

    def matches(request: KafkaRequest) -> bool:
        nonlocal added
        if request.transactional_id != transactional_id:
            return False
        if request.api_key == ADD_PARTITIONS_TO_TXN:
            added = True
        return request.api_key == kind and (kind != END_TXN or added)

    return matches


class TestTheAggregatorsTransactions:
    """Every transactional producer re-initialises (its old epoch fenced) before it goes on;
    no turn result is emitted twice or torn, and every turn ends with exactly one result."""

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("fault", ["cut", LATE], ids=["answer-cut", "answer-late"])
    @pytest.mark.parametrize(
        "kind",
        [ADD_PARTITIONS_TO_TXN, PRODUCE, END_TXN],
        ids=["AddPartitionsToTxn", "Produce", "EndTxn"],
    )
    async def test_a_lost_answer_re_initialises_the_producer_and_each_turn_has_one_result(
        self, aggregating: tuple[_Proxied, KafkaProxy], kind: int, fault: Fault
    ) -> None:
        fleet, proxy = aggregating
        transactional_id = _transactional_id(fleet, proxy)
        rule = Once(_matcher(kind, transactional_id), fault)
        proxy.rule = rule
        try:
            events = await _run(fleet, [f"{kind}-{fault}-{i}" for i in range(4)])
        finally:
            proxy.rule = None
        hit = rule.hit
        assert hit is not None, "the fault was never injected"
        old = hit.producer()
        assert old is not None

        def granted_after() -> list[tuple[int, int]]:
            later = {id(r) for r in _after(proxy, hit)}
            return [
                (a.fields["producer_id"], a.fields["producer_epoch"])
                for a in proxy.answers
                if id(a.request) in later
                and a.request.api_key == INIT_PRODUCER_ID
                and a.request.transactional_id == transactional_id
                and a.fields.get("error_code") == 0
            ]

        # Re-initialised: the broker granted the same producer id a newer epoch (fencing the
        # old one) once the answer was lost.
        (renewed, *_) = await wait_for(lambda: asyncio.sleep(0, granted_after()), within=20)
        assert renewed[0] == old[0] and renewed[1] > old[1], (old, renewed)
        # Nothing under the old epoch after that InitProducerId was sent, and the request
        # whose answer was lost was never sent again under it (aiokafka's own retry).
        after = _after(proxy, hit)
        init = next(
            r
            for r in after
            if r.api_key == INIT_PRODUCER_ID and r.transactional_id == transactional_id
        )
        assert [r for r in _after(proxy, init) if r.producer() == old] == []
        assert [r for r in after if r.api_key == kind and r.producer() == old] == []

        extra = await _one_result_each(fleet, events)
        if kind == PRODUCE:
            # The lost produce had landed in the transaction the new epoch aborted: its
            # records are in the log, never committed, and each turn's result was sent again.
            assert extra, "the aborted attempt's results should be in the log"
            assert all(n == 1 for n in extra.values()), extra
        else:
            # AddPartitionsToTxn: nothing had been produced yet. EndTxn: the transaction had
            # committed, and the group's offsets said so: nothing was emitted again.
            assert extra == {}, extra

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize(
        "kind",
        [ADD_PARTITIONS_TO_TXN, PRODUCE, END_TXN],
        ids=["AddPartitionsToTxn", "Produce", "EndTxn"],
    )
    async def test_a_request_of_the_old_epoch_that_reaches_the_broker_late_is_refused(
        self, aggregating: tuple[_Proxied, KafkaProxy], kind: int
    ) -> None:
        """The hazard Jepsen names: a request the client gave up on is handled by the broker
        after the client went on. Its epoch was fenced by then, and the broker says so."""
        fleet, proxy = aggregating
        transactional_id = _transactional_id(fleet, proxy)
        rule = Once(_matcher(kind, transactional_id), Late(LATE))
        proxy.rule = rule
        try:
            events = await _run(fleet, [f"late-{kind}-{i}" for i in range(4)])
        finally:
            proxy.rule = None
        hit = rule.hit
        assert hit is not None, "the fault was never injected"
        late = await wait_for(_answered(proxy, hit), within=20)
        assert late is not None and not late.delivered
        assert _error_codes(late.fields) and _error_codes(late.fields) <= FENCED, late.fields
        old = hit.producer()
        assert old is not None
        granted = [
            a
            for a in proxy.answers[: proxy.answers.index(late)]
            if a.request.api_key == INIT_PRODUCER_ID
            and a.request.transactional_id == transactional_id
            and (a.fields.get("producer_id"), a.fields.get("producer_epoch")) > old
        ]
        assert granted, "a newer epoch was granted before the late request came"
        extra = await _one_result_each(fleet, events)
        if kind == END_TXN:
            # Its records had been produced; the new epoch aborted them, and the late commit
            # could not bring them back: each turn's result was sent again, once.
            assert extra and all(n == 1 for n in extra.values()), extra
        else:
            assert extra == {}, extra

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize(
        ("kind", "code"),
        [(TXN_OFFSET_COMMIT, COORDINATOR_NOT_AVAILABLE), (END_TXN, NOT_COORDINATOR)],
        ids=["TxnOffsetCommit-CoordinatorNotAvailable", "EndTxn-NotCoordinator"],
    )
    async def test_a_coordinator_that_refuses_is_asked_again_by_the_same_producer(
        self, aggregating: tuple[_Proxied, KafkaProxy], kind: int, code: int
    ) -> None:
        """A broker that is not (or not yet) the coordinator refuses the request: a definite
        answer. aiokafka asks again, under the same epoch; no new producer, nothing emitted
        again (found in CI: a refused TxnOffsetCommit taken for indefinite made the aggregator
        handle its records a second time)."""
        fleet, proxy = aggregating
        transactional_id = _transactional_id(fleet, proxy)
        rule = Once(_matcher(kind, transactional_id), Refused(code))
        proxy.rule = rule
        try:
            events = await _run(fleet, [f"refused-{kind}-{i}" for i in range(4)])
        finally:
            proxy.rule = None
        hit = rule.hit
        assert hit is not None, "the fault was never injected"

        def answered_again() -> list[KafkaAnswer]:
            later = {id(r) for r in _after(proxy, hit)}
            return [
                a
                for a in proxy.answers
                if id(a.request) in later
                and a.request.api_key == kind
                and a.request.producer() == hit.producer()
                and _error_codes(a.fields) <= {0}
            ]

        # Asked again once aiokafka's backoff passed, and answered. Not before the results
        # could be read: the broker applied the refused request (an EndTxn's markers are
        # written), so the turns' results may be read before aiokafka sends it again.
        await wait_for(lambda: asyncio.sleep(0, answered_again()), within=20)
        assert [
            r
            for r in _after(proxy, hit)
            if r.api_key == INIT_PRODUCER_ID and r.transactional_id == transactional_id
        ] == []
        assert await _one_result_each(fleet, events) == {}


FENCED = {47, 90}
"""INVALID_PRODUCER_EPOCH, PRODUCER_FENCED: the broker's word that an epoch is fenced."""


def _answered(proxy: KafkaProxy, request: KafkaRequest) -> Callable[[], Awaitable[Any]]:
    """A probe for ``wait_for``: the broker's answer to ``request`` (None until it came)."""
    return lambda: asyncio.sleep(0, next((a for a in proxy.answers if a.request is request), None))


def _error_codes(fields: dict[str, Any]) -> set[int]:
    """The error codes an answer names, at its top or per topic and partition."""
    codes = {fields["error_code"]} if "error_code" in fields else set()
    for name in ("topics", "errors"):
        for _, partitions in fields.get(name) or ():
            codes |= {partition[1] for partition in partitions}
    return codes - {0}


async def _one_result_each(
    fleet: InProcessFleet, events: list[ModelResponseEvent]
) -> dict[str, int]:
    """Once the aggregator has committed everything: asserts that a read_committed reader
    sees exactly one result per turn; returns how many more a read_uncommitted reader sees,
    per run that has more (results of aborted transactions)."""
    await wait_for(lambda: aggregator_caught_up(fleet.settings), within=20)
    runs = {event.run_id for event in events}
    committed = _runs(await _records(fleet.settings, "turn-results", "read_committed"))
    seen = _runs(await _records(fleet.settings, "turn-results", "read_uncommitted"))
    assert {run: committed[run] for run in runs} == dict.fromkeys(runs, 1)
    return {run: seen[run] - 1 for run in runs if seen[run] > 1}


def _written(answer: KafkaAnswer) -> dict[tuple[str, int], tuple[int, int]]:
    """(error code, base offset) per (topic, partition) of a produce answer."""
    return {
        (topic, partition[0]): (partition[1], partition[2])
        for topic, partitions in answer.fields["topics"]
        for partition in partitions
    }


def _runs(raw: list[bytes]) -> Counter[str]:
    return Counter(TurnResult.decode(value).run_id for value in raw)


@pytest.fixture(scope="class")
async def working(settings: Settings) -> AsyncIterator[tuple[_Proxied, KafkaProxy]]:
    """A fleet whose worker reaches Kafka through the proxy."""
    async for running in _fleet(settings, "worker-default"):
        yield running


class TestAWorkersOutcomes:
    """An idempotent producer whose answer is lost sends the same batch again (same producer
    id, epoch and sequence), which the broker recognises: no outcome counts twice, the
    ledger's attempts are unchanged, and the fleet goes on."""

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("fault", ["cut", "drop"], ids=["answer-cut", "answer-dropped"])
    async def test_a_lost_answer_to_an_outcome_is_sent_again_and_counts_once(
        self, working: tuple[_Proxied, KafkaProxy], redis: Redis, fault: Fault
    ) -> None:
        fleet, proxy = working
        outcomes = fleet.settings.topic("outcomes")

        def outcome_from_the_worker(request: KafkaRequest) -> bool:
            return request.api_key == PRODUCE and any(b[0] == outcomes for b in request.batches())

        rule = Once(outcome_from_the_worker, fault)
        proxy.rule = rule
        try:
            events = await _run(fleet, [f"outcome-{fault}-{i}" for i in range(3)])
        finally:
            proxy.rule = None
        hit = rule.hit
        assert hit is not None, "the fault was never injected"
        lost = [b for b in hit.batches() if b[0] == outcomes]
        first = await wait_for(_answered(proxy, hit))  # the broker wrote them and said so
        assert first is not None and not first.delivered

        def resent() -> list[KafkaAnswer]:
            return [
                a
                for a in proxy.answers
                if a.request is not hit and set(a.request.batches()) & set(lost)
            ]

        # aiokafka sends the same batches again (same producer id, epoch and base sequence,
        # in one request or more), and the broker answers with the offsets it gave them the
        # first time: it recognised them, wrote nothing twice.
        await wait_for(
            lambda: asyncio.sleep(
                0, {b for a in resent() for b in a.request.batches()} >= set(lost)
            )
        )
        for answer in resent():
            for batch in set(answer.request.batches()) & set(lost):
                assert _written(answer)[batch[:2]] == _written(first)[batch[:2]]
        # The producer was not replaced: the broker's recognition needs its sequence numbers.
        assert [r for r in _after(proxy, hit) if r.api_key == INIT_PRODUCER_ID] == []

        runs = {event.run_id for event in events}
        raw = await _records(fleet.settings, "outcomes", "read_committed")
        published = Counter(
            (o.run_id, o.call_id) for o in map(CallOutcome.decode, raw) if o.run_id in runs
        )
        assert published == {(run, "c1"): 1 for run in runs}
        ledger = Ledger(redis, fleet.keys)
        for run in runs:
            entry = (await ledger.read(TENANT, run, ["c1"]))["c1"]
            assert entry.attempts == 1, entry
        # The fleet goes on.
        await _run(fleet, ["after"])

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize(
        "code", [OUT_OF_ORDER_SEQUENCE, UNKNOWN_PRODUCER_ID], ids=["OutOfOrder", "UnknownPid"]
    )
    async def test_a_producer_the_broker_calls_out_of_step_is_replaced_and_the_fleet_goes_on(
        self, working: tuple[_Proxied, KafkaProxy], redis: Redis, code: int
    ) -> None:
        """An error that reaches the caller and says the producer's sequence numbers no
        longer match the broker's: the worker sends the outcome again, from a new producer
        (a fresh sequence space). The broker had in fact written the first one, so the
        outcome is on the topic twice, and still counts once."""
        fleet, proxy = working
        outcomes = fleet.settings.topic("outcomes")

        def outcome_from_the_worker(request: KafkaRequest) -> bool:
            return request.api_key == PRODUCE and any(b[0] == outcomes for b in request.batches())

        rule = Once(outcome_from_the_worker, Refused(code))
        proxy.rule = rule
        try:
            events = await _run(fleet, [f"refused-{code}-{i}" for i in range(3)])
        finally:
            proxy.rule = None
        hit = rule.hit
        assert hit is not None, "the fault was never injected"
        old = hit.producer()
        assert old is not None

        def replaced() -> list[KafkaAnswer]:
            later = {id(r) for r in _after(proxy, hit)}
            return [
                a
                for a in proxy.answers
                if id(a.request) in later
                and a.request.api_key == INIT_PRODUCER_ID
                and a.fields.get("error_code") == 0
            ]

        (init, *_) = await wait_for(lambda: asyncio.sleep(0, replaced()), within=20)
        assert init.fields["producer_id"] != old[0]
        # The refused batches went again, from the new producer: nothing more from the old.
        lost = {(b[0], b[1]) for b in hit.batches() if b[0] == outcomes}

        def resent() -> set[tuple[str, int]]:
            return {
                (b[0], b[1])
                for r in _after(proxy, init.request)
                for b in r.batches()
                if b[2] == init.fields["producer_id"]
            }

        await wait_for(lambda: asyncio.sleep(0, resent() >= lost), within=20)
        assert [r for r in _after(proxy, init.request) if r.producer() == old] == []

        runs = {event.run_id for event in events}
        ledger = Ledger(redis, fleet.keys)
        for run in runs:
            entry = (await ledger.read(TENANT, run, ["c1"]))["c1"]
            assert entry.attempts == 1, entry
        # Each turn's one result has one output (checked by _run), and the fleet goes on.
        await _run(fleet, ["after"])
