"""Which Kafka client for toolfleet's services: ``python -m bench.kafka_clients`` (``make
bench-kafka``; needs the local broker, ``toolfleet infra up``, and ``pip install -e '.[bench]'``
for confluent-kafka).

toolfleet's services move small JSON records (an ``ExecutionCommand`` out, a ``CallOutcome``
back, 500-700 bytes) keyed by run id, a handful per event-loop pass, and consume them in groups
that commit by hand after handling. This measures that shape, against the real broker, for:

- ``aiokafka-today``: aiokafka as ``kernel.adapters.bus`` configures it;
- ``aiokafka-tuned``: aiokafka with linger, fetch and poll sizes set for this workload;
- ``confluent-aio``: confluent-kafka (librdkafka) through its asyncio API,
  ``confluent_kafka.aio.AIOProducer``/``AIOConsumer``, used as its documentation shows
  (``produce`` each record, ``flush``, then await the delivery futures);
- ``confluent-thread``: confluent-kafka's plain ``Producer`` with a thread that serves its
  delivery reports onto the event loop (the older documented asyncio pattern), and
  ``AIOConsumer``.

Every process runs as toolfleet's services do (uvloop, their garbage-collector tuning), and
every variant keeps toolfleet's guarantees: acks=all, an idempotent producer, read_committed,
no auto-commit (offsets committed every 0.2 s after handling, as ``ConsumeLoop`` does).
Measured for each, in the same run, in alternating order, several times:

(a) produce throughput: 16 tasks, each publishing bursts of 1-20 records and awaiting their
    acks; records/s, CPU per record of this process (``getrusage``: every thread, librdkafka's
    too) and of the broker (its pid);
(b) ping-pong: a request produced, consumed by an echo process (a consumer group), a reply
    produced, consumed back: p50/p99 one at a time (idle) and at a fixed offered load (half
    load: half of aiokafka-today's saturated rate, measured first, the same for every
    variant), and the saturated round-trip rate with the CPU per round trip of this process,
    the echo process and the broker;
(c) consume-process-commit: a consumer group reading a pre-filled topic (decode each record,
    commit every 0.2 s); records/s and CPU per record.

The machine's other load during each phase (busy CPU not ours, and the load average) is
printed with the numbers: a noisy run is to be repeated.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import datetime as dt
import functools
import hashlib
import itertools
import json
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psutil
import uvloop
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.procs import REPO, cpu_seconds, infra_pids, progress
from kernel.settings import Settings
from schemas import CallOutcome, ExecutionCommand
from toolfleet.app.service import tune_gc

T = TypeVar("T")

PARTITIONS = 6
"""As toolfleet's topics (``Settings.partitions``)."""
COMMIT_INTERVAL_S = 0.2
"""As ``kernel.adapters.bus.COMMIT_INTERVAL_S``."""
POLL_TIMEOUT_S = 0.1
MAX_RECORDS = 500
"""``ConsumeLoop``'s poll: ``getmany(timeout_ms=100, max_records=500)``."""
PRODUCERS = 16
"""Concurrent publishing tasks (a service's handlers) in (a) and (b)'s saturated rate."""
CALL_MARK = b"call_00000000000000000000000000"
RUN_MARK = b"run_00000000000000000000000000000000"

Rec = tuple[str, int, int, bytes | None, bytes | None]
"""topic, partition, offset, key, value."""


@dataclasses.dataclass(frozen=True)
class Variant:
    """A client and its settings; ``producer``/``consumer`` are that client's own options."""

    client: str
    """aiokafka, confluent-aio or confluent-thread."""
    producer: dict[str, Any]
    consumer: dict[str, Any]


AIOKAFKA_TODAY = Variant(
    "aiokafka",
    # kernel.adapters.bus.KafkaBus.start (kafka_linger_ms defaults to 0)
    {"enable_idempotence": True, "acks": "all", "linger_ms": 0, "max_batch_size": 262_144},
    # kernel.adapters.bus.KafkaBus.consumer
    {
        "enable_auto_commit": False,
        "isolation_level": "read_committed",
        "session_timeout_ms": 10_000,
        "heartbeat_interval_ms": 1_666,
        "fetch_max_wait_ms": 50,
    },
)

_CONFLUENT_PRODUCER = {"acks": "all", "enable.idempotence": True, "linger.ms": 0}
_CONFLUENT_CONSUMER = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "isolation.level": "read_committed",
    "session.timeout.ms": 10_000,
    "heartbeat.interval.ms": 1_666,
    "fetch.wait.max.ms": 50,
}

VARIANTS: dict[str, Variant] = {
    "aiokafka-today": AIOKAFKA_TODAY,
    # The best of a sweep (bench/results/kafka-clients.md): linger_ms 1 or 5 and fetch_min_bytes
    # 4096 cost every round trip 2-10 ms at idle and gave no throughput back, because aiokafka
    # already puts what one loop pass sends in one request; a shorter fetch wait and smaller
    # polls were the only candidates that did not lose.
    "aiokafka-tuned": Variant(
        "aiokafka",
        AIOKAFKA_TODAY.producer,
        AIOKAFKA_TODAY.consumer | {"fetch_max_wait_ms": 10, "max_poll_records": 200},
    ),
    "confluent-aio": Variant("confluent-aio", _CONFLUENT_PRODUCER, _CONFLUENT_CONSUMER),
    "confluent-thread": Variant("confluent-thread", _CONFLUENT_PRODUCER, _CONFLUENT_CONSUMER),
}


