"""Warm the broker's JVM before the first measured row.

A Kafka broker just started interprets its request paths and compiles them as traffic comes.
An idle broker is quiet (``Bench.quiet_broker``) but still cold, and the first system measured
(toolfleet) paid for compiling the paths that every later system then found compiled: on this
project's 2-core machine, ``--quick --only a --systems toolfleet`` right after a broker start
measured 692 and 770 calls/s for the 1-call rows, against 1,081 and 1,018 after this warm-up
(the broker's CPU per send below: about 8,000-14,000 µs in the first two seconds of traffic,
400-800 once compiled, after 40-90 s).

So before any row, rounds of the requests the systems make (idempotent sends awaited one by
one, a read_committed consumer committing what it reads, and transactions carrying a record
and consumer offsets, as toolfleet's aggregator commits them) run until the JVM's JIT
compiler threads have been quiet for two rounds. A broker already warm settles in two rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.procs import cpu_seconds
from kernel.adapters.security import kafka_options
from kernel.settings import Settings

ROUND_S = 2.0
"""One measured round of traffic."""

COMPILING = 0.03
"""Settled: the JVM's JIT compiler threads used less than this share of a core in each of
the last ``QUIET_ROUNDS`` rounds (the request paths are compiled; what a request costs
still varies by ±30% from round to round on this machine, too much to settle on)."""

QUIET_ROUNDS = 2
"""Rounds in a row with the compiler quiet."""

WITHIN_S = 120.0
"""The warm-up gives up (and the report says so) after this long."""

_PAYLOAD = b"x" * 300
_PARTITIONS = 6
_TICKS = os.sysconf("SC_CLK_TCK")
_TRANSACTION_EVERY = 10
"""One send in ten goes through a transaction."""


@dataclass(frozen=True)
class Warmup:
    """What the warm-up saw."""

    rounds_us: list[float]
    """The broker's CPU per send in each round, in µs."""
    seconds: float
    settled: bool
    """Whether the compiler went quiet before ``WITHIN_S``."""


async def warm_broker(settings: Settings, kafka_pid: int) -> Warmup:
    """Drive the broker until its JIT compiler has been quiet for ``QUIET_ROUNDS`` rounds."""
    options = kafka_options(settings)
    topic = f"{settings.topic_prefix}warmup-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(**options, acks="all", enable_idempotence=True)
    transactional = AIOKafkaProducer(
        **options, transactional_id=topic, acks="all", enable_idempotence=True
    )
    consumer = AIOKafkaConsumer(
        topic,
        **options,
        group_id=topic,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
    )
    async with contextlib.AsyncExitStack() as stack:
        # Its transactions' produce retries (the broker's transaction verification, KIP-890,
        # answers NOT_ENOUGH_REPLICAS until the previous transaction completes: see the
        # README) would fill the bench's progress with hundreds of warnings.
        sender = logging.getLogger("aiokafka.producer.sender")
        stack.callback(sender.setLevel, sender.level)
        sender.setLevel(logging.ERROR)
        admin = AIOKafkaAdminClient(**options)
        await admin.start()
        stack.push_async_callback(admin.close)
        await admin.create_topics([NewTopic(topic, _PARTITIONS, 1)])
        stack.push_async_callback(admin.delete_topics, [topic])
        for client in (producer, transactional, consumer):
            await client.start()
            stack.push_async_callback(client.stop)
        for partition in range(_PARTITIONS):  # every leader elected before a round counts
            await producer.send_and_wait(topic, _PAYLOAD, partition=partition)
        reader = asyncio.create_task(_read(consumer))
        stack.callback(reader.cancel)
        warmup = await _rounds(topic, producer, transactional, kafka_pid)
    return warmup


async def _rounds(
    topic: str,
    producer: AIOKafkaProducer,
    transactional: AIOKafkaProducer,
    kafka_pid: int,
) -> Warmup:
    began = time.monotonic()
    costs: list[float] = []
    compiling: list[float] = []
    while time.monotonic() - began < WITHIN_S:
        used, round_began, sends = cpu_seconds(kafka_pid), time.monotonic(), 0
        compiled = _compiler_seconds(kafka_pid)
        while time.monotonic() - round_began < ROUND_S:
            key = str(sends).encode()
            if sends % _TRANSACTION_EVERY:
                await producer.send_and_wait(topic, _PAYLOAD, key=key)
            else:
                async with transactional.transaction():
                    await transactional.send(topic, _PAYLOAD, key=key)
                    # A group of its own (with no members, the broker takes offsets from any
                    # transaction); the path is the aggregator's.
                    offsets = {TopicPartition(topic, 0): sends}
                    await transactional.send_offsets_to_transaction(offsets, f"{topic}-txn")
            sends += 1
        elapsed = time.monotonic() - round_began
        costs.append((cpu_seconds(kafka_pid) - used) / sends * 1e6)
        compiling.append((_compiler_seconds(kafka_pid) - compiled) / elapsed)
        if len(compiling) >= QUIET_ROUNDS and max(compiling[-QUIET_ROUNDS:]) < COMPILING:
            return Warmup(costs, time.monotonic() - began, settled=True)
    return Warmup(costs, time.monotonic() - began, settled=False)


def _compiler_seconds(pid: int) -> float:
    """CPU seconds of the JVM's JIT compiler threads (Linux: their names in /proc)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if not (task / "comm").read_text().startswith(("C1 Compiler", "C2 Compiler")):
                continue
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICKS
    return total


async def _read(consumer: AIOKafkaConsumer) -> None:
    """Fetch what the rounds send, committing as the services do (read_committed)."""
    while True:
        if await consumer.getmany(timeout_ms=100):
            await consumer.commit()
