"""The aggregator process: plans and outcomes in, exactly one TurnResult per turn (and plan epoch).

Turn state lives in Redis, updated with an atomic read-modify-write, so recording an outcome
is idempotent. TurnResults are published in a Kafka transaction together with the consumed
offsets: a crash before the commit re-delivers the batch, a crash after it re-delivers
nothing. A batch that emits nothing (most outcomes settle no turn) costs no transaction of
its own: its offsets go with the next one, at most ``COMMIT_INTERVAL_S`` later. The
emission marker names the records that triggered it, so a redelivered trigger re-emits (the
first attempt's transaction never committed) while a late duplicate does not.

A transaction whose outcome is unknown (an answer lost: ``IndefiniteOutcome``) is not simply
read again: it may have committed, and re-reading its records would emit their results a
second time. Its producer is re-initialised first (the coordinator then has committed or
aborted it for good), and the group's committed offsets say which: if they cover what the
transaction sent, the records it handled are skipped; if not, they are handled again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NamedTuple

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from opentelemetry.trace import Span, SpanKind

from aggregator._store import StoredTurn, TurnStore
from aggregator._turn import (
    TurnState,
    accept_outcome,
    build_result,
    for_a_resumed_plan,
    is_settled,
    keep_early,
)
from kernel.adapters.bus import (
    COMMIT_INTERVAL_S,
    TRANSIENT_ERRORS,
    WORK_EPOCH,
    Bus,
    ConsumeLoop,
    IndefiniteOutcome,
    Record,
    TransactionalProducer,
)
from kernel.adapters.dependencies import DEPENDENCIES
from kernel.adapters.metrics import MESSAGES, TURN_LATENCY, labelled
from kernel.adapters.tracing import context_from_traceparent, headers_of, tracer
from kernel.errors import InvalidMessageError, StateMayBeLostError
from kernel.rules.auth import DecisionAuth
from kernel.rules.outcomes import ended
from kernel.settings import Settings
from kernel.stores.admission import queued_command
from kernel.stores.door import Stores
from schemas import CallOutcome, CancelRequest, TurnError, TurnPlan, TurnResult

log = logging.getLogger(__name__)

_CACHED_TURNS = 4_096
_PACE_FROM = 64
"""Batches smaller than this are not paced: the load is light enough for a transaction each."""
_MAX_BATCH = 2_000


class Emission(NamedTuple):
    """A TurnResult to publish, with what its plan says of it."""

    result: TurnResult
    planned_at: float
    """When the plan was made (for the latency histogram)."""
    traceparent: str | None
    """The planner's span for the turn: the aggregation span's parent."""


class Aggregator:
    """Consumes plans, outcomes and cancellations; publishes TurnResults transactionally."""

    def __init__(self, settings: Settings, *, bus: Bus, stores: Stores) -> None:
        self.settings = settings
        self.bus = bus
        bus.gate = stores.output_gate()
        self.keys = stores.keys
        self.admission = stores.admission()
        self.ledger = stores.ledger()
        self.runs = stores.run_turns()
        """Each run's turns (a cancellation ends them all) and the turns attached to a call."""
        self.instance = f"{socket.gethostname()}-{os.getpid()}"
        self.auth = DecisionAuth.of(settings)
        self._stopping = asyncio.Event()
        self._loop: ConsumeLoop | None = None
        """The consume loop, while serving (per batch: the batch's results and offsets are
        committed in one Kafka transaction)."""
        self._poll_began = time.monotonic()
        """When the loop last began to poll (the pacing of transactions counts from there)."""
        # Runs handled at once: their Redis steps share round trips (auto-pipelining), so a
        # whole polled batch goes at once instead of in waves.
        self._slots = asyncio.Semaphore(512)
        self.turns = TurnStore(stores.turn_hashes(), cached=_CACHED_TURNS)
        self._uncommitted: dict[TopicPartition, int] = {}
        """Offsets of handled batches that emitted nothing, for the next transaction."""
        self._unresolved: dict[TopicPartition, int] | None = None
        """The offsets a transaction of unknown outcome sent (None: there is none): resolved
        before anything else is handled."""
        self._handled_below: dict[TopicPartition, int] = {}
        """Per partition, the offset below which a committed transaction of unknown outcome
        handled every record."""
        self._committed_at = time.monotonic()
        self._since: int | None = None
        """The Redis epoch when the oldest batch not committed yet began (``OutputGate``)."""
        self._tracer = tracer("aggregator")
        self._batch_began_ns = time.time_ns()
        """When the batch being handled was polled: aggregation spans start there."""

    def stop(self) -> None:
        """Finish the current batch and return from ``run``."""
        self._stopping.set()
        if self._loop is not None:
            self._loop.stop()

    async def run(self) -> None:
        """Serve until stopped."""
        await self.bus.start()
        group = f"{self.settings.topic_prefix}aggregator"
        producer = self.bus.transactional_producer(f"{group}-{self.instance}")
        consumer = self.bus.consumer(["plans", "outcomes", "cancellations"], group="aggregator")
        await producer.start()
        await consumer.start()
        interval = self.settings.aggregator_transaction_interval_ms / 1000

        async def batch(batches: dict[TopicPartition, list[Record]]) -> None:
            began = self._poll_began
            await self._process(consumer, producer, group, batches)
            # A transaction costs the broker the same whatever its size: under load, let the
            # next batch gather for the rest of the interval (a full batch does not wait;
            # when idle or lightly loaded, the next record is handled at once, so a small
            # turn beside a busy tenant is not held back by the pacing).
            rest = interval - (time.monotonic() - began)
            if rest > 0 and _PACE_FROM <= sum(map(len, batches.values())) < _MAX_BATCH:
                await asyncio.sleep(rest)  # wait-ok: pacing, not waiting for a state
            self._poll_began = time.monotonic()

        async def idle() -> None:
            if self._uncommitted:
                await self._commit_quietly(consumer, producer, group)
            self._poll_began = time.monotonic()

        # The one consume loop, per batch: a batch failing on Kafka or Redis is read again
        # (nothing of it was committed) with backoff, until the cut-off.
        self._loop = ConsumeLoop(
            self.bus,
            consumer,
            batches=batch,
            idle=idle,
            on_rewind=self._forget_uncommitted,
            poll_ms=100,
            max_records=_MAX_BATCH,
            cut_off_after_s=self.settings.cut_off_after_s,
        )
        if self._stopping.is_set():
            self._loop.stop()
        self._poll_began = time.monotonic()
        try:
            await self._loop.run()
        finally:
            if self._uncommitted:
                await self._commit_quietly(consumer, producer, group)
            await consumer.stop()
            await producer.stop()
            await self.bus.stop()

    async def _process(
        self,
        consumer: AIOKafkaConsumer,
        producer: TransactionalProducer,
        group: str,
        batches: dict[TopicPartition, list[Record]],
    ) -> None:
        """Handle one polled batch and commit it (a Kafka or Redis error is raised: nothing of
        the batch is committed, and the consume loop reads it again; recording is
        idempotent)."""
        self._batch_began_ns = time.time_ns()
        if not self._uncommitted:
            self._since = WORK_EPOCH.get()
        if self._unresolved is not None:
            await self._resolve(consumer, producer)
        # Records a committed transaction of unknown outcome handled: never again, even when
        # a later failure has the consume loop read from below them.
        batches = {
            tp: rest
            for tp, records in batches.items()
            if (rest := [r for r in records if r.offset >= self._handled_below.get(tp, 0)])
        }
        if not batches:
            return
        # One run's records in order, different runs concurrently (all keyed by run_id).
        by_key: dict[bytes | None, list[Record]] = {}
        for records in batches.values():
            for record in records:
                by_key.setdefault(record.key, []).append(record)
        per_key = await asyncio.gather(*(self._handle_in_order(rs) for rs in by_key.values()))
        emitted = [e for results in per_key for e in results]
        handled = {tp: records[-1].offset + 1 for tp, records in batches.items()}
        offsets = self._uncommitted | handled
        if not emitted and time.monotonic() - self._committed_at < COMMIT_INTERVAL_S:
            self._uncommitted = offsets  # recorded in Redis; re-read after a crash
            return
        await self._commit(consumer, producer, group, emitted, offsets)
        for emission in emitted:
            labelled(TURN_LATENCY, emission.result.status).observe(
                time.time() - emission.planned_at
            )

    async def _commit(
        self,
        consumer: AIOKafkaConsumer,
        producer: TransactionalProducer,
        group: str,
        emitted: Sequence[Emission],
        offsets: dict[TopicPartition, int],
    ) -> None:
        """One transaction: the results of ``emitted`` and the offsets of what was handled
        (of the partitions still assigned: a revoked one's new owner reads it again)."""
        mine = consumer.assignment()
        owned = {tp: offset for tp, offset in offsets.items() if tp in mine}
        if self.bus.gate is not None:
            # The results and offsets say that the turns' states are in Redis for good.
            await self.bus.gate.open(self._since)
        spans = [self._aggregation_span(e) for e in emitted]
        topic = self.settings.topic("turn-results")

        async def send(kafka: AIOKafkaProducer) -> None:
            for emission, span in zip(emitted, spans, strict=True):
                result = emission.result
                raw = _fit(result, self.settings.max_message_bytes)
                sent = await kafka.send(
                    topic, raw, key=result.run_id.encode(), headers=headers_of(span) or None
                )
                # The commit says whether it landed; a record failed with its transaction
                # (the producer replaced) needs no word of its own.
                sent.add_done_callback(_retrieved)
            if owned:
                await kafka.send_offsets_to_transaction(owned, group)

        try:
            await producer.transaction(send)
        except BaseException as exc:
            if isinstance(exc, IndefiniteOutcome):
                self._unresolved = owned  # resolved before the batch is handled again
            for span in spans:
                span.record_exception(exc)
                span.end()
            raise
        for span in spans:
            span.end()
        self._uncommitted = {}
        self._committed_at = time.monotonic()

    def _aggregation_span(self, emission: Emission) -> Span:
        """The turn's aggregation span, child of its plan's: from the handling of the batch
        that settled the turn to the commit of the transaction that carries its result."""
        result = emission.result
        return self._tracer.start_span(
            "toolfleet aggregate",
            context=context_from_traceparent(emission.traceparent),
            kind=SpanKind.PRODUCER,
            start_time=self._batch_began_ns,
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.type": "send",
                "messaging.destination.name": self.settings.topic("turn-results"),
                "toolfleet.tenant_id": result.tenant_id,
                "toolfleet.run_id": result.run_id,
                "toolfleet.turn_id": result.turn_id,
                "toolfleet.status": result.status,
                "toolfleet.calls": len(result.calls),
            },
        )

    async def _resolve(
        self,
        consumer: AIOKafkaConsumer,
        producer: TransactionalProducer,
    ) -> None:
        """Find out whether the transaction of unknown outcome committed (if so, what it
        handled is skipped from now on: ``_handled_below``; a Kafka error is raised: asked
        again next batch).

        The producer's InitProducerId returns only once the coordinator has committed or
        aborted the old epoch's transaction, its offsets included; the group's committed
        offsets then tell which. They cover every partition the transaction sent, or none
        (it is atomic): a partition not covered means nothing of it committed. A transaction
        that sent no offsets (every partition of its batch revoked) is taken as not committed:
        the partitions' new owner reads those records again either way.
        """
        sent = self._unresolved or {}
        await producer.start()
        found = await asyncio.gather(*(consumer.committed(tp) for tp in sent))
        committed = dict(zip(sent, found, strict=True))
        self._unresolved = None
        if not sent or any((committed[tp] or 0) < offset for tp, offset in sent.items()):
            log.warning(
                "a transaction of unknown outcome did not commit: its records go again",
                extra={"partitions": len(sent)},
            )
            return
        log.warning(
            "a transaction of unknown outcome committed: its records are not handled again",
            extra={"partitions": len(sent)},
        )
        self._uncommitted = {
            tp: offset for tp, offset in self._uncommitted.items() if offset > sent.get(tp, -1)
        }
        self._committed_at = time.monotonic()
        for tp, offset in committed.items():
            if offset is None:
                continue
            self._handled_below[tp] = max(offset, self._handled_below.get(tp, 0))
            # The batch read again may hold only the first of the records the transaction
            # handled: the rest are not to be fetched again either.
            if await consumer.position(tp) < offset:
                consumer.seek(tp, offset)

    async def _commit_quietly(
        self, consumer: AIOKafkaConsumer, producer: TransactionalProducer, group: str
    ) -> None:
        """Commit the offsets of batches that emitted nothing; a failure leaves them for the
        next transaction (their records are recorded: re-reading them changes nothing)."""
        try:
            await self._commit(consumer, producer, group, [], self._uncommitted)
        except StateMayBeLostError:
            assert self._loop is not None
            await self._loop.rewind()
        except TRANSIENT_ERRORS as exc:
            DEPENDENCIES.failed(exc)
            log.debug(
                "offset commit failed; retried with the next batch", extra={"error": repr(exc)}
            )

    def _forget_uncommitted(self) -> None:
        """The consume loop reads again from the committed offsets: the batches handled since
        are not to be committed (a failover may have taken their writes back), and what this
        process remembers writing is read again."""
        self._uncommitted = {}
        self.turns.forget_all()

    async def _handle_in_order(self, records: list[Record]) -> list[Emission]:
        """One run's records, in order. A plan and the outcomes right behind it (usual under
        load: a plan and its outcomes travel together) are recorded in one state update."""
        emitted: list[Emission] = []
        plan: tuple[TurnPlan, str] | None = None
        outcomes: list[tuple[CallOutcome, str]] = []
        group: list[Record] = []  # the records behind plan and outcomes
        async with self._slots:
            for record in records:
                message = await self._decode(record)
                trigger = f"{record.topic}:{record.partition}:{record.offset}"
                if isinstance(message, CallOutcome):
                    outcomes.append((message, trigger))
                    group.append(record)
                    continue
                if plan is not None or outcomes:
                    emitted += await self._isolated(group, self.on_outcomes(outcomes, plan=plan))
                plan, outcomes, group = None, [], []
                if isinstance(message, TurnPlan):
                    plan = (message, trigger)
                    group.append(record)
                elif isinstance(message, CancelRequest):
                    emitted += await self._isolated([record], self.on_cancel(message, [trigger]))
            if plan is not None or outcomes:
                emitted += await self._isolated(group, self.on_outcomes(outcomes, plan=plan))
        return emitted

    async def _isolated(
        self, records: list[Record], update: Coroutine[Any, Any, list[Emission]]
    ) -> list[Emission]:
        """Run one state update; if it fails for a reason other than Kafka or Redis being
        away, its records are dead-lettered and the batch goes on (``ConsumeLoop.isolated``:
        one bad turn must not stop every other run's results)."""
        assert self._loop is not None, "a batch is handled by the consume loop"
        return await self._loop.isolated(records, update) or []

    async def _decode(self, record: Record) -> TurnPlan | CallOutcome | CancelRequest | None:
        """The record's message; invalid bytes are dead-lettered (None)."""
        topic = record.topic.removeprefix(self.settings.topic_prefix)
        kinds: dict[str, type[TurnPlan | CallOutcome | CancelRequest]] = {
            "plans": TurnPlan, "outcomes": CallOutcome, "cancellations": CancelRequest,
        }  # fmt: skip
        try:
            message = kinds[topic].decode(record.value or b"")
            if isinstance(message, CancelRequest):
                self.auth.verify(message)  # only the run's own tenant may cancel it
        except InvalidMessageError as exc:
            await self.bus.dead_letter(record, exc.reason)
            MESSAGES.labels("aggregator", record.topic, "dead_lettered").inc()
            return None
        labelled(MESSAGES, "aggregator", record.topic, "processed").inc()
        return message

    async def on_plan(
        self,
        plan: TurnPlan,
        triggers: list[str],
        outcomes: Sequence[tuple[CallOutcome, str]] = (),
    ) -> list[Emission]:
        """Start (or, for a resumed turn, replace) the turn's state; ``outcomes`` of the turn
        that came right behind the plan are recorded in the same update."""
        stored = await self._stored_outcomes(plan)
        triggers = [*triggers, *(t for _, t in outcomes)]

        def change(state: StoredTurn) -> Emission | None:
            turn = state.turn
            if turn is None or turn.plan.epoch < plan.epoch:
                carried = list(turn.outcomes.values()) if turn else []
                turn = TurnState(plan=plan)
                for outcome in [*carried, *state.early.values(), *stored]:
                    accept_outcome(turn, outcome)
                state.early = {}
            for outcome, _ in outcomes:
                accept_outcome(turn, outcome)
            return _maybe_emit(state, turn, triggers)

        # A plan usually comes first: write without reading (early outcomes fail the write).
        # The run's turn list (for cancellations) and its cancellation mark go in the same
        # round trip.
        _, cancelled, emitted = await asyncio.gather(
            self.runs.add(plan.tenant_id, plan.run_id, plan.turn_id),
            self.ledger.run_cancelled(plan.tenant_id, plan.run_id),
            self._update(plan.tenant_id, plan.run_id, plan.turn_id, change, new=True),
        )
        if cancelled:
            # The cancellation came first (another topic): none of this turn's calls starts,
            # and the turn ends cancelled as it would have, had it been here; unless its
            # result went out just now (every call decided by the plan): one result a plan.
            tenant, run, turn = plan.tenant_id, plan.run_id, [plan.turn_id]
            emitted += await self._cancel(tenant, run, turn, triggers, emit=not emitted)
        return emitted

    async def on_outcomes(
        self, outcomes: list[tuple[CallOutcome, str]], plan: tuple[TurnPlan, str] | None = None
    ) -> list[Emission]:
        """Record outcomes (with their triggering records), one state update per turn, and
        copies for the turns attached to their calls; with ``plan``, the plan first, in the
        same update as its turn's outcomes."""
        executed = [o for o, _ in outcomes if o.kind == "execute"]
        # Which other turns wait for these calls is looked up while this turn is written.
        lookup = asyncio.ensure_future(self._copies_for_attached(executed)) if executed else None
        if lookup is not None:  # its error, if this update fails first, is not worth a warning
            lookup.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            per_turn: dict[tuple[str, str, int], list[tuple[CallOutcome, str]]] = {}
            for outcome, trigger in outcomes:
                turn_key = (outcome.tenant_id, outcome.run_id, outcome.turn_id)
                per_turn.setdefault(turn_key, []).append((outcome, trigger))
            emitted: list[Emission] = []
            if plan is not None:
                turn, trigger = plan
                own = per_turn.pop((turn.tenant_id, turn.run_id, turn.turn_id), [])
                emitted += await self.on_plan(turn, [trigger], own)
            for (tenant, run, turn_id), batch in per_turn.items():
                emitted += await self._record(tenant, run, turn_id, batch)
            attached: dict[tuple[str, str, int], list[tuple[CallOutcome, str]]] = {}
            for copy, trigger in await lookup if lookup else []:
                turn_key = (copy.tenant_id, copy.run_id, copy.turn_id)
                attached.setdefault(turn_key, []).append((copy, trigger))
            for (tenant, run, turn_id), batch in attached.items():
                emitted += await self._record(tenant, run, turn_id, batch)
        finally:
            if lookup is not None:
                lookup.cancel()
        return emitted

    async def _record(
        self, tenant: str, run: str, turn_id: int, outcomes: list[tuple[CallOutcome, str]]
    ) -> list[Emission]:
        """Record one turn's outcomes; emit its result if it is now settled."""
        triggers = [t for _, t in outcomes]

        def change(state: StoredTurn) -> Emission | None:
            if state.turn is None:
                # The plan is not here yet (another topic, another pace): keep the outcomes.
                for outcome, _ in outcomes:
                    keep_early(state.early, outcome)
                return None
            for outcome, _ in outcomes:
                if not accept_outcome(state.turn, outcome) and for_a_resumed_plan(
                    state.turn, outcome
                ):
                    keep_early(state.early, outcome)
            return _maybe_emit(state, state.turn, triggers)

        return await self._update(tenant, run, turn_id, change)

    async def on_cancel(self, request: CancelRequest, triggers: list[str]) -> list[Emission]:
        """Parent cancellation: every open turn of the run ends now, as cancelled.

        The run's calls still waiting for admission leave the queue here, so they are
        certainly never started: they are reported ``skipped``, effect ``not_executed``
        (calls already sent may be running: ``cancelled``, effect unknown until their
        outcome says otherwise).
        """
        if request.call_id is not None:
            return []  # tool-local: the worker reports it as the call's failure
        tenant, run = request.tenant_id, request.run_id
        # Marked here too (the planner marks it as well): a plan of the run that comes after
        # this (another topic) finds it, whichever of the two read the cancellation first.
        await self.ledger.cancel_run(tenant, run, request.reason)
        return await self._cancel(tenant, run, await self.runs.of_run(tenant, run), triggers)

    async def _cancel(
        self, tenant: str, run: str, turn_ids: list[int], triggers: list[str], *, emit: bool = True
    ) -> list[Emission]:
        """End the turns ``turn_ids`` of a cancelled run, with its calls still waiting for
        admission taken out of the queue (skipped: they never start); ``emit`` False keeps
        their state so and emits nothing."""
        withdrawn = [
            ended(queued_command(payload).command(), None, "skipped")
            for _, payload in await self.admission.withdraw_run(tenant, run)
        ]
        # The ledger says so too: a call that never started does not stay ``dispatched``.
        await asyncio.gather(*(self.ledger.settle(outcome) for outcome in withdrawn))
        results = []
        for turn_id in turn_ids:

            def change(state: StoredTurn, turn_id: int = turn_id) -> Emission | None:
                if state.turn is None:
                    return None
                for outcome in withdrawn:
                    if outcome.turn_id == turn_id:
                        accept_outcome(state.turn, outcome)
                state.turn.cancelled = True
                return _maybe_emit(state, state.turn, triggers) if emit else None

            results += await self._update(tenant, run, turn_id, change)
        return results

    async def _update(
        self,
        tenant_id: str,
        run_id: str,
        turn_id: int,
        change: Callable[[StoredTurn], Emission | None],
        *,
        new: bool = False,
    ) -> list[Emission]:
        key = self.keys.turn(tenant_id, run_id, turn_id)
        result = await self.turns.update(key, change, probably_new=new)
        if result is None:
            return []
        self.turns.forget(key)  # settled: later updates (duplicates) are rare
        return [result]

    async def _stored_outcomes(self, plan: TurnPlan) -> list[CallOutcome]:
        """Outcomes of attached calls that finished before this plan arrived.

        An attached call still running for another turn reports to that turn: this turn
        registers to get a copy (``on_outcome``), then reads again, so an outcome that
        lands in between is not missed.
        """
        attached = [c.call_id for c in plan.calls if c.disposition == "attach"]
        if not attached:
            return []
        entries = await self.ledger.read(plan.tenant_id, plan.run_id, attached)
        running_elsewhere = [
            e.call_id
            for e in entries.values()
            if e.outcome is None and (e.run_id, e.turn_id) != (plan.run_id, plan.turn_id)
        ]
        for call_id in running_elsewhere:
            await self.runs.attach(plan.tenant_id, call_id, (plan.run_id, plan.turn_id))
        if running_elsewhere:
            entries |= await self.ledger.read(plan.tenant_id, plan.run_id, running_elsewhere)
        return [
            e.outcome.model_copy(update={"run_id": plan.run_id, "turn_id": plan.turn_id})
            for e in entries.values()
            if e.outcome is not None
        ]

    async def _copies_for_attached(
        self, executed: list[CallOutcome]
    ) -> list[tuple[CallOutcome, str]]:
        """Executed outcomes again for every other turn attached to their calls (one block of
        the burst, no task per lookup)."""
        attached = await self.runs.attached([(o.tenant_id, o.run_id, o.call_id) for o in executed])
        copies = []
        for outcome, waiting in zip(executed, attached, strict=True):
            for run_id, turn_id in waiting:
                copy = outcome.model_copy(update={"run_id": run_id, "turn_id": turn_id})
                copies.append((copy, f"attached:{run_id}:{turn_id}:{outcome.call_id}"))
        return copies