def define(spec: str) -> str:
    """Add a variant from ``NAME=BASE[,producer.KEY=VALUE][,consumer.KEY=VALUE]...`` (VALUE
    as JSON, else a string), e.g. ``l2=aiokafka-today,producer.linger_ms=2``; its name."""
    name, _, rest = spec.partition("=")
    base, *settings = rest.split(",")
    producer, consumer = dict(VARIANTS[base].producer), dict(VARIANTS[base].consumer)
    for setting in settings:
        path, _, raw = setting.partition("=")
        side, _, key = path.partition(".")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        {"producer": producer, "consumer": consumer}[side][key] = value
    VARIANTS[name] = Variant(VARIANTS[base].client, producer, consumer)
    return name


BUILT_IN = list(VARIANTS)

# ---------------------------------------------------------------------------------------------
# The records: real wire models, encoded once; a call id (and run id) swapped in per record.


@dataclasses.dataclass(frozen=True)
class Workload:
    """Command templates (key: run id) and an outcome template, as toolfleet encodes them."""

    commands: list[tuple[bytes, bytes]]
    outcome: bytes

    @staticmethod
    def build(runs: int = 400, seed: int = 7) -> Workload:
        """``runs`` run ids with one command template each, arguments of varied length."""
        rng = random.Random(seed)
        now = time.time()
        commands = []
        for _ in range(runs):
            run = f"run_{uuid.UUID(int=rng.getrandbits(128)).hex}"
            args = {"order_id": f"ord_{rng.randrange(10**6)}", "note": "x" * rng.randrange(80)}
            command = ExecutionCommand(
                tenant_id=f"tenant-{rng.randrange(20)}",
                run_id=run,
                turn_id=rng.randrange(8),
                call_id=CALL_MARK.decode(),
                tool_name=rng.choice(["lookup_order", "refund_payment", "search_docs"]),
                arguments=json.dumps(args),
                index=rng.randrange(5),
                pool="default",
                attempt=1,
                fencing_token=rng.randrange(1, 100),
                idempotency_key=f"{run}:{CALL_MARK.decode()}",
                fingerprint=hashlib.sha256(run.encode()).hexdigest(),
                admitted=True,
                deadline_at=now + 60,
                issued_at=now,
            )
            commands.append((run.encode(), command.encode()))
        outcome = CallOutcome(
            tenant_id="tenant-3",
            run_id=RUN_MARK.decode(),
            turn_id=2,
            call_id=CALL_MARK.decode(),
            tool_name="lookup_order",
            index=1,
            attempt=1,
            fencing_token=12,
            status="succeeded",
            effect="applied",
            output=json.dumps({"order_id": "ord_48213", "status": "shipped", "items": 3}),
            admitted=True,
            worker_id="worker-default-1",
            started_at=now,
            finished_at=now,
        ).encode()
        return Workload(commands, outcome)

    def command(self, i: int) -> tuple[bytes, bytes]:
        """The ``i``-th command: key and value, with call id ``i``."""
        key, value = self.commands[i % len(self.commands)]
        return key, value.replace(CALL_MARK, _call_id(i).encode())

    def reply(self, request: bytes) -> tuple[str, bytes]:
        """The outcome answering a command (its call id, its bytes), as a worker would."""
        fields = json.loads(request)
        value = self.outcome.replace(CALL_MARK, fields["call_id"].encode())
        return fields["call_id"], value.replace(RUN_MARK, fields["run_id"].encode())

    def sizes(self) -> tuple[int, int, int]:
        """Smallest, mean and largest command, in bytes."""
        lengths = [len(self.command(i)[1]) for i in range(len(self.commands))]
        return min(lengths), round(statistics.mean(lengths)), max(lengths)


def _call_id(i: int) -> str:
    return f"call_{i:026d}"


# ---------------------------------------------------------------------------------------------
# The clients behind one small surface.


class Producer(Protocol):
    """Publishes a burst (one event-loop pass's records) and returns once all are acked."""

    async def burst(self, records: Sequence[tuple[str, bytes, bytes]]) -> None:
        """Publish (topic, key, value) records; return when the broker has them all."""

    async def stop(self) -> None:
        """Flush and disconnect."""

    async def produce_requests(self) -> int:
        """Produce requests sent to the broker so far."""


class Consumer(Protocol):
    """A group member that only its caller commits for."""

    async def poll(self) -> list[Rec]:
        """The next records (none after ``POLL_TIMEOUT_S``)."""

    async def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        """Commit ``offsets`` (the next offset to read, per topic and partition)."""

    async def stop(self) -> None:
        """Leave the group."""


