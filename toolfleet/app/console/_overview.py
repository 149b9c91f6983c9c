"""The console's overview: a small stream-processing job over the fleet's topics, and the
charts' API.

The job reads ``model-responses``, ``outcomes`` and ``turn-results`` with one consumer group
shared by every console for every tenant (``console-overview``), folds each batch into
per-minute and per-hour counts (``kernel.rules.overview``) and adds them to the overview's
buckets in Redis (``kernel.stores.overview``) with one pipeline, then commits. A turn's
latency is the time from its model response's record to its result's record: the two topics
are keyed by run and read by the same member of the group (their partitions are assigned
together), which keeps the model responses it saw last (``PENDING_TURNS``), and the results
read before their response (a backlog's partitions are fetched at their own pace). Every
``SAMPLE_S`` it also samples what is true now: each pool's capacity, running calls and lag,
the busiest tenants' waiting calls, open human tasks and unresolved unknown effects.

It sits outside every correctness path: a record read twice counts twice, a console that is
down leaves a gap in the charts, and nothing the fleet decides reads what it writes. Why it is
this job and not faust-streaming or the metrics: docs/console.md, "The overview".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer
from redis.asyncio import Redis

from kernel.adapters.backoff import RECONNECT, nap
from kernel.adapters.bus import TRANSIENT_ERRORS, KafkaBus, Record
from kernel.adapters.lag import GroupLag
from kernel.errors import UsageError
from kernel.rules.overview import (
    HOUR,
    MINUTE,
    LatencyJoin,
    OutcomeFacts,
    TurnFacts,
    bucket_start,
    fold,
)
from kernel.rules.overview import series as overview_series
from kernel.settings import Settings
from kernel.stores.door import Stores
from kernel.stores.overview import Overview
from toolfleet.app import operations

log = logging.getLogger(__name__)

TOPICS = ("model-responses", "outcomes", "turn-results")
GROUP = "console-overview"
PENDING_TURNS = 100_000
"""Model responses whose turn result has not been read yet, kept for its latency."""
SAMPLE_S = 10.0
"""How often the gauges are sampled."""
TOP_TENANTS = 20
"""Tenants whose waiting calls are sampled: the ones with the most."""
SPANS: dict[str, tuple[int, int]] = {
    "15m": (MINUTE, 15),
    "1h": (MINUTE, 60),
    "6h": (MINUTE, 360),
    "24h": (HOUR, 24),
    "7d": (HOUR, 168),
}
"""The spans a chart shows: (bucket width, buckets)."""


def _record_time(record: Record) -> float:
    stamp = getattr(record, "timestamp", None)
    return stamp / 1000.0 if isinstance(stamp, int | float) and stamp > 0 else time.time()


class OverviewJob:
    """Folds the fleet's records into the overview's buckets, in the background of a console
    for every tenant."""

    def __init__(self, settings: Settings, redis: Redis, lag: GroupLag | None = None) -> None:
        self.settings = settings
        self.redis = redis
        self.stores = Stores(redis, settings)
        self.overview: Overview = self.stores.overview()
        self.lag = lag
        """The broker's view of the pools' lag (the console's), when it has one."""
        self.state = "connecting"
        self.error: str | None = None
        self._latencies = LatencyJoin(PENDING_TURNS)
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        """Start folding and sampling in the background."""
        self._tasks = [
            asyncio.create_task(self._consume(), name="console-overview"),
            asyncio.create_task(self._sample(), name="console-overview-gauges"),
        ]

    async def stop(self) -> None:
        """Stop both (the batch in hand is committed or left to the group)."""
        self._stopping.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- folding ------------------------------------------------------------------------------
    def facts(self, records: Sequence[Record]) -> tuple[list[OutcomeFacts], list[TurnFacts]]:
        """What one batch counts; a record that does not read is skipped (the services
        dead-letter bad bytes; a chart does not)."""
        outcomes: list[OutcomeFacts] = []
        turns: list[TurnFacts] = []
        prefix = self.settings.topic_prefix
        responses = self.settings.topic("model-responses")
        # A turn's model response first: in one batch, its result may come before it.
        for record in sorted(records, key=lambda r: r.topic != responses):
            topic = record.topic.removeprefix(prefix)
            try:
                data: dict[str, Any] = orjson.loads(record.value or b"")
                tenant, at = str(data["tenant_id"]), _record_time(record)
                if topic == "model-responses":
                    joined = self._latencies.asked(
                        (tenant, str(data["run_id"]), int(data["turn_id"])), at
                    )
                    if joined is not None:
                        turns.append(joined)
                elif topic == "outcomes":
                    if data.get("kind", "execute") != "execute" or data.get("status") in (
                        None,
                        "pending_approval",
                    ):
                        continue
                    outcomes.append(
                        OutcomeFacts(
                            at, tenant, str(data["tool_name"]), str(data["status"]),
                            str(data["effect"]),
                        )
                    )  # fmt: skip
                elif topic == "turn-results":
                    turn = (tenant, str(data["run_id"]), int(data["turn_id"]))
                    turns.append(self._latencies.ended(turn, at, str(data["status"])))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
        return outcomes, turns

    async def _consume(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            bus = KafkaBus(self.settings, service="console")
            consumer: AIOKafkaConsumer | None = None
            try:
                await bus.start()
                # A new group starts at the end: the charts are of what happens from now on.
                consumer = bus.consumer(TOPICS, group=GROUP, auto_offset_reset="latest")
                await consumer.start()
                self.state, self.error, failures = "folding", None, 0
                while True:
                    batches = await consumer.getmany(timeout_ms=1000, max_records=5000)
                    records = [r for batch in batches.values() for r in batch]
                    if not records:
                        continue
                    outcomes, turns = self.facts(records)
                    await self.overview.add(fold(outcomes, turns, (MINUTE, HOUR)))
                    await consumer.commit()
            except asyncio.CancelledError:
                raise
            except TRANSIENT_ERRORS as exc:
                self.state, self.error = "down", f"Kafka or Redis unavailable: {exc!r}"[:300]
                log.warning("console overview: unavailable", extra={"error": repr(exc)})
            except Exception as exc:  # a bug: said on the API, and the job starts again
                self.state, self.error = "down", f"overview job failed: {exc!r}"[:300]
                log.exception("console overview job failed")
            finally:
                with contextlib.suppress(*TRANSIENT_ERRORS):
                    if consumer is not None:
                        await consumer.stop()
                    await bus.stop()
            failures += 1
            await nap(RECONNECT.delay(failures))

    # --- sampling -----------------------------------------------------------------------------
    async def gauges(self, now: float) -> dict[str, float]:
        """What is true now, by gauge name."""
        redis, settings = self.redis, self.settings
        found: dict[str, float] = {}
        for pool in await operations.pools(redis, settings, self.lag, now):
            found[f"pool.capacity|{pool.name}"] = pool.capacity
            found[f"pool.running|{pool.name}"] = pool.running
            if pool.lag is not None:
                found[f"pool.lag|{pool.name}"] = pool.lag
        _defaults, shares = await operations.tenant_shares(redis, settings)
        for share in sorted(shares, key=lambda s: -s.view.waiting)[:TOP_TENANTS]:
            found[f"tenant.waiting|{share.view.tenant_id}"] = share.view.waiting
            found[f"tenant.running|{share.view.tenant_id}"] = share.view.running
        tasks = await operations.list_tasks(redis, settings)
        found["tasks.open|all"] = len(tasks)
        unknown, _oldest = await self.stores.unknowns(self.stores.ledger()).backlog(now)
        found["unknown.open|all"] = unknown
        return found

    async def _sample(self) -> None:
        while not self._stopping.is_set():
            now = time.time()
            try:
                await self.overview.sample(await self.gauges(now), now)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("console overview: no sample", extra={"error": repr(exc)})
            await nap(SAMPLE_S)


async def overview_json(overview: Overview, span: str, now: float) -> dict[str, Any]:
    """The charts' data for ``span`` (one of ``SPANS``), ending with the bucket of ``now``."""
    if span not in SPANS:
        raise UsageError(f"span must be one of {', '.join(SPANS)}, not {span[:20]!r}")
    width, count = SPANS[span]
    last = bucket_start(now, width)
    starts = [last - width * i for i in reversed(range(count))]
    drawn = overview_series(await overview.read(width, starts), starts, width)
    return {
        "span": span,
        "width": drawn.width,
        "starts": drawn.starts,
        "calls": drawn.calls,
        "turns_per_s": drawn.turns_per_s,
        "latency_p50_s": drawn.latency_p50_s,
        "latency_p99_s": drawn.latency_p99_s,
        "gauges": drawn.gauges,
        "tenants": drawn.tenants,
        "tools": drawn.tools,
    }