def _maybe_emit(state: StoredTurn, turn: TurnState, triggers: list[str]) -> Emission | None:
    """Store the turn; emit its result once per plan epoch.

    Emitting again is right only when a record that triggered the first emission comes
    back: its transaction never committed, so nobody has seen that result.
    """
    state.turn = turn
    if not is_settled(turn):
        return None
    emitted = state.emitted
    epoch = turn.plan.epoch
    if emitted is not None and emitted["epoch"] == epoch and not set(emitted["by"]) & set(triggers):
        return None
    state.emitted = {"epoch": epoch, "by": triggers, "at": time.time()}
    return Emission(build_result(turn), turn.plan.planned_at, turn.plan.traceparent)


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _fit(result: TurnResult, limit: int) -> bytes:
    """The result's bytes; one too big for Kafka becomes a failed result that says why (its
    calls' outcomes stay in the ledger), instead of a batch re-read forever."""
    raw = result.encode()
    if len(raw) <= limit:
        return raw
    error = TurnError(
        type="TurnResultTooLarge",
        message=f"the turn result is {len(raw)} bytes, more than the {limit}-byte message "
        "limit (TOOLFLEET_MAX_MESSAGE_BYTES); read its calls with `toolfleet inspect call`, "
        "or lower TOOLFLEET_MAX_OUTPUT_BYTES",
    )
    return result.model_copy(
        update={"status": "failed", "outputs": [], "interruptions": [], "error": error,
                "calls": []}
    ).encode()  # fmt: skip