class _Aiokafka:
    def __init__(self, producer: AIOKafkaProducer) -> None:
        self._p = producer
        self._requests = 0
        send = producer.client.send

        async def counted(node_id: int, request: Any, **kwargs: Any) -> Any:
            if type(request).__name__.startswith("ProduceRequest"):
                self._requests += 1
            return await send(node_id, request, **kwargs)

        producer.client.send = counted

    async def produce_requests(self) -> int:
        return self._requests

    async def burst(self, records: Sequence[tuple[str, bytes, bytes]]) -> None:
        futures = [await self._p.send(t, v, key=k) for t, k, v in records]
        await asyncio.gather(*futures)

    async def stop(self) -> None:
        await self._p.stop()


class _AiokafkaConsumer:
    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self._c = consumer

    async def poll(self) -> list[Rec]:
        batches = await self._c.getmany(
            timeout_ms=int(POLL_TIMEOUT_S * 1000), max_records=MAX_RECORDS
        )
        return [
            (r.topic, r.partition, r.offset, r.key, r.value)
            for records in batches.values()
            for r in records
        ]

    async def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        await self._c.commit({TopicPartition(t, p): o for (t, p), o in offsets.items()})

    async def stop(self) -> None:
        await self._c.stop()


class _Stats:
    """librdkafka's statistics (``stats_cb``): produce requests sent, read from a report
    made after the caller asked."""

    def __init__(self) -> None:
        self.latest: tuple[float, int] = (0.0, 0)
        self._loop = asyncio.get_running_loop()
        self._fresh = asyncio.Event()

    def report(self, stats: str) -> None:  # on librdkafka's polling thread, or the loop
        brokers = json.loads(stats)["brokers"].values()
        self.latest = (time.monotonic(), sum(b["req"].get("Produce", 0) for b in brokers))
        self._loop.call_soon_threadsafe(self._fresh.set)

    async def areport(self, stats: str) -> None:
        self.report(stats)

    async def produce_requests(self) -> int:
        asked = time.monotonic()
        while self.latest[0] <= asked:
            self._fresh.clear()
            await asyncio.wait_for(self._fresh.wait(), 5)
        return self.latest[1]


STATS_INTERVAL_MS = 100


class _ConfluentAio:
    """``AIOProducer`` as documented: produce, flush the local buffer, await deliveries."""

    def __init__(self, producer: Any, stats: _Stats) -> None:
        self._p = producer
        self.produce_requests = stats.produce_requests

    async def burst(self, records: Sequence[tuple[str, bytes, bytes]]) -> None:
        futures = [await self._p.produce(t, value=v, key=k) for t, k, v in records]
        # Without a flush the records wait in AIOProducer's buffer for 1,000 records or
        # buffer_timeout (1 s), and their futures for the next poll of librdkafka.
        await self._p.flush()
        await asyncio.gather(*futures)

    async def stop(self) -> None:
        await self._p.close()


class _ConfluentThread:
    """librdkafka's ``Producer``: ``produce`` does not block (it queues in librdkafka); one
    thread serves delivery reports and settles their futures on the loop, once per poll."""

    def __init__(self, conf: dict[str, Any], stats: _Stats) -> None:
        from confluent_kafka import Producer as RdProducer

        self._p = RdProducer(conf | {"stats_cb": stats.report})
        self.produce_requests = stats.produce_requests
        self._loop = asyncio.get_running_loop()
        self._done: list[tuple[asyncio.Future[None], Any]] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kafka-delivery", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            self._p.poll(0.1)
            if self._done:
                done, self._done = self._done, []
                self._loop.call_soon_threadsafe(_settle, done)

    async def burst(self, records: Sequence[tuple[str, bytes, bytes]]) -> None:
        futures = []
        for t, k, v in records:
            future: asyncio.Future[None] = self._loop.create_future()
            self._p.produce(t, v, k, on_delivery=self._reporter(future))
            futures.append(future)
        await asyncio.gather(*futures)

    def _reporter(self, future: asyncio.Future[None]) -> Callable[[Any, Any], None]:
        def report(err: Any, _msg: Any) -> None:  # on the delivery thread
            self._done.append((future, err))

        return report

    async def stop(self) -> None:
        await asyncio.to_thread(self._p.flush, 30)
        self._stopping.set()
        await asyncio.to_thread(self._thread.join)


def _settle(done: list[tuple[asyncio.Future[None], Any]]) -> None:
    for future, err in done:
        if future.done():
            continue
        if err is None:
            future.set_result(None)
        else:
            future.set_exception(RuntimeError(f"delivery failed: {err}"))


class _ConfluentConsumer:
    """``AIOConsumer``: ``consume(n, timeout)`` waits for all ``n`` records or the whole
    timeout (a 100 ms floor on every hop), so wait for one record with ``poll`` and take what
    else is there with a non-blocking ``consume``."""

    def __init__(self, consumer: Any) -> None:
        self._c = consumer

    async def poll(self) -> list[Rec]:
        first = await self._c.poll(POLL_TIMEOUT_S)
        if first is None:
            return []
        return _records([first, *await self._c.consume(num_messages=MAX_RECORDS - 1, timeout=0)])

    async def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        from confluent_kafka import TopicPartition as RdTopicPartition

        partitions = [RdTopicPartition(t, p, o) for (t, p), o in offsets.items()]
        await self._c.commit(offsets=partitions, asynchronous=False)

    async def stop(self) -> None:
        await self._c.close()


