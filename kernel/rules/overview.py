"""The console's overview, as numbers: windowed counts and latency histograms folded from the
fleet's records, and the series a chart draws from them. Pure: the console's overview job
(``toolfleet.app.console._overview``) reads the records and stores what this module folds.

Counts are kept per minute (and per hour, for the longer views), as fields of one map per
bucket:

- ``calls|STATUS|EFFECT``: call outcomes (every attempt's), by transport status and effect;
- ``tenant|TENANT``: a tenant's call outcomes (its share of the work done);
- ``tool|TOOL``: a tool's;
- ``turns|STATUS``: turn results, by status;
- ``lat|B``: turns whose latency (from the model response's record to the turn result's)
  falls in histogram bucket ``B`` (``latency_bucket``);
- ``g|NAME``: a gauge sampled during the minute (the last sample wins): a pool's capacity,
  running calls and lag, a tenant's waiting calls, open human tasks, unresolved unknowns.

Delivery is at least once: a record read twice counts twice. That costs a chart a point,
never a call, and is why none of this is ever read by a decision.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MINUTE = 60
HOUR = 3600
LATENCY_BASE_MS = 1.0
"""The lowest latency bucket's upper bound."""
LATENCY_STEPS_PER_DOUBLING = 4
"""Buckets per doubling of the latency: each covers about 19% (a percentile's error)."""
LATENCY_BUCKETS = 96
"""Buckets in all: 1 ms to about 16 million ms (4.6 hours); anything longer is the last."""


