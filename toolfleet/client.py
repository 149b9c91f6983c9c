"""The agent runtime's side of toolfleet: submit model responses, await turn results."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Self

from aiokafka import AIOKafkaConsumer
from pydantic import ValidationError

from kernel.adapters.bus import Bus, KafkaBus
from kernel.adapters.topics import TopicsMissingError
from kernel.errors import InvalidMessageError, UnavailableError, UsageError
from kernel.rules.auth import DecisionAuth
from kernel.rules.progress import ProgressCursor
from kernel.rules.versions import newest_version
from kernel.settings import Settings
from schemas import (
    ApprovalDecision,
    CallOutcome,
    CancelRequest,
    ModelResponseEvent,
    ProgressEvent,
    ToolSpec,
    TurnResult,
)

log = logging.getLogger(__name__)


class TurnTimeoutError(UnavailableError, TimeoutError):
    """No TurnResult arrived in time; check that the planner, workers and aggregator run."""


TOOLS_TOPIC_RECHECK_S = 5.0
"""How often a client looks again for a ``tools`` topic that does not exist yet."""

TurnKey = tuple[str | None, str, int]
"""(tenant_id, run_id, turn_id); a tenant of None stands for any tenant (a turn expected
without naming its tenant)."""

OutcomeHandler = Callable[[CallOutcome], None]
"""Called with each outcome of a followed turn's calls (``FleetClient.follow``)."""

PROGRESS_BUFFER = 1_000
"""Progress events one ``RunProgress`` holds for a reader that has not taken them yet; past
that the oldest are dropped (``RunProgress.missed`` counts them): progress is a gauge."""