class _ConfluentThreadConsumer:
    """librdkafka's ``Consumer`` on a thread of its own: one hop per poll (wait for a record,
    take the rest without waiting) and per commit."""

    def __init__(self, consumer: Any) -> None:
        self._c = consumer
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kafka-poll")

    def _take(self) -> list[Any]:
        first = self._c.poll(POLL_TIMEOUT_S)
        if first is None:
            return []
        return [first, *self._c.consume(num_messages=MAX_RECORDS - 1, timeout=0)]

    async def poll(self) -> list[Rec]:
        loop = asyncio.get_running_loop()
        return _records(await loop.run_in_executor(self._thread, self._take))

    async def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        from confluent_kafka import TopicPartition as RdTopicPartition

        partitions = [RdTopicPartition(t, p, o) for (t, p), o in offsets.items()]
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(
            self._thread, functools.partial(self._c.commit, offsets=partitions, asynchronous=False)
        )

    async def stop(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self._c.close)
        self._thread.shutdown()


def _records(messages: Sequence[Any]) -> list[Rec]:
    out: list[Rec] = []
    for m in messages:
        if m.error() is not None:
            raise RuntimeError(f"consume failed: {m.error()}")
        out.append((m.topic(), m.partition(), m.offset(), m.key(), m.value()))
    return out


async def make_producer(variant: Variant, servers: str) -> Producer:
    """A started producer of ``variant``."""
    if variant.client == "aiokafka":
        producer = AIOKafkaProducer(bootstrap_servers=servers, **variant.producer)
        await producer.start()
        return _Aiokafka(producer)
    conf = {
        "bootstrap.servers": servers,
        "statistics.interval.ms": STATS_INTERVAL_MS,  # produce requests counted
        **variant.producer,
    }
    stats = _Stats()
    if variant.client == "confluent-aio":
        from confluent_kafka.aio import AIOProducer

        return _ConfluentAio(AIOProducer(conf | {"stats_cb": stats.areport}), stats)
    return _ConfluentThread(conf, stats)


async def make_consumer(
    variant: Variant, servers: str, topics: list[str], group: str, reset: str
) -> Consumer:
    """A started member of ``group`` reading ``topics`` (from ``reset`` when it has no
    committed offsets)."""
    if variant.client == "aiokafka":
        consumer = AIOKafkaConsumer(
            *topics,
            bootstrap_servers=servers,
            group_id=group,
            auto_offset_reset=reset,
            **variant.consumer,
        )
        await consumer.start()
        return _AiokafkaConsumer(consumer)
    conf = {
        "bootstrap.servers": servers,
        "group.id": group,
        "auto.offset.reset": reset,
        **variant.consumer,
    }
    if variant.client == "confluent-aio":
        from confluent_kafka.aio import AIOConsumer

        aio = AIOConsumer(conf)
        await aio.subscribe(topics)
        return _ConfluentConsumer(aio)
    from confluent_kafka import Consumer as RdConsumer

    rd = RdConsumer(conf)
    rd.subscribe(topics)
    return _ConfluentThreadConsumer(rd)


class Committer:
    """Offsets handled in order, committed at most every ``COMMIT_INTERVAL_S``."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self._pending: dict[tuple[str, int], int] = {}
        self._last = time.monotonic()

    def done(self, records: Sequence[Rec]) -> None:
        """``records`` are handled."""
        for topic, partition, offset, _, _ in records:
            self._pending[(topic, partition)] = offset + 1

    async def maybe(self, force: bool = False) -> None:
        """Commit what is handled if the interval has passed (or ``force``)."""
        if self._pending and (force or time.monotonic() - self._last >= COMMIT_INTERVAL_S):
            pending, self._pending = self._pending, {}
            await self.consumer.commit(pending)
            self._last = time.monotonic()


# ---------------------------------------------------------------------------------------------
# Measuring.


@dataclasses.dataclass
class Meter:
    """Wall time and CPU seconds of this process, the broker and an echo process, and the
    machine's busy CPU, between ``start`` and ``stop``."""

    broker: int | None
    echo: int | None = None
    wall: float = 0.0
    own: float = 0.0
    broker_cpu: float = 0.0
    echo_cpu: float = 0.0
    machine_busy: float = 0.0
    load: float = 0.0
    _marks: tuple[float, ...] = ()

    def _now(self) -> tuple[float, ...]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        machine = psutil.cpu_times()
        busy = sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)
        return (
            time.perf_counter(),
            usage.ru_utime + usage.ru_stime,
            cpu_seconds(self.broker) if self.broker else 0.0,
            _proc_cpu(self.echo) if self.echo else 0.0,
            busy,
        )

    def start(self) -> None:
        """Begin the interval."""
        self._marks = self._now()

    def stop(self) -> None:
        """End the interval."""
        end = self._now()
        self.wall, self.own, self.broker_cpu, self.echo_cpu, self.machine_busy = (
            b - a for a, b in zip(self._marks, end, strict=True)
        )
        self.load = os.getloadavg()[0]

    @property
    def others(self) -> float:
        """Share of the machine (all cores) busy with work not ours, 0-1."""
        ours = self.own + self.broker_cpu + self.echo_cpu
        cores = psutil.cpu_count() or 1
        return max(0.0, self.machine_busy - ours) / (self.wall * cores)


