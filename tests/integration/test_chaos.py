"""Chaos: 1,000 calls while one of two workers is SIGKILLed every few seconds and restarted,
and a fifth of the charges lose their response the way real HTTP clients do (a refused
connection before the request left; a read timeout, a reset or a 502 after the charge)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.asyncio import Redis

from kernel.errors import InfrastructureError
from kernel.settings import Settings
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger
from kernel.stores.tasks import TaskStore
from schemas import ModelResponseEvent, TurnResult
from tests.conftest import wait_for
from tests.integration.test_pipeline import turn
from tests.integration.upstream_tools import applies_key
from toolfleet.app import infra
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = pytest.mark.integration

# The default suite runs 1,000 calls; `make chaos` 3,000 (TOOLFLEET_CHAOS_TURNS=600).
TURNS, CALLS_PER_TURN = int(os.environ.get("TOOLFLEET_CHAOS_TURNS", "200")), 5
KILL_EVERY_S = 4.0
KILLS = int(os.environ.get("TOOLFLEET_CHAOS_KILLS", str(max(5, TURNS // 40))))
# `make chaos` also SIGKILLs the broker once and redis-server once (the local infrastructure
# of `toolfleet infra up`), and restarts each: Redis from its fsynced append-only file.
INFRA_KILLS = os.environ.get("TOOLFLEET_CHAOS_INFRA_KILLS") == "1"
SUBMIT_EVERY_S = 0.1  # spreads the load over the kill period
ENV = {
    "TOOLFLEET_SESSION_TIMEOUT_MS": "6000",
    "TOOLFLEET_RECOVERY_PROBE_BACKOFF_S": "0.2",
    "TOOLFLEET_RECOVERY_REPORT_AFTER_S": "1",
    "TOOLFLEET_CIRCUIT_MIN_CALLS": str(10**9),  # crashes are not the tool's fault
    "TOOLFLEET_CUT_OFF_AFTER_S": "90",  # a restarting broker is an outage for everyone
}


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    with LocalFleet(
        settings,
        tools="tests.integration.upstream_tools:tools",
        workers=2,
        worker_args=["--lease-s", "2"],
        extra_env=ENV,
    ) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


@pytest.mark.timeout(1800)
async def test_every_call_applies_exactly_once_or_waits_for_a_human_while_workers_die(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    rng = random.Random(11)
    losses = ["none"] * 16 + ["refused", "timeout", "reset", "http_502"]
    events = [
        turn(*((f"c{i}", "charge_card", {"amount": i, "before_ms": rng.randint(0, 150),
                                         "after_ms": rng.randint(0, 150),
                                         "lose": rng.choice(losses)})
               for i in range(CALLS_PER_TURN)))
        for _ in range(TURNS)
    ]  # fmt: skip
    done: dict[str, TurnResult] = {}

    async def submit_and_wait() -> None:
        for event in events:
            await client.submit(event)
            await asyncio.sleep(SUBMIT_EVERY_S)  # wait-ok: paces the load over the kill period
        for event in events:
            done[event.run_id] = await result_of(fleet, client, event.run_id, within=600)

    kills = 0

    async def kill_worker_1_repeatedly() -> None:
        nonlocal kills
        # A fixed schedule: a fleet killed faster than its group session expires never
        # rebalances, so the chaos stops and recovery is measured after it.
        while kills < KILLS:
            await asyncio.sleep(KILL_EVERY_S)  # wait-ok: the chaos schedule itself
            fleet.kill("worker-1")
            fleet.start_worker(1)
            kills += 1

    infra_killed: list[str] = []
    killer = asyncio.create_task(kill_worker_1_repeatedly())
    infra_killer = asyncio.create_task(_kill_infra_once(infra_killed)) if INFRA_KILLS else None
    try:
        await submit_and_wait()
        if infra_killer is not None:
            await infra_killer
    finally:
        killer.cancel()
        if infra_killer is not None:
            infra_killer.cancel()

    counts = await _tally(events, done, redis, keys)
    results_per_turn = await _turn_results_per_run(client.settings, {e.run_id for e in events})
    duplicates = sum(n for label, n in counts.items() if "charged 2" in label)
    assert len(results_per_turn) == TURNS, "a turn got no TurnResult"
    assert set(results_per_turn.values()) == {1}, "a turn got more than one TurnResult"
    print(
        f"\nchaos {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {TURNS * CALLS_PER_TURN} "
        f"calls, {kills} worker SIGKILLs, infrastructure SIGKILLed: {infra_killed or 'none'}; "
        f"{len(done)}/{TURNS} turns with exactly one TurnResult; {duplicates} duplicate "
        f"effects; calls: {dict(counts)}"
    )
    assert len(infra_killed) == (2 if INFRA_KILLS else 0)
    assert len(done) == TURNS
    assert sum(counts.values()) == TURNS * CALLS_PER_TURN
    assert kills == KILLS


async def _kill_infra_once(killed: list[str]) -> None:
    """SIGKILL redis-server, then the broker, of the local infrastructure, restarting each."""
    local = Settings()  # the infrastructure `toolfleet infra up` runs
    status = infra.status(local)
    if status.kafka.pid is None or status.redis.pid is None:
        pytest.fail("TOOLFLEET_CHAOS_INFRA_KILLS needs the local `toolfleet infra up`")
    for name, pid in (("redis-server", status.redis.pid), ("kafka", status.kafka.pid)):
        await asyncio.sleep(2 * KILL_EVERY_S)  # wait-ok: the chaos schedule itself
        os.kill(pid, signal.SIGKILL)
        killed.append(name)
        await wait_for(lambda: _restarted(local), within=90)


async def _restarted(local: Settings) -> bool:
    """Start the killed service again; False while its port is not free yet."""
    try:
        await asyncio.to_thread(infra.up, local)  # waits until it answers
    except InfrastructureError:
        return False
    return True


async def _tally(
    events: list[ModelResponseEvent], done: dict[str, TurnResult], redis: Redis, keys: Keys
) -> Counter[str]:
    """What became of every call, checked against the upstream's own count of charges."""
    ledger = Ledger(redis, keys)
    tasks = {t.task.call_id: t for t in await TaskStore(redis, keys).all() if t.task.call_id}
    counts: Counter[str] = Counter()
    for event in events:
        result = done[event.run_id]
        assert result.status == "completed", result
        records = {c.call_id: c for c in result.calls}
        entries = await ledger.read(event.tenant_id, event.run_id, records)
        for call_id, record in records.items():
            applies = int(await redis.get(applies_key(entries[call_id].idempotency_key)) or 0)
            assert applies <= 1, f"{call_id} was charged {applies} times"
            if call_id in tasks:
                assert tasks[call_id].task.reason
                counts[f"human task (charged {applies})"] += 1
                continue
            if record.effect == "not_executed":
                # Only a request that provably never left may say so: it charged nothing.
                assert applies == 0, f"{call_id} is recorded not_executed but was charged"
                counts["not executed (never left)"] += 1
                continue
            assert (record.effect, applies) == ("applied", 1), (call_id, record)
            ledger_outcome = entries[call_id].outcome
            source = ledger_outcome.source if ledger_outcome else "?"
            counts["applied once" + (" (resolved by probe)" if source == "reconciler" else "")] += 1
    return counts


async def _turn_results_per_run(settings: Settings, runs: set[str]) -> Counter[str]:
    """How many TurnResults each of ``runs`` got on turn-results (each turn is one run),
    reading every partition from its start to its end offset."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_servers(), enable_auto_commit=False,
        isolation_level="read_committed",
    )  # fmt: skip
    await consumer.start()
    seen: Counter[str] = Counter()
    try:
        topic = settings.topic("turn-results")
        partitions = [TopicPartition(topic, p) for p in range(settings.partitions)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)

        async def read_to_end() -> bool:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    run_id = json.loads(record.value or b"{}").get("run_id")
                    if run_id in runs:
                        seen[run_id] += 1
            return all([await consumer.position(tp) >= ends[tp] for tp in partitions])

        await wait_for(read_to_end, within=60)
    finally:
        await consumer.stop()
    return seen
