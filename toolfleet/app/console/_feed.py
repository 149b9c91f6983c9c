"""The console's live feed: its own Kafka consumer of ``turn-results``, ``outcomes`` and
``progress``, a bounded ring of recent events, and a bounded queue per subscriber (an SSE
connection).

The consumer joins a group of its own (unique per console instance) at the latest offsets, so
a console sees what happens from its start on and never moves another group's offsets. It
commits nothing. Records are summarised as they arrive (ids, statuses, effects, errors: never
arguments or outputs) and fanned out to every subscriber whose filter matches. A subscriber
that does not keep up loses events rather than growing memory: its queue holds at most
``queue_size`` events, and the next thing it reads says how many it missed. Progress events
come with the outcomes (a subscriber that wants no outcomes gets none), each shown once: the
feed passes a call's progress event on only if it comes after the last one it passed on
(``kernel.rules.progress.ProgressCursor``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from kernel.adapters.backoff import RECONNECT
from kernel.adapters.bus import TRANSIENT_ERRORS, KafkaBus
from kernel.errors import InvalidMessageError
from kernel.rules.limits import cut_text
from kernel.rules.progress import ProgressCursor
from kernel.settings import Settings
from schemas import CallOutcome, ProgressEvent, TurnResult

log = logging.getLogger(__name__)

FeedState = Literal["connecting", "live", "down"]
Kind = Literal["turn", "outcome", "progress"]

TOPICS = ("turn-results", "outcomes", "progress")
"""The logical topics the feed reads."""

PROGRESS_CALLS = 10_000
"""Calls whose last progress position the feed remembers (the least recent go first)."""

_LIST_MAX = 50
"""Calls and interruptions listed per turn summary (the count says how many there were)."""
_ERROR_MAX_BYTES = 500


@dataclass(frozen=True)
class Filter:
    """Which events a subscriber wants: each given field must match exactly (a turn matches
    a tool when one of its calls or interruptions is of that tool)."""

    tenant: str | None = None
    run: str | None = None
    tool: str | None = None
    tenants: frozenset[str] | None = None
    """The tenants whose events may pass at all (the viewer's scope; None: every tenant)."""

    def matches(self, event: FeedEvent) -> bool:
        """Whether ``event`` passes this filter."""
        return (
            (self.tenant is None or event.tenant_id == self.tenant)
            and (self.tenants is None or event.tenant_id in self.tenants)
            and (self.run is None or event.run_id == self.run)
            and (self.tool is None or self.tool in event.tools)
        )


@dataclass(frozen=True)
class FeedEvent:
    """One record of the feed, summarised for the browser."""

    seq: int
    """Increasing per console: the SSE event id (a reconnecting browser resumes after it)."""
    kind: Kind
    tenant_id: str
    run_id: str
    tools: frozenset[str]
    data: dict[str, Any]
    """The JSON the browser gets."""


@dataclass(frozen=True)
class Dropped:
    """What a subscriber reads after its queue overflowed: how many events it missed."""

    count: int


@dataclass(frozen=True)
class StatusChange:
    """The feed's state changed (connecting, live, down), with the reason when down."""

    state: FeedState
    error: str | None = None


Item = FeedEvent | Dropped | StatusChange


@dataclass(eq=False)
class Subscription:
    """One subscriber's bounded queue: at most ``maxsize`` items wait; past that, events are
    counted and dropped, and one ``Dropped`` notice is queued in their place."""

    filter: Filter
    maxsize: int
    outcomes: bool = True
    """Whether this subscriber wants outcomes (and progress) as well as turns."""
    dropped: int = 0
    _items: deque[Item | None] = field(default_factory=deque)
    _ready: asyncio.Event = field(default_factory=asyncio.Event)
    _notice_queued: bool = False

    def wants(self, event: FeedEvent) -> bool:
        """Whether ``event`` is for this subscriber."""
        return (self.outcomes or event.kind == "turn") and self.filter.matches(event)

    def offer(self, item: Item | None) -> None:
        """Queue ``item`` unless the queue is full (None closes the subscription)."""
        if item is not None and len(self._items) >= self.maxsize:
            self.dropped += 1
            if not self._notice_queued:  # one notice in the place of the lost events
                self._items.append(Dropped(0))
                self._notice_queued = True
        else:
            self._items.append(item)
        self._ready.set()

    async def next(self) -> Item | None:
        """The next item, waiting for one; None when the feed closed."""
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        if isinstance(item, Dropped):
            item, self.dropped, self._notice_queued = Dropped(self.dropped), 0, False
        return item

    def __len__(self) -> int:
        return len(self._items)


def summarise_turn(result: TurnResult, seq: int, received_at: float) -> FeedEvent:
    """A TurnResult as the console shows it: no outputs, no arguments."""
    calls = [
        {
            "call_id": c.call_id,
            "tool_name": c.tool_name,
            "status": c.status,
            "effect": c.effect,
            "attempts": c.attempts,
        }
        for c in result.calls[:_LIST_MAX]
    ]
    interruptions = [
        {"call_id": i.call_id, "tool_name": i.tool_name, "reason": i.reason}
        for i in result.interruptions[:_LIST_MAX]
    ]
    error = None
    if result.error is not None:
        error = {
            "type": result.error.type,
            "message": cut_text(result.error.message, _ERROR_MAX_BYTES),
            "call_id": result.error.call_id,
        }
    tools = {c.tool_name for c in result.calls} | {i.tool_name for i in result.interruptions}
    data = {
        "kind": "turn",
        "seq": seq,
        "received_at": received_at,
        "tenant_id": result.tenant_id,
        "run_id": result.run_id,
        "turn_id": result.turn_id,
        "status": result.status,
        "calls": calls,
        "calls_total": len(result.calls),
        "interruptions": interruptions,
        "interruptions_total": len(result.interruptions),
        "error": error,
    }
    return FeedEvent(seq, "turn", result.tenant_id, result.run_id, frozenset(tools), data)


def summarise_progress(event: ProgressEvent, seq: int, received_at: float) -> FeedEvent:
    """A call's progress as the console shows it: how far, and the tool's message (cut)."""
    data = {
        "kind": "progress",
        "seq": seq,
        "received_at": received_at,
        "tenant_id": event.tenant_id,
        "run_id": event.run_id,
        "turn_id": event.turn_id,
        "call_id": event.call_id,
        "tool_name": event.tool_name,
        "attempt": event.attempt,
        "sequence": event.sequence,
        "done": event.done,
        "total": event.total,
        "message": None if event.message is None else cut_text(event.message, _ERROR_MAX_BYTES),
        "at": event.at,
    }
    tools = frozenset({event.tool_name})
    return FeedEvent(seq, "progress", event.tenant_id, event.run_id, tools, data)


def summarise_outcome(outcome: CallOutcome, seq: int, received_at: float) -> FeedEvent:
    """A CallOutcome as the console shows it: no output, no arguments."""
    error = None
    if outcome.error is not None:
        error = {
            "type": outcome.error.type,
            "message": cut_text(outcome.error.message, _ERROR_MAX_BYTES),
        }
    data = {
        "kind": "outcome",
        "seq": seq,
        "received_at": received_at,
        "tenant_id": outcome.tenant_id,
        "run_id": outcome.run_id,
        "turn_id": outcome.turn_id,
        "call_id": outcome.call_id,
        "tool_name": outcome.tool_name,
        "status": outcome.status,
        "effect": outcome.effect,
        "attempt": outcome.attempt,
        "source": outcome.source,
        "action": outcome.kind,
        "resolved": outcome.resolved,
        "error": error,
    }
    tools = frozenset({outcome.tool_name})
    return FeedEvent(seq, "outcome", outcome.tenant_id, outcome.run_id, tools, data)


class LiveFeed:
    """Reads ``turn-results`` and ``outcomes`` and fans them out to subscribers.

    ``tenant`` restricts the feed to one tenant: other tenants' records are dropped as they
    are read, before they reach the ring or any subscriber.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        tenant: str | None = None,
        ring_size: int = 500,
        queue_size: int = 1_000,
        max_subscribers: int = 100,
    ) -> None:
        self.settings = settings
        self.tenant = tenant
        self.queue_size = queue_size
        self.max_subscribers = max_subscribers
        self.group = f"console.{socket.gethostname()}.{uuid.uuid4().hex[:8]}"
        """The consumer group: this instance's own, so it sees every record."""
        self.state: FeedState = "connecting"
        self.error: str | None = None
        self.invalid = 0
        """Records that did not decode (every consumer of the topics dead-letters them)."""
        self._seq = itertools.count(1)
        self._turns: deque[FeedEvent] = deque(maxlen=ring_size)
        self._outcomes: deque[FeedEvent] = deque(maxlen=ring_size)
        self._progress: deque[FeedEvent] = deque(maxlen=ring_size)
        self._progress_shown = ProgressCursor(max_calls=PROGRESS_CALLS)
        self._subscribers: set[Subscription] = set()
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    # --- fan-out ------------------------------------------------------------------------------
    def take(self, topic: str, raw: bytes | None, received_at: float | None = None) -> None:
        """Summarise one record of a logical ``topic`` and hand it to the subscribers."""
        at = time.time() if received_at is None else received_at
        try:
            if topic == "turn-results":
                result = TurnResult.decode(raw or b"")
                if self.tenant is not None and result.tenant_id != self.tenant:
                    return
                event = summarise_turn(result, next(self._seq), at)
                self._turns.append(event)
            elif topic == "progress":
                progress = ProgressEvent.decode(raw or b"")
                if self.tenant is not None and progress.tenant_id != self.tenant:
                    return
                if not self._progress_shown.accept(progress):
                    return  # a duplicate, or older than what was passed on: never twice
                event = summarise_progress(progress, next(self._seq), at)
                self._progress.append(event)
            else:
                outcome = CallOutcome.decode(raw or b"")
                if self.tenant is not None and outcome.tenant_id != self.tenant:
                    return
                event = summarise_outcome(outcome, next(self._seq), at)
                self._outcomes.append(event)
        except InvalidMessageError:
            self.invalid += 1
            return
        for subscriber in self._subscribers:
            if subscriber.wants(event):
                subscriber.offer(event)

    def recent(
        self, flt: Filter, *, outcomes: bool = True, after: int = 0, limit: int = 200
    ) -> list[FeedEvent]:
        """The newest ``limit`` events of the ring that pass ``flt``, oldest first."""
        rings: Iterable[FeedEvent] = (
            [*self._turns, *self._outcomes, *self._progress] if outcomes else list(self._turns)
        )
        found = sorted((e for e in rings if e.seq > after and flt.matches(e)), key=lambda e: e.seq)
        return found[-limit:] if limit > 0 else []

    def subscribe(
        self, flt: Filter, *, outcomes: bool = True, after: int = 0, backlog: int = 200
    ) -> tuple[Subscription, list[FeedEvent]] | None:
        """A new subscription and the recent events it should show first (after ``after``);
        None when the console already serves ``max_subscribers``. Taken at one instant, so
        nothing is missed or repeated between the backlog and the live events."""
        if len(self._subscribers) >= self.max_subscribers:
            return None
        subscription = Subscription(flt, self.queue_size, outcomes)
        self._subscribers.add(subscription)
        return subscription, self.recent(flt, outcomes=outcomes, after=after, limit=backlog)

    def unsubscribe(self, subscription: Subscription) -> None:
        """Forget a subscriber (its connection closed)."""
        self._subscribers.discard(subscription)

    @property
    def subscribers(self) -> int:
        """How many subscribers are connected."""
        return len(self._subscribers)

    def _set_state(self, state: FeedState, error: str | None = None) -> None:
        if (state, error) == (self.state, self.error):
            return
        self.state, self.error = state, error
        for subscriber in self._subscribers:
            subscriber.offer(StatusChange(state, error))

    # --- the consumer -------------------------------------------------------------------------
    async def start(self) -> None:
        """Start consuming in the background."""
        self._task = asyncio.create_task(self._run(), name="console-feed")

    async def stop(self) -> None:
        """Stop consuming and close every subscription."""
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for subscriber in self._subscribers:
            subscriber.offer(None)

    async def _run(self) -> None:
        failures = 0
        names = {self.settings.topic(t): t for t in TOPICS}
        bus = KafkaBus(self.settings, service="console")
        while not self._stopping.is_set():
            consumer = bus.consumer(TOPICS, group=self.group, auto_offset_reset="latest")
            try:
                await consumer.start()
                while not self._stopping.is_set():
                    batches = await consumer.getmany(timeout_ms=200, max_records=500)
                    at = time.time()
                    for records in batches.values():
                        for record in records:
                            self.take(names.get(record.topic, record.topic), record.value, at)
                    if self.state != "live" and consumer.assignment():
                        for tp in consumer.assignment():  # the latest offsets, resolved now
                            await consumer.position(tp)
                        self._set_state("live")
                        failures = 0
            except TRANSIENT_ERRORS as exc:
                self._set_state("down", f"Kafka unavailable: {exc!r}"[:300])
                log.warning("console feed: Kafka unavailable", extra={"error": repr(exc)})
            except Exception as exc:  # a bug: the page says so, and the feed starts again
                self._set_state("down", f"feed failed: {exc!r}"[:300])
                log.exception("console feed failed")
            finally:
                with contextlib.suppress(*TRANSIENT_ERRORS):
                    await consumer.stop()
            if not self._stopping.is_set():
                failures += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), RECONNECT.delay(failures))
                self._set_state("connecting", self.error)