def _proc_cpu(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system)


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


@dataclasses.dataclass
class Env:
    """What every phase needs."""

    servers: str
    broker: int | None
    topics: dict[str, str]
    workload: Workload
    seconds: float
    specs: list[str]
    """``--variant`` definitions, for the echo process."""
    counter: itertools.count[int] = dataclasses.field(default_factory=itertools.count)


# (a) ------------------------------------------------------------------------------------------


async def produce_phase(env: Env, variant: Variant) -> dict[str, float]:
    """Bursts of 1-20 records from ``PRODUCERS`` tasks, each awaiting its burst's acks."""
    producer = await make_producer(variant, env.servers)
    topic = env.topics["produce"]
    sent = 0

    async def publisher(seed: int, until: float) -> None:
        nonlocal sent
        rng = random.Random(seed)
        while time.perf_counter() < until:
            n = rng.randint(1, 20)
            records = [(topic, *env.workload.command(next(env.counter))) for _ in range(n)]
            await producer.burst(records)
            sent += n

    try:
        warm = time.perf_counter() + 1.0
        await asyncio.gather(*(publisher(s, warm) for s in range(PRODUCERS)))
        sent = 0
        requests = await producer.produce_requests()
        meter = Meter(env.broker)
        meter.start()
        until = time.perf_counter() + env.seconds
        await asyncio.gather(*(publisher(100 + s, until) for s in range(PRODUCERS)))
        meter.stop()
        requests = await producer.produce_requests() - requests
    finally:
        await producer.stop()
    return {
        "produce_per_request": sent / max(1, requests),
        "produce_per_s": sent / meter.wall,
        "produce_cpu_us": meter.own / sent * 1e6,
        "produce_broker_us": meter.broker_cpu / sent * 1e6,
        "produce_others": meter.others,
        "produce_load": meter.load,
    }


# (c) ------------------------------------------------------------------------------------------


async def fill(env: Env, records: int) -> None:
    """Put ``records`` commands on the consume topic (aiokafka-today, not measured)."""
    producer = await make_producer(AIOKAFKA_TODAY, env.servers)
    topic = env.topics["consume"]
    try:
        for start in range(0, records, 1_000):
            batch = [
                (topic, *env.workload.command(i)) for i in range(start, min(records, start + 1_000))
            ]
            await producer.burst(batch)
    finally:
        await producer.stop()


async def consume_phase(env: Env, variant: Variant, records: int, group: str) -> dict[str, float]:
    """Read the pre-filled topic in a new group: decode each record, commit every 0.2 s."""
    consumer = await make_consumer(variant, env.servers, [env.topics["consume"]], group, "earliest")
    committer = Committer(consumer)
    meter = Meter(env.broker)
    seen = 0
    deadline = time.monotonic() + 120
    try:
        while seen < records:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{variant}: read {seen} of {records} records in 120 s")
            batch = await consumer.poll()
            if not batch:
                continue
            if seen == 0:
                meter.start()  # from the first record: the group's join is not the client's
            for rec in batch:
                json.loads(rec[4] or b"null")
            seen += len(batch)
            committer.done(batch)
            await committer.maybe()
        await committer.maybe(force=True)
        meter.stop()
    finally:
        await consumer.stop()
    return {
        "consume_per_s": seen / meter.wall,
        "consume_cpu_us": meter.own / seen * 1e6,
        "consume_broker_us": meter.broker_cpu / seen * 1e6,
        "consume_others": meter.others,
        "consume_load": meter.load,
    }


# (b) ------------------------------------------------------------------------------------------


class Pinger:
    """Sends commands, reads the outcomes the echo process answers, times each round trip."""

    def __init__(self, env: Env, producer: Producer, consumer: Consumer) -> None:
        self.env = env
        self.producer = producer
        self.consumer = consumer
        self.pending: dict[str, tuple[float, asyncio.Future[float]]] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        committer = Committer(self.consumer)
        while True:
            batch = await self.consumer.poll()
            now = time.perf_counter()
            for rec in batch:
                call_id = json.loads(rec[4] or b"{}").get("call_id")
                entry = self.pending.pop(call_id, None)
                if entry is not None and not entry[1].done():
                    entry[1].set_result(now - entry[0])
            committer.done(batch)
            await committer.maybe()

    async def burst(self, n: int) -> list[float]:
        """Send ``n`` commands in one pass; the round trips of each, in seconds."""
        loop = asyncio.get_running_loop()
        records, futures = [], []
        now = time.perf_counter()
        for _ in range(n):
            i = next(self.env.counter)
            key, value = self.env.workload.command(i)
            future: asyncio.Future[float] = loop.create_future()
            self.pending[_call_id(i)] = (now, future)
            records.append((self.env.topics["requests"], key, value))
            futures.append(future)
        await self.producer.burst(records)
        return list(await asyncio.wait_for(asyncio.gather(*futures), 60))

    async def ready(self) -> None:
        """Ping until the echo answers (both groups have their partitions)."""
        deadline = time.monotonic() + 90
        loop = asyncio.get_running_loop()
        while time.monotonic() < deadline:
            i = next(self.env.counter)
            answered: asyncio.Future[float] = loop.create_future()
            self.pending[_call_id(i)] = (time.perf_counter(), answered)
            await self.producer.burst(
                [(self.env.topics["requests"], *self.env.workload.command(i))]
            )
            done, _ = await asyncio.wait({answered}, timeout=1.0)
            if done:
                return
        raise RuntimeError("the echo process never answered")

    async def close(self) -> None:
        """Stop reading."""
        self._reader.cancel()
        await asyncio.wait({self._reader})  # a cancellation of the caller still goes through