class FleetClient:
    """Publishes model responses, approvals and cancellations; collects TurnResults.

    Results are read from the end of ``turn-results`` as it was when the client started,
    so start the client before submitting. A turn is its tenant's: two tenants' turns of the
    same run id and turn id are two turns, and each gets its own tenant's result. A client
    keeps only the results of turns it submitted or awaits: every other record is passed
    over by its key (the run id) before it is decoded, so N agent-runtime replicas on one
    topic each hold only their own results, whatever the others' traffic. A result of a
    submitted turn that nobody asks for within ``client_result_window_s`` is dropped, and at
    most ``client_max_results`` are kept.
    """

    def __init__(self, settings: Settings, *, bus: Bus | None = None) -> None:
        self.settings = settings
        self.bus: Bus = bus or KafkaBus(settings, service="client")
        """What the client publishes with and reads through (Kafka unless given one: the
        simulator gives its own)."""
        self.auth = DecisionAuth.of(settings)
        self._wanted: dict[TurnKey, float] = {}
        """Turns whose results this client keeps, with the monotonic time it stops waiting."""
        self._wanted_runs: dict[bytes, int] = {}
        """The run ids of ``_wanted`` (as record keys), with how many turns each."""
        self._tenants: dict[tuple[str, int], list[str | None]] = {}
        """The tenants of ``_wanted`` by (run_id, turn_id)."""
        self._results: dict[TurnKey, TurnResult] = {}
        self._arrived = asyncio.Condition()
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: asyncio.Task[None] | None = None
        self.decoded = 0
        """How many results this client decoded (only those of turns it wanted)."""
        self._followers: dict[tuple[str, int], list[tuple[str | None, OutcomeHandler]]] = {}
        self._followed_runs: dict[bytes, int] = {}
        self._outcomes: AIOKafkaConsumer | None = None
        self._outcome_reader: asyncio.Task[None] | None = None
        self._outcomes_started = asyncio.Lock()
        self._tools: AIOKafkaConsumer | None = None
        self._tool_reader: asyncio.Task[None] | None = None
        self._tools_started = asyncio.Lock()
        self._tools_read = asyncio.Event()
        """Set once the directory holds what ``tools`` held when it was first read."""
        self._announced: dict[bytes, ToolSpec] = {}
        """The directory: each tool version's spec by its record key (``NAME@VERSION``)."""
        self._watchers: dict[bytes, set[RunProgress]] = {}
        """The open ``progress`` iterators, by the run id they watch (a record key)."""
        self._progress: AIOKafkaConsumer | None = None
        self._progress_reader: asyncio.Task[None] | None = None
        self._progress_started = asyncio.Lock()

    def held(self) -> tuple[int, int]:
        """(turns waited for, results kept), each at most ``client_max_results``."""
        self._expire()
        return len(self._wanted), len(self._results)

    async def lag(self) -> int:
        """Records of ``turn-results`` this client has not read yet (passed over or not)."""
        assert self._consumer is not None, "use the client inside ``async with``"
        partitions = list(self._consumer.assignment())
        ends = await self._consumer.end_offsets(partitions)
        behind = 0
        for tp in partitions:
            behind += int(ends[tp]) - int(await self._consumer.position(tp))
        return behind

    async def __aenter__(self) -> Self:
        await self.bus.start()
        consumer = self.bus.reader(isolation_level="read_committed")
        await consumer.start()
        await self._from_the_end(consumer, "turn-results")  # before anything is submitted
        self._consumer = consumer
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for watchers in list(self._watchers.values()):
            for watcher in list(watchers):
                watcher.close()  # its ``async for`` ends
        for reader in (
            self._reader, self._outcome_reader, self._tool_reader, self._progress_reader
        ):  # fmt: skip
            if reader is not None:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
        for consumer in (self._consumer, self._outcomes, self._tools, self._progress):
            if consumer is not None:
                await consumer.stop()
        await self.bus.stop()

    async def submit(self, event: ModelResponseEvent, *, traceparent: str | None = None) -> None:
        """Hand a model response to the planner; its result is kept for this client.

        The turn's trace joins the caller's: ``traceparent`` (W3C) when given, else the
        current OpenTelemetry span's context; without either the planner starts a trace.
        """
        self._want(
            (event.tenant_id, event.run_id, event.turn_id), self.settings.client_result_window_s
        )
        headers = [("traceparent", traceparent.encode())] if traceparent else None
        await (await self.bus.publish("model-responses", event.run_id, event, headers))

    async def decide(self, decision: ApprovalDecision) -> None:
        """Approve or reject a call that waits for approval (signed with the tenant's key)."""
        signed = self.auth.sign(decision)
        await self.bus.publish_and_wait("approvals", decision.run_id, signed)

    async def cancel(self, request: CancelRequest) -> None:
        """Cancel a run (no call_id) or one call (signed with the tenant's key)."""
        await self.bus.publish_and_wait("cancellations", request.run_id, self.auth.sign(request))

    def expect(self, run_id: str, turn_id: int, *, tenant_id: str | None = None) -> None:
        """Keep the result of a turn this client did not submit (another process or a raw
        publish submitted it), for ``client_result_window_s``; call it before the turn can
        finish, since results that arrived before are not kept. Without ``tenant_id`` the
        first result of that run id and turn id is kept, whichever tenant's: name the tenant
        when tenants may share run ids."""
        self._want((tenant_id, run_id, turn_id), self.settings.client_result_window_s)

    async def result(
        self, run_id: str, turn_id: int, *, within: float = 60.0, tenant_id: str | None = None
    ) -> TurnResult:
        """The TurnResult of one turn, waiting up to ``within`` seconds. ``tenant_id``
        defaults to the tenant this client submitted (or expected) the turn for; it must be
        named when the client did so for several tenants."""
        key = (self._tenant_of(run_id, turn_id, tenant_id), run_id, turn_id)
        self._want(key, within)
        try:
            async with asyncio.timeout(within), self._arrived:
                await self._arrived.wait_for(lambda: key in self._results)
        except TimeoutError:
            raise TurnTimeoutError(
                f"no TurnResult for run {run_id} turn {turn_id} within {within:g} s; "
                "are the planner, a worker of the tool's pool and the aggregator running?"
            ) from None
        result = self._results.pop(key)
        self._unwant(key)
        # It also answers a wait for the turn that named no tenant (``expect``).
        self._unwant((None, run_id, turn_id))
        self._results.pop((None, run_id, turn_id), None)
        return result

    async def run_turn(
        self, event: ModelResponseEvent, *, within: float = 60.0, traceparent: str | None = None
    ) -> TurnResult:
        """Submit a model response and wait for its TurnResult (``traceparent``: see
        ``submit``)."""
        await self.submit(event, traceparent=traceparent)
        return await self.result(
            event.run_id, event.turn_id, within=within, tenant_id=event.tenant_id
        )

    async def follow(
        self, run_id: str, turn_id: int, handler: OutcomeHandler, *, tenant_id: str | None = None
    ) -> Callable[[], None]:
        """Call ``handler`` with every outcome the fleet reports for a call of one turn, as it
        is reported, until the function this returns is called.

        For an agent runtime that hands each call its answer when that call settles
        (FleetRunner); the turn's TurnResult stays its answer, in model order. The outcomes
        are read from ``outcomes`` (passed over by their key, the run id, like results), from
        the topic's end when this client first follows a turn: follow before submitting.
        ``tenant_id`` passes over other tenants' turns of the same run id and turn id.
        """
        await self._read_outcomes()
        key, run, follower = (run_id, turn_id), run_id.encode(), (tenant_id, handler)
        self._followers.setdefault(key, []).append(follower)
        self._followed_runs[run] = self._followed_runs.get(run, 0) + 1

        def stop() -> None:
            handlers = self._followers.get(key, [])
            if follower not in handlers:
                return
            handlers.remove(follower)
            if not handlers:
                del self._followers[key]
            left = self._followed_runs[run] - 1
            if left:
                self._followed_runs[run] = left
            else:
                del self._followed_runs[run]

        return stop

    async def _read_outcomes(self) -> None:
        """Start reading ``outcomes`` (once), from its end as it is now."""
        async with self._outcomes_started:
            if self._outcomes is not None:
                return
            consumer = self.bus.reader(isolation_level="read_committed")
            await consumer.start()
            await self._from_the_end(consumer, "outcomes")  # nothing submitted after is missed
            self._outcomes = consumer
            self._outcome_reader = asyncio.create_task(self._read_followed(consumer))

    async def _from_the_end(self, consumer: AIOKafkaConsumer, topic: str) -> None:
        """Assign ``consumer`` every partition of logical ``topic``, positioned at its end
        now (the positions resolved before this returns, not at the first fetch)."""
        assigned = await self.bus.partitions(topic)  # waits for the broker's metadata
        consumer.assign(assigned)
        await consumer.seek_to_end(*assigned)
        for tp in assigned:
            await consumer.position(tp)

    async def _read_followed(self, consumer: AIOKafkaConsumer) -> None:
        async for record in consumer:
            if record.key not in self._followed_runs:
                continue  # another run's: passed over by its key, never decoded
            try:
                outcome = CallOutcome.decode(record.value or b"")
            except InvalidMessageError:
                continue
            for tenant, handler in list(self._followers.get((outcome.run_id, outcome.turn_id), ())):
                if tenant is not None and tenant != outcome.tenant_id:
                    continue  # another tenant's turn of the same ids
                try:
                    handler(outcome)
                except Exception:  # one follower's bug must not stop the others' outcomes
                    log.exception("outcome handler failed", extra={"run_id": outcome.run_id})

    def progress(
        self,
        run_id: str,
        *,
        tenant_id: str | None = None,
        cursor: ProgressCursor | None = None,
    ) -> RunProgress:
        """The progress events of one run's calls (``ctx.report_progress`` in their tools), as
        an async iterator, each event at most once.

        The events are read from ``progress`` (passed over by their key, the run id, like
        outcomes), from the topic's end when the iterator opens: open it before submitting to
        see a call's first events::

            async with client.progress(run_id) as events:
                await client.submit(event)
                async for update in events:
                    ...  # update.attempt, update.sequence, update.done, update.total

        The iterator ends when it is closed (leaving ``async with``, ``close()``) or the client
        is; it never ends by itself, since a run can have more turns. An event is yielded only
        if its ``(attempt, sequence)`` comes after the last one yielded for its call
        (``kernel.rules.progress.ProgressCursor``): a duplicate on the topic is never yielded
        twice, and a retried attempt's events, which count from 1 again, are yielded with their
        higher ``attempt``. ``tenant_id`` passes over other tenants' runs of the same id;
        ``cursor`` goes on from positions an earlier reader showed. Opening it raises
        TopicsMissingError while the fleet has no ``progress`` topic (``toolfleet topics
        apply`` creates it).
        """
        return RunProgress(self, run_id, tenant_id=tenant_id, cursor=cursor)

    async def _watch(self, watcher: RunProgress) -> None:
        await self._read_progress()
        self._watchers.setdefault(watcher.run_id.encode(), set()).add(watcher)

    def _unwatch(self, watcher: RunProgress) -> None:
        run = watcher.run_id.encode()
        watchers = self._watchers.get(run)
        if watchers is None:
            return
        watchers.discard(watcher)
        if not watchers:
            del self._watchers[run]

    async def _read_progress(self) -> None:
        """Start reading ``progress`` (once), from its end as it is now."""
        async with self._progress_started:
            if self._progress is not None:
                return
            topic = self.settings.topic("progress")
            consumer = self.bus.reader()
            await consumer.start()
            # Looked for, not named: naming a missing topic can have the broker create it
            # with its defaults (a week's retention, its partition count), not the plan's.
            if topic not in await consumer.topics():
                await consumer.stop()
                raise TopicsMissingError([topic], ("default",))
            await self._from_the_end(consumer, "progress")  # nothing reported after is missed
            self._progress = consumer
            self._progress_reader = asyncio.create_task(self._read_watched(consumer))

    async def _read_watched(self, consumer: AIOKafkaConsumer) -> None:
        async for record in consumer:
            watchers = self._watchers.get(record.key or b"")
            if not watchers:
                continue  # another run's: passed over by its key, never decoded
            try:
                event = ProgressEvent.decode(record.value or b"")
            except InvalidMessageError:
                continue
            for watcher in list(watchers):
                watcher._arrived(event)

    async def tool_specs(self, *, within: float = 10.0) -> dict[str, ToolSpec]:
        """The tools the fleet's workers serve: lookup key -> the spec of its newest version
        (its pool, effect class, release gate), as the workers announce them on ``tools``.

        The first call starts reading that compacted topic from its beginning and waits, up
        to ``within`` seconds, until it has read what the topic held then; later calls return
        at once the directory a background reader keeps current. A tool not read yet is
        simply absent: if the fleet gates it, the planner holds its calls for a person (a
        ``FleetRunner`` run fails with FleetApprovalRequired), it never runs unapproved.
        """
        await self._read_tools()
        if not self._tools_read.is_set():
            try:
                async with asyncio.timeout(within):
                    await self._tools_read.wait()
            except TimeoutError:
                log.warning(
                    "the tool directory was not read to its end in time; tools not read yet "
                    "count as unknown (their gated calls wait for a person)",
                    extra={"within_s": within},
                )
        versions: dict[str, dict[str, ToolSpec]] = {}
        for spec in self._announced.values():
            versions.setdefault(spec.lookup_key, {})[spec.version] = spec
        return {key: live[newest_version(live)] for key, live in versions.items()}

    async def _read_tools(self) -> None:
        """Start reading ``tools`` (once), from its beginning."""
        async with self._tools_started:
            if self._tools is not None:
                return
            consumer = self.bus.reader()
            await consumer.start()
            self._tools = consumer
            self._tool_reader = asyncio.create_task(self._read_announced(consumer))

    async def _read_announced(self, consumer: AIOKafkaConsumer) -> None:
        """Keep the directory current: ``tools`` from its beginning, then as it grows."""
        topic = self.settings.topic("tools")
        # The topic is looked for among all topics, not named: naming one that does not exist
        # yet can have the broker create it, uncompacted (the services create it at start).
        while topic not in await consumer.topics():
            self._tools_read.set()  # nothing to read yet: every tool is unknown
            await asyncio.sleep(TOOLS_TOPIC_RECHECK_S)  # wait-ok: polling for the topic
        assigned = await self.bus.partitions("tools")
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        ends = await consumer.end_offsets(assigned)
        behind = {tp: end for tp, end in ends.items() if end}  # to read before tool_specs returns
        while True:
            if not behind:
                self._tools_read.set()
            batches = await consumer.getmany(timeout_ms=500, max_records=500)
            for records in batches.values():
                for record in records:
                    self._take_announced(record.key or b"", record.value)
            for tp in [tp for tp, end in behind.items() if await consumer.position(tp) >= end]:
                del behind[tp]

    def _take_announced(self, key: bytes, value: bytes | None) -> None:
        if value is None:  # a tombstone: that version is no longer served
            self._announced.pop(key, None)
            return
        try:
            self._announced[key] = ToolSpec.model_validate_json(value)
        except ValidationError as exc:
            # A spec this client cannot read (a newer release's, say): the tool stays unknown
            # to it, which is safe (see tool_specs).
            log.warning(
                "a tool announcement this client cannot read; the tool counts as unknown",
                extra={"key": key[:200].decode(errors="replace"), "error": str(exc)[:300]},
            )

    def _tenant_of(self, run_id: str, turn_id: int, tenant_id: str | None) -> str | None:
        """``tenant_id``, else the one tenant this client wants that turn for (None: any)."""
        if tenant_id is not None:
            return tenant_id
        tenants = {t for t in self._tenants.get((run_id, turn_id), ()) if t is not None}
        if len(tenants) > 1:
            raise UsageError(
                f"this client submitted or expects turn {turn_id} of run {run_id} for "
                f"{len(tenants)} tenants: name the one whose result you want (tenant_id=...)"
            )
        return next(iter(tenants), None)

    def _want(self, key: TurnKey, for_s: float) -> None:
        until = time.monotonic() + for_s
        if key not in self._wanted:
            tenant, run_id, turn_id = key
            run = run_id.encode()
            self._wanted_runs[run] = self._wanted_runs.get(run, 0) + 1
            self._tenants.setdefault((run_id, turn_id), []).append(tenant)
            self._wanted[key] = until
            self._expire()
        else:
            self._wanted[key] = max(self._wanted[key], until)

    def _unwant(self, key: TurnKey) -> None:
        if self._wanted.pop(key, None) is None:
            return
        tenant, run_id, turn_id = key
        run = run_id.encode()
        left = self._wanted_runs[run] - 1
        if left:
            self._wanted_runs[run] = left
        else:
            del self._wanted_runs[run]
        tenants = self._tenants[(run_id, turn_id)]
        tenants.remove(tenant)
        if not tenants:
            del self._tenants[(run_id, turn_id)]

    def _expire(self) -> None:
        """Forget the oldest turns nobody waits for any more, and keep at most
        ``client_max_results`` (their results go with them). From the oldest on, so a
        submission costs O(1) amortised."""
        now = time.monotonic()
        while self._wanted:
            key, until = next(iter(self._wanted.items()))
            if until >= now and len(self._wanted) <= self.settings.client_max_results:
                return
            self._unwant(key)
            self._results.pop(key, None)

    async def _read(self) -> None:
        assert self._consumer is not None
        async for record in self._consumer:
            self._expire()
            # Another client's turn: passed over by its key, never decoded.
            if record.key not in self._wanted_runs:
                continue
            try:
                result = TurnResult.decode(record.value or b"")
            except InvalidMessageError:
                continue
            # Wanted for its own tenant, or for any tenant (expected without one).
            keys = [
                key
                for key in (
                    (result.tenant_id, result.run_id, result.turn_id),
                    (None, result.run_id, result.turn_id),
                )
                if key in self._wanted
            ]
            if not keys:
                continue
            self.decoded += 1
            async with self._arrived:
                for key in keys:
                    self._results[key] = result
                self._arrived.notify_all()


