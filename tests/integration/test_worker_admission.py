"""Workers free their calls' admission slots and admit what waits: a real fleet, two workers.

The worker that ends an admitted call frees its tenant's, tool's and pool's counts in the
same burst as the call's end in the ledger, and that pass admits the calls waiting for the
capacity (onto the freeing worker's own slots first). So queued calls run with no planner
alive, a worker killed while it holds admitted commands leaks no slot, and a call is
admitted and freed once however often its command or outcome is delivered.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from kernel.adapters.bus import KafkaBus
from kernel.adapters.redis import text
from kernel.settings import Settings
from kernel.stores.admission import SEP, Admission, Limits
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger
from schemas import ModelResponseEvent
from tests.conftest import wait_for
from tests.integration.fair_tools import runs_key, starts_key
from tests.integration.side_effects import in_flight_keys
from tests.integration.test_pipeline import turn
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = [pytest.mark.integration, pytest.mark.long_scenario]

TOOLS = "tests.integration.fair_tools:tools"
SLOTS = 5
LEASE_S = 3


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    args = ["--concurrency", str(SLOTS), "--lease-s", str(LEASE_S)]
    env = {"TOOLFLEET_WORKER_CAPACITY_TTL_S": "3"}
    with LocalFleet(settings, tools=TOOLS, workers=2, worker_args=args, extra_env=env) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


def _turn(tenant: str, calls: int, ms: int) -> ModelResponseEvent:
    event = turn(*((f"c{i}", "work", {"ms": ms}) for i in range(calls)))
    return event.model_copy(update={"tenant_id": tenant})


async def _counts(redis: Redis, keys: Keys) -> dict[str, int]:
    raw = await redis.hgetall(keys.admission("running"))
    return {text(k): int(v) for k, v in raw.items()}


async def _freed(redis: Redis, keys: Keys, tenant: str) -> bool:
    counts = await _counts(redis, keys)
    return counts.get(f"t:{tenant}", 0) == 0


async def test_queued_calls_run_with_no_planner_alive(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    tenant = f"alone-{uuid.uuid4().hex[:6]}"
    await Admission(redis, keys).set_limits("tenants", tenant, Limits(max_concurrency=1))
    event = _turn(tenant, 5, ms=300)
    await client.submit(event)

    async def first_started() -> bool:
        return await redis.zcard(starts_key(tenant)) >= 1

    await wait_for(first_started)
    assert fleet.terminate("planner") == 0  # the turn's 5 calls are queued: 1 running, 4 waiting
    try:
        result = await client.result(event.run_id, 0, within=60)  # the planner is gone
        assert result.status == "completed"
        assert [c.status for c in result.calls] == ["succeeded"] * 5
        assert int(await redis.get(in_flight_keys(tenant)[1]) or 0) == 1  # the quota held
        calls = [c.call_id for c in event.function_calls]
        assert [int(await redis.get(runs_key(c)) or 0) for c in calls] == [1] * 5
        await wait_for(lambda: _freed(redis, keys, tenant))
    finally:
        fleet.start("planner", ["planner"])


async def test_a_worker_killed_with_admitted_commands_leaks_no_slot(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    tenant = f"killed-{uuid.uuid4().hex[:6]}"
    # 40 calls of 1 s on 10 slots: after the first fill, each freed slot is given to a waiting
    # call by the freeing worker's pass, most of them onto its own slots.
    events = [_turn(tenant, 4, ms=1000) for _ in range(10)]
    for event in events:
        await client.submit(event)

    async def second_wave() -> bool:
        return await redis.zcard(starts_key(tenant)) > 2 * SLOTS

    await wait_for(second_wave)
    fleet.kill("worker-0")
    try:
        results = [await client.result(e.run_id, 0, within=120) for e in events]
        assert all(r.status == "completed" for r in results)
        # Calls the dead worker was running are reported lost by the reconciler (at most its
        # slots); the commands it held and had not started went to worker-1 and ran there.
        calls = [c for r in results for c in r.calls]
        lost = [c for c in calls if c.error is not None and c.error.type == "WorkerLost"]
        assert len(lost) <= SLOTS
        assert all(c.status == "succeeded" for c in calls if c not in lost)
        ids = [c.call_id for e in events for c in e.function_calls]
        assert max([int(await redis.get(runs_key(c)) or 0) for c in ids]) == 1

        async def nothing_held() -> bool:
            counts = await _counts(redis, keys)
            capacity = await Admission(redis, keys).pool_capacity(time.time())
            return (
                counts.get(f"t:{tenant}", 0) == 0
                and counts.get("p:default", 0) == 0
                and capacity.get("default") == SLOTS  # the dead worker's slots left the pool
            )

        await wait_for(nothing_held, within=60)
    finally:
        fleet.start_worker(0)
        await fleet.ready(within=60)


async def test_a_call_is_admitted_and_freed_once_under_duplicate_outcomes(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys, bus: KafkaBus
) -> None:
    tenant = f"dup-{uuid.uuid4().hex[:6]}"
    admission = Admission(redis, keys)
    await admission.set_limits("tenants", tenant, Limits(max_concurrency=2))
    first = _turn(tenant, 4, ms=100)
    await client.submit(first)
    result = await result_of(fleet, client, first.run_id, within=60)
    assert result.status == "completed"
    await wait_for(lambda: _freed(redis, keys, tenant))
    # An earlier release's worker says "admitted": a planner frees the member again. It was
    # freed already: nothing moves (a second free would let the quota admit a third call).
    calls = [c.call_id for c in first.function_calls]
    for entry in (await Ledger(redis, keys).read(tenant, first.run_id, calls)).values():
        assert entry.outcome is not None and not entry.outcome.admitted  # its worker freed it
        again = entry.outcome.model_copy(update={"admitted": True})
        await bus.publish_and_wait("outcomes", first.run_id, again)
    second = _turn(tenant, 6, ms=300)
    await client.submit(second)
    assert (await result_of(fleet, client, second.run_id, within=60)).status == "completed"
    assert int(await redis.get(in_flight_keys(tenant)[1]) or 0) == 2
    await wait_for(lambda: _freed(redis, keys, tenant))
    counts = await _counts(redis, keys)
    assert counts.get(f"admitted:{tenant}") == 10  # each call admitted once
    held = [m async for m in redis.hscan_iter(keys.admission("info"), match=f"{tenant}{SEP}*")]
    assert held == []