def _spawn_echo(env: Env, variant_name: str, group: str, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "bench.kafka_clients", "--echo", variant_name]
    argv += ["--echo-group", group, "--echo-topics", json.dumps(env.topics)]
    for spec in env.specs:
        argv += ["--variant", spec]
    with log.open("ab") as out:
        return subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


async def pingpong_phase(
    env: Env, name: str, half_rate: float | None, tag: str, logs: Path
) -> dict[str, float]:
    """Idle round trips, the saturated rate, then ``half_rate`` offered (when given)."""
    variant = VARIANTS[name]
    echo = _spawn_echo(env, name, f"{tag}.echo", logs / f"echo-{tag}.log")
    producer = await make_producer(variant, env.servers)
    consumer = await make_consumer(
        variant, env.servers, [env.topics["replies"]], f"{tag}.client", "latest"
    )
    pinger = Pinger(env, producer, consumer)
    out: dict[str, float] = {}
    try:
        await pinger.ready()
        for _ in range(50):  # warm-up
            await pinger.burst(1)
        idle = [(await pinger.burst(1))[0] for _ in range(300)]
        out["idle_p50_ms"] = statistics.median(idle) * 1e3
        out["idle_p99_ms"] = _pct(idle, 0.99) * 1e3

        meter = Meter(env.broker, echo.pid)
        trips = 0

        async def closed(seed: int, until: float) -> None:
            nonlocal trips
            rng = random.Random(seed)
            while time.perf_counter() < until:
                n = rng.randint(1, 20)
                await pinger.burst(n)
                trips += n

        requests = await producer.produce_requests()
        meter.start()
        until = time.perf_counter() + env.seconds
        await asyncio.gather(*(closed(s, until) for s in range(PRODUCERS)))
        meter.stop()
        requests = await producer.produce_requests() - requests
        out["sat_per_request"] = trips / max(1, requests)
        out["sat_per_s"] = trips / meter.wall
        out["sat_cpu_us"] = meter.own / trips * 1e6
        out["sat_echo_us"] = meter.echo_cpu / trips * 1e6
        out["sat_broker_us"] = meter.broker_cpu / trips * 1e6
        out["sat_total_us"] = out["sat_cpu_us"] + out["sat_echo_us"] + out["sat_broker_us"]
        out["sat_others"] = meter.others
        out["sat_load"] = meter.load

        if half_rate is not None:
            out |= await _open_loop(env, pinger, half_rate, echo.pid)
    finally:
        await pinger.close()
        echo.send_signal(signal.SIGTERM)
        await producer.stop()
        await consumer.stop()
        try:
            await asyncio.to_thread(echo.wait, 30)
        except subprocess.TimeoutExpired:
            echo.kill()
            echo.wait()
    return out


async def _open_loop(env: Env, pinger: Pinger, rate: float, echo: int) -> dict[str, float]:
    """Bursts of 1-20 commands on a fixed schedule averaging ``rate`` a second."""
    rng = random.Random(5)
    interval = 10.5 / rate
    tasks: list[asyncio.Task[list[float]]] = []
    meter = Meter(env.broker, echo)
    meter.start()
    began = time.perf_counter()
    k = 0
    while (due := began + k * interval) < began + env.seconds:
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        tasks.append(asyncio.create_task(pinger.burst(rng.randint(1, 20))))
        k += 1
    latencies = [x for batch in await asyncio.gather(*tasks) for x in batch]
    meter.stop()
    return {
        "half_rate": len(latencies) / env.seconds,
        "half_p50_ms": statistics.median(latencies) * 1e3,
        "half_p99_ms": _pct(latencies, 0.99) * 1e3,
        "half_total_us": (meter.own + meter.echo_cpu + meter.broker_cpu) / len(latencies) * 1e6,
        "half_others": meter.others,
    }


