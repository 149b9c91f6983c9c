"""Chaos: 1,000 calls while one of two workers is SIGKILLed every few seconds and restarted,
and a fifth of the charges lose their response the way real HTTP clients do (a refused
connection before the request left; a read timeout, a reset or a 502 after the charge)."""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from schemas import TurnResult
from tests.integration.test_pipeline import turn
from tests.integration.upstream_tools import applies_key
from toolfleet.client import FleetClient
from toolfleet.keys import Keys
from toolfleet.ledger import Ledger
from toolfleet.settings import Settings
from toolfleet.tasks import TaskStore
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = pytest.mark.integration

# The default suite runs 1,000 calls; `make chaos` 3,000 (TOOLFLEET_CHAOS_TURNS=600).
TURNS, CALLS_PER_TURN = int(os.environ.get("TOOLFLEET_CHAOS_TURNS", "200")), 5
KILL_EVERY_S = 4.0
KILLS = int(os.environ.get("TOOLFLEET_CHAOS_KILLS", str(max(5, TURNS // 40))))
SUBMIT_EVERY_S = 0.1  # spreads the load over the kill period
ENV = {
    "TOOLFLEET_SESSION_TIMEOUT_MS": "6000",
    "TOOLFLEET_RECOVERY_PROBE_BACKOFF_S": "0.2",
    "TOOLFLEET_RECOVERY_REPORT_AFTER_S": "1",
    "TOOLFLEET_CIRCUIT_MIN_CALLS": str(10**9),  # crashes are not the tool's fault
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

    killer = asyncio.create_task(kill_worker_1_repeatedly())
    try:
        await submit_and_wait()
    finally:
        killer.cancel()

    ledger = Ledger(redis, keys)
    tasks = {t.task.call_id: t for t in await TaskStore(redis, keys).all() if t.task.call_id}
    counts: Counter[str] = Counter()
    for event in events:
        result = done[event.run_id]
        assert result.status == "completed", result
        records = {c.call_id: c for c in result.calls}
        entries = await ledger.read(event.tenant_id, records)
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
    print(f"\n{kills} kills; {len(done)}/{TURNS} turns with a TurnResult; calls: {dict(counts)}")
    assert len(done) == TURNS
    assert sum(counts.values()) == TURNS * CALLS_PER_TURN
    assert kills == KILLS
