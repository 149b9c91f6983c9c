"""Turns, the systems they are sent to, and the two ways of loading them.

- ``closed_loop``: keeps a window of turns outstanding (a new one as each result comes back)
  and counts results inside a measurement window: the maximum sustainable throughput.
- ``open_loop``: sends turns at a fixed rate, whatever comes back, and records each turn's
  end-to-end latency (sent -> result received): latency at a given load.

A system is a ``Target``: ``send`` hands one turn in, and the target calls ``listener`` with
the run_id (and whether the turn completed with every output ``ok``) when its result arrives.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from schemas import ModelResponseEvent

Listener = Callable[[str, bool], None]


@dataclass(frozen=True)
class Call:
    """One function call of a turn."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Turn:
    """One model response: its calls and its encoded ModelResponseEvent."""

    run_id: str
    calls: tuple[Call, ...]
    payload: bytes


class Window(Protocol):
    """Something measured over exactly the measurement window (a CPU meter)."""

    def start(self) -> None: ...

    def stop(self) -> object: ...


class Target(Protocol):
    """A system under test."""

    label: str
    listener: Listener | None

    async def send(self, turn: Turn) -> None:
        """Hand one turn in; returns once it is queued (not when its result is back)."""


class TurnFactory:
    """Makes unique turns of ``calls`` calls of ``tool`` for one tenant.

    Events are built as plain JSON (cheap enough not to slow the load generator); the first
    one is checked against ModelResponseEvent so the shape cannot drift from the schema.
    """

    def __init__(
        self, tenant_id: str, tool: str, calls: int, args: Callable[[int], dict[str, object]]
    ) -> None:
        self.tenant_id = tenant_id
        self.tool = tool
        self.calls = calls
        self.args = args
        self._serial = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]
        first = self.make()
        event = ModelResponseEvent.decode(first.payload)
        assert len(event.function_calls) == calls

    def make(self) -> Turn:
        """A new turn with fresh run and call ids."""
        run_id = f"r-{self._prefix}-{next(self._serial)}"
        calls = tuple(
            Call(f"c-{run_id}-{i}", self.tool, json.dumps(self.args(i))) for i in range(self.calls)
        )
        event = {
            "schema_version": 1,
            "tenant_id": self.tenant_id,
            "run_id": run_id,
            "turn_id": 0,
            "agent": {"name": "bench"},
            "response_id": f"resp-{run_id}",
            "items": [
                {"type": "function_call", "call_id": c.call_id, "name": c.name,
                 "arguments": c.arguments}
                for c in calls
            ],
        }  # fmt: skip
        return Turn(run_id, calls, json.dumps(event, separators=(",", ":")).encode())


def query_args(i: int) -> dict[str, object]:
    """Arguments of a bench call: a short query string and its index (about 60 bytes)."""
    return {"query": f"benchmark call number {i:03d}: look this up, please", "i": i}


@dataclass
class LoadResult:
    """What one load run measured."""

    turns: int = 0
    calls: int = 0
    seconds: float = 0.0
    failed: int = 0
    latencies_s: list[float] = field(default_factory=list)
    phases_ms: dict[str, float] = field(default_factory=dict)
    """Median split of the turn latency (targets that report when calls ran)."""

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.seconds if self.seconds else 0.0

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0

    def percentile_ms(self, q: float) -> float:
        """Latency percentile (nearest rank), in milliseconds."""
        if not self.latencies_s:
            return math.nan
        ordered = sorted(self.latencies_s)
        rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
        return ordered[rank] * 1000