async def echo_main(variant_name: str, group: str, topics: dict[str, str]) -> None:
    """The echo process: answer each command with its outcome, commit after answering."""
    variant = VARIANTS[variant_name]
    servers = Settings().kafka_servers()
    workload = Workload.build()
    producer = await make_producer(variant, servers)
    consumer = await make_consumer(variant, servers, [topics["requests"]], group, "latest")
    committer = Committer(consumer)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    inflight: deque[tuple[asyncio.Task[None], list[Rec]]] = deque()
    parent = os.getppid()
    try:
        while not stopping.is_set() and os.getppid() == parent:  # not outliving the bench
            batch = await consumer.poll()
            if batch:
                replies = []
                for rec in batch:
                    _, value = workload.reply(rec[4] or b"{}")
                    replies.append((topics["replies"], rec[3] or b"", value))
                inflight.append((asyncio.create_task(producer.burst(replies)), batch))
            while inflight and inflight[0][0].done():
                task, handled = inflight.popleft()
                task.result()
                committer.done(handled)
            await committer.maybe()
        await asyncio.gather(*(t for t, _ in inflight))
        for _, handled in inflight:
            committer.done(handled)
        await committer.maybe(force=True)
    finally:
        await producer.stop()
        await consumer.stop()


# ---------------------------------------------------------------------------------------------
# The run.


async def _background(env: Env) -> dict[str, float]:
    """The broker's CPU (share of one core) over 2 s with none of our clients running: what
    other work on a shared broker adds to every per-record figure of the phases after."""
    meter = Meter(env.broker)
    meter.start()
    await asyncio.sleep(2.0)
    meter.stop()
    return {"broker_idle": meter.broker_cpu / meter.wall, "idle_others": meter.others}


async def _topics(servers: str, names: list[str], create: bool) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=servers)
    await admin.start()
    try:
        if create:
            await admin.create_topics([NewTopic(n, PARTITIONS, 1) for n in names])
        else:
            await admin.delete_topics(names)
    finally:
        await admin.close()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every repetition, every variant in alternating order; the raw numbers."""
    settings = Settings()
    servers = settings.kafka_servers()
    prefix = f"bench-kafka-clients.{os.getpid()}."
    main_task = asyncio.current_task()
    assert main_task is not None
    for signum in (signal.SIGTERM, signal.SIGINT):  # stop cleanly: echo stopped, topics deleted
        asyncio.get_running_loop().add_signal_handler(signum, main_task.cancel)
    topics = {name: prefix + name for name in ("produce", "consume", "requests", "replies")}
    names: list[str] = args.variants
    broker = infra_pids(settings).get("kafka")
    env = Env(servers, broker, topics, Workload.build(), args.seconds, args.variant)
    if env.broker is None:
        progress("no local broker pid: the broker's CPU is not measured")
    logs = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    raw: dict[str, Any] = {"reps": [], "topics": topics, "logs": str(logs)}
    await _topics(servers, list(topics.values()), create=True)
    try:
        progress(f"filling {args.records:,} records")
        await fill(env, args.records)
        half = args.half_rate
        if half is None:
            progress("calibrating: aiokafka-today's saturated ping-pong rate")
            calib = await pingpong_phase(env, names[0], None, f"{prefix}calib", logs)
            half = calib["sat_per_s"] / 2
        raw["half_rate"] = half
        for rep in range(args.reps):
            order = names if rep % 2 == 0 else names[::-1]
            results: dict[str, dict[str, float]] = {}
            for name in order:
                variant = VARIANTS[name]
                tag = f"{prefix}{rep}.{name}"
                progress(f"rep {rep + 1}/{args.reps} {name}; load {os.getloadavg()[0]:.2f}")
                row = await _background(env)
                row |= await produce_phase(env, variant)
                row |= await consume_phase(env, variant, args.records, f"{tag}.consume")
                row |= await pingpong_phase(env, name, half, tag, logs)
                results[name] = row
                progress(f"  {name}: " + ", ".join(f"{k}={v:.3g}" for k, v in row.items()))
            raw["reps"].append(results)
    finally:
        await _topics(servers, list(topics.values()), create=False)
    return raw


COLUMNS: list[tuple[str, str, str]] = [
    ("(a) produce", "produce_per_s", "records/s"),
    ("(a) produce", "produce_cpu_us", "client CPU µs/record"),
    ("(a) produce", "produce_broker_us", "broker CPU µs/record"),
    ("(a) produce", "produce_per_request", "records per produce request"),
    ("(b) ping-pong", "idle_p50_ms", "idle p50 ms"),
    ("(b) ping-pong", "idle_p99_ms", "idle p99 ms"),
    ("(b) ping-pong", "half_p50_ms", "half-load p50 ms"),
    ("(b) ping-pong", "half_p99_ms", "half-load p99 ms"),
    ("(b) ping-pong", "half_total_us", "half-load CPU µs/round trip (all 3 processes)"),
    ("(b) ping-pong", "sat_per_s", "saturated round trips/s"),
    ("(b) ping-pong", "sat_cpu_us", "saturated: requester CPU µs/round trip"),
    ("(b) ping-pong", "sat_echo_us", "saturated: echo CPU µs/round trip"),
    ("(b) ping-pong", "sat_broker_us", "saturated: broker CPU µs/round trip"),
    ("(b) ping-pong", "sat_total_us", "saturated: all 3 processes CPU µs/round trip"),
    ("(b) ping-pong", "sat_per_request", "saturated: records per produce request (requester)"),
    ("(c) consume-process-commit", "consume_per_s", "records/s"),
    ("(c) consume-process-commit", "consume_cpu_us", "client CPU µs/record"),
    ("(c) consume-process-commit", "consume_broker_us", "broker CPU µs/record"),
]


def render(raw: dict[str, Any], names: list[str]) -> str:
    """Medians over repetitions, and each variant's ratio to the first, pair by pair."""
    reps: list[dict[str, dict[str, float]]] = raw["reps"]
    base = names[0]
    lines = [
        f"{len(reps)} repetitions, alternating order; medians over them (min-max). Ratio: "
        f"to {base} in the same repetition, median of the pairs. Half load offered: "
        f"{raw['half_rate']:,.0f} round trips/s.",
        "",
    ]
    section = ""
    for sec, key, label in COLUMNS:
        if sec != section:
            section = sec
            lines += ["", f"**{sec}**", "", "| | " + " | ".join(names) + " |"]
            lines.append("|---" * (len(names) + 1) + "|")
        cells = []
        for name in names:
            values = [r[name][key] for r in reps if key in r[name]]
            if not values:
                cells.append("-")
                continue
            med = statistics.median(values)
            cell = f"{_fmt(med)} ({_fmt(min(values))}-{_fmt(max(values))})"
            if name != base:
                ratios = [r[name][key] / r[base][key] for r in reps if r[base].get(key)]
                cell += f" x{statistics.median(ratios):.2f}" if ratios else ""
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "**Noise**: the machine's busy CPU not ours (% of 2 cores, the most of any phase), the "
        "1-min load, and the broker's CPU with none of our clients running (% of a core, 2 s "
        "before the variant's phases: other users of a shared broker)",
        "",
    ]
    lines.append("| repetition | " + " | ".join(names) + " |")
    lines.append("|---" * (len(names) + 1) + "|")
    for i, r in enumerate(reps):
        cells = []
        for name in names:
            others = [r[name][k] for k in r[name] if k.endswith("_others")]
            cells.append(
                f"{max(others) * 100:.0f}%, load {r[name]['sat_load']:.2f}, "
                f"broker {r[name]['broker_idle'] * 100:.0f}%"
            )
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.2f}" if x < 10 else f"{x:.1f}"