class RunProgress:
    """One run's progress events, each at most once: ``FleetClient.progress`` makes it.

    An async iterator and an async context manager (entering it starts reading, so that
    nothing reported after that is missed). Holds at most ``PROGRESS_BUFFER`` events its
    reader has not taken; ``missed`` counts the ones dropped for that.
    """

    def __init__(
        self,
        client: FleetClient,
        run_id: str,
        *,
        tenant_id: str | None = None,
        cursor: ProgressCursor | None = None,
        buffer: int = PROGRESS_BUFFER,
    ) -> None:
        self.run_id = run_id
        self.tenant_id = tenant_id
        self.cursor = cursor if cursor is not None else ProgressCursor()
        """The last position yielded for each call (save ``cursor.positions()`` to resume)."""
        self.missed = 0
        self._client = client
        self._events: deque[ProgressEvent] = deque()
        self._buffer = buffer
        self._ready = asyncio.Event()
        self._opened = False
        self._closed = False

    async def open(self) -> None:
        """Start reading the run's progress (``async with`` and the first ``__anext__`` do)."""
        if self._opened or self._closed:
            return
        await self._client._watch(self)
        self._opened = True

    def close(self) -> None:
        """Stop reading; an ``async for`` over it ends."""
        self._closed = True
        self._client._unwatch(self)
        self._ready.set()

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> ProgressEvent:
        await self.open()
        while not self._events:
            if self._closed:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()
        return self._events.popleft()

    def _arrived(self, event: ProgressEvent) -> None:
        """An event of the run read from the topic: kept if the cursor has not shown it."""
        if event.run_id != self.run_id or self._closed:
            return
        if self.tenant_id is not None and event.tenant_id != self.tenant_id:
            return
        if not self.cursor.accept(event):
            return  # a duplicate, or older than what was shown: never shown twice
        if len(self._events) >= self._buffer:
            self._events.popleft()
            self.missed += 1
        self._events.append(event)
        self._ready.set()