class _Tracker:
    """Matches results to sent turns; the only listener of a target during a run."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.sent: dict[str, tuple[float, int]] = {}
        self.sent_wall: dict[str, float] = {}
        self.done: list[tuple[float, float, int, bool]] = []  # (at, latency, calls, ok)
        self.drained = asyncio.Event()
        self.on_done: Callable[[], None] | None = None
        target.listener = self._result

    def _result(self, run_id: str, ok: bool) -> None:
        entry = self.sent.pop(run_id, None)
        if entry is None:
            return  # a turn of an earlier run that was given up on
        now = time.perf_counter()
        self.done.append((now, now - entry[0], entry[1], ok))
        if self.on_done is not None:
            self.on_done()
        if not self.sent:
            self.drained.set()

    async def send(self, turn: Turn) -> None:
        self.drained.clear()
        self.sent_wall[turn.run_id] = time.time()
        self.sent[turn.run_id] = (time.perf_counter(), len(turn.calls))
        try:
            await self.target.send(turn)
        except asyncio.CancelledError:
            # The load stopped while the producer had no room for it: never sent, so not
            # outstanding (counted as lost, it failed 1 run in ~10 at 1,600 outstanding).
            self.sent.pop(turn.run_id, None)
            self.sent_wall.pop(turn.run_id, None)
            if not self.sent:
                self.drained.set()
            raise

    async def drain(
        self, within: float, check: Callable[[], None] | None, stall_s: float = 20.0
    ) -> None:
        """Wait for every sent turn's result; give up after ``within`` s, or ``stall_s`` s
        without any result (a stuck system should not eat the time budget)."""
        began = time.monotonic()
        deadline = began + within
        seen, last_result = len(self.done), began
        while self.sent:
            if check is not None:
                check()
            now = time.monotonic()
            if len(self.done) != seen:
                seen, last_result = len(self.done), now
            if now > deadline or now - last_result > stall_s:
                why = "no result" if now - last_result > stall_s else "not all results"
                missing = ", ".join(list(self.sent)[:5])
                raise TimeoutError(
                    f"{self.target.label}: {len(self.sent)} turns still without a result "
                    f"({missing}); {why} for {now - last_result:.0f} s after the load stopped"
                )
            try:
                await asyncio.wait_for(self.drained.wait(), 0.5)
            except TimeoutError:
                continue

    def window(self, t0: float, t1: float, keep_latency: bool) -> LoadResult:
        result = LoadResult(seconds=t1 - t0)
        for at, _latency, calls, ok in self.done:
            if t0 <= at < t1:
                result.turns += 1
                result.calls += calls
                result.failed += 0 if ok else 1
        if keep_latency:
            result.latencies_s = [latency for at, latency, _c, _ok in self.done if t0 <= at]
        return result


async def prime(
    target: Target,
    factory: TurnFactory,
    *,
    within: float = 120.0,
    check: Callable[[], None] | None = None,
) -> float:
    """Send one turn and wait for its result: every service has joined and is warm.

    Returns how long the first result took (services joining their consumer groups).
    """
    tracker = _Tracker(target)
    began = time.perf_counter()
    await tracker.send(factory.make())
    await tracker.drain(within, check, stall_s=within)
    if not tracker.done[0][3]:
        raise RuntimeError(f"{target.label}: the first turn did not complete with 'ok' outputs")
    return time.perf_counter() - began


async def closed_loop(
    target: Target,
    factory: TurnFactory,
    *,
    window: int,
    warmup_s: float,
    measure_s: float,
    drain_s: float = 60.0,
    check: Callable[[], None] | None = None,
    meter: Window | None = None,
    keep_latency: bool = False,
) -> LoadResult:
    """Keep ``window`` turns outstanding; throughput counted over ``measure_s`` after warm-up
    (with ``keep_latency``, each turn's latency too: ``window=1`` is the idle latency).

    ``meter`` is started when the measurement window opens and stopped when it closes.
    """
    tracker = _Tracker(target)
    spans = _record_spans(target) if keep_latency else None
    tokens: asyncio.Queue[None] = asyncio.Queue()
    tracker.on_done = lambda: tokens.put_nowait(None)
    for _ in range(window):
        tokens.put_nowait(None)

    async def sender() -> None:
        while True:
            await tokens.get()
            await tracker.send(factory.make())

    began = time.perf_counter()
    t0, t1 = began + warmup_s, began + warmup_s + measure_s
    task = asyncio.create_task(sender())
    opened = False
    try:
        while True:  # the warm-up and measurement windows themselves, watching health
            now = time.perf_counter()
            if not opened and now >= t0:
                opened = True
                if meter is not None:
                    meter.start()
            if now >= t1:
                break
            if check is not None:
                check()
            if task.done():
                task.result()
            await asyncio.sleep(min(0.5, max(0.0, (t1 if opened else t0) - now)))
        if meter is not None:
            meter.stop()
    finally:
        task.cancel()
        tracker.on_done = None
    await tracker.drain(drain_s, check)
    result = tracker.window(t0, t1, keep_latency=keep_latency)
    result.phases_ms = _phases(target, spans, tracker.sent_wall)
    return result


async def open_loop(
    target: Target,
    factory: TurnFactory,
    *,
    rate: float,
    warmup_s: float,
    measure_s: float,
    drain_s: float = 60.0,
    check: Callable[[], None] | None = None,
) -> LoadResult:
    """Send ``rate`` turns/s on a fixed schedule; latency of the turns sent after warm-up."""
    tracker = _Tracker(target)
    spans = _record_spans(target)
    interval = 1.0 / rate
    began = time.perf_counter()
    t0, t1 = began + warmup_s, began + warmup_s + measure_s
    next_at = began
    last_check = began
    while next_at < t1:
        now = time.perf_counter()
        if now < next_at:
            await asyncio.sleep(next_at - now)  # pacing of an open-loop load, not a wait
        if now - last_check > 0.5 and check is not None:
            check()
            last_check = now
        await tracker.send(factory.make())
        next_at += interval
    await tracker.drain(drain_s, check)
    result = LoadResult(seconds=t1 - t0)
    result.phases_ms = _phases(target, spans, tracker.sent_wall)
    started_after_warmup = [d for d in tracker.done if d[0] - d[1] >= t0]
    result.turns = len(started_after_warmup)
    result.calls = sum(d[2] for d in started_after_warmup)
    result.failed = sum(0 if d[3] else 1 for d in started_after_warmup)
    result.latencies_s = [d[1] for d in started_after_warmup]
    return result


def _record_spans(target: Target) -> dict[str, tuple[float, float, float]] | None:
    """Have a target that can (KafkaTarget) note every result's call times from now on."""
    spans: dict[str, tuple[float, float, float]] | None = getattr(target, "spans", None)
    if spans is not None:
        target.check_every = 1  # type: ignore[attr-defined]
        spans.clear()
    return spans


def _phases(
    target: Target, spans: dict[str, tuple[float, float, float]] | None, sent: dict[str, float]
) -> dict[str, float]:
    """Medians of: sent -> first call started, first started -> last finished, -> result
    (the target goes back to checking every 16th result)."""
    if spans is None:
        return {}
    target.check_every = 16  # type: ignore[attr-defined]
    parts: dict[str, list[float]] = {"to first call start": [], "calls running": [],
                                     "last call end to result": []}  # fmt: skip
    for run_id, (started, finished, received) in spans.items():
        at = sent.get(run_id)
        if at is None:
            continue
        parts["to first call start"].append(started - at)
        parts["calls running"].append(finished - started)
        parts["last call end to result"].append(received - finished)
    return {
        name: sorted(values)[len(values) // 2] * 1000 for name, values in parts.items() if values
    }