def _versions() -> str:
    import aiokafka

    parts = [f"aiokafka {aiokafka.__version__}"]
    try:
        import confluent_kafka

        parts.append(f"confluent-kafka {confluent_kafka.__version__}")
        parts.append(f"librdkafka {confluent_kafka.libversion()[0]}")
    except ImportError:
        parts.append("confluent-kafka not installed (pip install -e '.[bench]')")
    return ", ".join(parts)


def _run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` as toolfleet's services run: on uvloop, with their garbage-collector
    tuning (``toolfleet.app.service``)."""
    tune_gc(Settings().gc_thresholds)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def main() -> None:
    """Parse the arguments; run the bench or, with ``--echo``, be its echo process."""
    parser = argparse.ArgumentParser(prog="python -m bench.kafka_clients", description=__doc__)
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=BASE,SIDE.KEY=VALUE,...",
        help="define a variant from another (SIDE: producer or consumer; the client's own "
        "option names); repeatable",
    )
    parser.add_argument("--variants", type=lambda s: s.split(","), default=None)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each timed phase")
    parser.add_argument("--records", type=int, default=200_000, help="records (c) reads")
    parser.add_argument("--half-rate", type=float, default=None, help="round trips/s offered")
    parser.add_argument("--json", type=Path, default=None, help="write the raw numbers here")
    parser.add_argument("--echo", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--echo-group", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--echo-topics", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    defined = [define(spec) for spec in args.variant]
    if args.variants is None:
        args.variants = [*BUILT_IN, *defined]
    if args.echo is not None:
        _run(echo_main(args.echo, args.echo_group, json.loads(args.echo_topics)))
        return
    unknown = [n for n in args.variants if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    began = dt.datetime.now(dt.UTC)
    raw = _run(run(args))
    if args.json is not None:
        args.json.write_text(json.dumps(raw, indent=1))
    workload = Workload.build()
    small, mean, large = workload.sizes()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"{began:%Y-%m-%d %H:%M} UTC, commit {commit}, {psutil.cpu_count()} cores, {_versions()}")
    print(
        f"Commands {small}-{large} bytes (mean {mean}), outcomes {len(workload.outcome)} bytes, "
        f"keyed by run id; {PARTITIONS} partitions; {args.seconds:.0f} s phases, "
        f"{args.records:,} records in (c).\n"
    )
    print(render(raw, args.variants))
    print("\n**Settings** (beside bootstrap servers, group id and offset reset)\n")
    for name in args.variants:
        v = VARIANTS[name]
        print(f"- {name} ({v.client}): producer {json.dumps(v.producer)}; "
              f"consumer {json.dumps(v.consumer)}")  # fmt: skip


if __name__ == "__main__":
    main()