def bucket_start(at: float, width: int) -> int:
    """The start (Unix seconds) of the ``width``-second bucket holding ``at``."""
    return int(at // width) * width


def latency_bucket(seconds: float) -> int:
    """The histogram bucket of a latency: 0 up to ``LATENCY_BASE_MS``, then
    ``LATENCY_STEPS_PER_DOUBLING`` buckets per doubling."""
    ms = max(0.0, seconds * 1000.0)
    if ms <= LATENCY_BASE_MS:
        return 0
    index = math.ceil(math.log2(ms / LATENCY_BASE_MS) * LATENCY_STEPS_PER_DOUBLING)
    return min(LATENCY_BUCKETS - 1, index)


def bucket_upper_s(index: int) -> float:
    """The upper bound (seconds) of latency bucket ``index``."""
    return LATENCY_BASE_MS * 2 ** (index / LATENCY_STEPS_PER_DOUBLING) / 1000.0


def percentile(histogram: Mapping[int, int], q: float) -> float | None:
    """The ``q`` quantile (0 < q <= 1) of a latency histogram, as its bucket's upper bound
    (None when it is empty)."""
    total = sum(histogram.values())
    if total <= 0:
        return None
    rank = math.ceil(q * total)
    seen = 0
    for index in sorted(histogram):
        seen += histogram[index]
        if seen >= rank:
            return bucket_upper_s(index)
    return bucket_upper_s(max(histogram))


@dataclass(frozen=True)
class OutcomeFacts:
    """What the overview counts of one call outcome."""

    at: float
    tenant_id: str
    tool: str
    status: str
    effect: str


@dataclass(frozen=True)
class TurnFacts:
    """What the overview counts of one turn result: its status, and its latency when the
    model response it answers was seen (None otherwise). ``counted``: the result itself was
    counted already, and this adds the latency its model response gave it later."""

    at: float
    status: str
    latency_s: float | None
    counted: bool = False


TurnKey = tuple[str, str, int]
"""(tenant, run, turn)."""


class LatencyJoin:
    """Joins each turn's model response with its result, whichever is read first: a backlog's
    partitions are fetched at their own pace, so a result can come before its response. Keeps
    at most ``capacity`` of each waiting (the oldest forgotten: a chart misses a point)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._asked: OrderedDict[TurnKey, float] = OrderedDict()
        self._ended: OrderedDict[TurnKey, tuple[float, str]] = OrderedDict()

    def _keep(self, book: OrderedDict[TurnKey, Any], key: TurnKey, value: Any) -> None:
        book[key] = value
        while len(book) > self.capacity:
            book.popitem(last=False)

    def asked(self, turn: TurnKey, at: float) -> TurnFacts | None:
        """A model response read at ``at``: the latency of its result if that came first."""
        ended = self._ended.pop(turn, None)
        if ended is None:
            self._keep(self._asked, turn, at)
            return None
        end, status = ended
        return TurnFacts(end, status, end - at, counted=True) if end >= at else None

    def ended(self, turn: TurnKey, at: float, status: str) -> TurnFacts:
        """A turn result read at ``at``: counted, with its latency when its response came."""
        asked = self._asked.pop(turn, None)
        if asked is None:
            self._keep(self._ended, turn, (at, status))
        latency = at - asked if asked is not None and at >= asked else None
        return TurnFacts(at, status, latency)


@dataclass
class Fold:
    """Increments per bucket start, for one batch of records."""

    width: int
    increments: dict[int, Counter[str]] = field(default_factory=dict)

    def _bucket(self, at: float) -> Counter[str]:
        return self.increments.setdefault(bucket_start(at, self.width), Counter())

    def outcome(self, facts: OutcomeFacts) -> None:
        """Count a call outcome."""
        bucket = self._bucket(facts.at)
        bucket[f"calls|{facts.status}|{facts.effect}"] += 1
        bucket[f"tenant|{facts.tenant_id}"] += 1
        bucket[f"tool|{facts.tool}"] += 1

    def turn(self, facts: TurnFacts) -> None:
        """Count a turn result (and its latency, when known)."""
        bucket = self._bucket(facts.at)
        if not facts.counted:
            bucket[f"turns|{facts.status}"] += 1
        if facts.latency_s is not None:
            bucket[f"lat|{latency_bucket(facts.latency_s)}"] += 1


def fold(
    outcomes: Iterable[OutcomeFacts], turns: Iterable[TurnFacts], widths: Sequence[int]
) -> list[Fold]:
    """The increments ``outcomes`` and ``turns`` make in buckets of each of ``widths``."""
    folds = [Fold(width) for width in widths]
    outcomes, turns = list(outcomes), list(turns)
    for f in folds:
        for o in outcomes:
            f.outcome(o)
        for t in turns:
            f.turn(t)
    return folds


@dataclass(frozen=True)
class Series:
    """What the overview page draws: one point per bucket, oldest first."""

    width: int
    starts: list[int]
    calls: dict[str, list[float]]
    """Calls per second by ``status`` and by ``effect`` (keys ``status:X``, ``effect:X``)."""
    turns_per_s: list[float]
    latency_p50_s: list[float | None]
    latency_p99_s: list[float | None]
    gauges: dict[str, list[float | None]]
    """Each gauge's last sample in the bucket (None: not sampled then)."""
    tenants: dict[str, int]
    """Call outcomes per tenant over the whole span."""
    tools: dict[str, int]


def series(buckets: Mapping[int, Mapping[str, str]], starts: Sequence[int], width: int) -> Series:
    """The series of ``buckets`` (each one's fields as stored, by start) at ``starts``."""
    calls: dict[str, list[float]] = {}
    turns: list[float] = []
    p50: list[float | None] = []
    p99: list[float | None] = []
    gauges: dict[str, list[float | None]] = {}
    tenants: Counter[str] = Counter()
    tools: Counter[str] = Counter()
    for n, start in enumerate(starts):
        fields = buckets.get(start, {})
        histogram: dict[int, int] = {}
        by_key: Counter[str] = Counter()
        turn_count = 0
        for name, raw in fields.items():
            kind, _, rest = name.partition("|")
            if kind == "g":
                gauges.setdefault(rest, [None] * len(starts))[n] = float(raw)
                continue
            value = int(float(raw))
            if kind == "calls":
                status, _, effect = rest.partition("|")
                by_key[f"status:{status}"] += value
                by_key[f"effect:{effect}"] += value
            elif kind == "turns":
                turn_count += value
            elif kind == "lat":
                histogram[int(rest)] = histogram.get(int(rest), 0) + value
            elif kind == "tenant":
                tenants[rest] += value
            elif kind == "tool":
                tools[rest] += value
        for key in by_key:
            calls.setdefault(key, [0.0] * len(starts))
        for key, values in calls.items():
            values[n] = by_key.get(key, 0) / width
        turns.append(turn_count / width)
        p50.append(percentile(histogram, 0.5))
        p99.append(percentile(histogram, 0.99))
    return Series(width, list(starts), calls, turns, p50, p99, gauges, dict(tenants), dict(tools))
