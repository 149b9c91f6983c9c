"""Fair scheduling between tenants on a real fleet: two planners, two workers.

A call waits for admission in Redis, not in a Kafka partition: a flooding tenant's backlog
never sits in front of another tenant's call, and backlogged tenants share the fleet by
weight. Every test uses tenants of its own (admission state is fleet-wide).
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from kernel.settings import Settings
from kernel.stores.admission import Admission, Limits
from kernel.stores.keys import Keys
from schemas import ModelResponseEvent
from tests.integration.fair_tools import runs_key, starts_key
from tests.integration.test_pipeline import turn
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = pytest.mark.integration

TOOLS = "tests.integration.fair_tools:tools"
SLOTS_PER_WORKER = 10
TOOL_MS = 50


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    args = ["--concurrency", str(SLOTS_PER_WORKER)]
    with LocalFleet(settings, tools=TOOLS, workers=2, worker_args=args) as running:
        running.start("planner-2", ["planner"])
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


def _turn(tenant: str, calls: int, tool: str = "work") -> ModelResponseEvent:
    event = turn(*((f"c{i}", tool, {"ms": TOOL_MS}) for i in range(calls)))
    return event.model_copy(update={"tenant_id": tenant})


async def _latency(fleet: LocalFleet, client: FleetClient, tenant: str) -> float:
    event = _turn(tenant, 1)
    began = time.perf_counter()
    await client.submit(event)
    result = await result_of(fleet, client, event.run_id, within=120)
    assert result.status == "completed"
    return time.perf_counter() - began


async def test_a_light_tenant_is_not_stuck_behind_a_flood(
    fleet: LocalFleet, client: FleetClient
) -> None:
    tag = uuid.uuid4().hex[:6]
    light, flood = f"light-{tag}", f"flood-{tag}"
    idle = statistics.median([await _latency(fleet, client, light) for _ in range(5)])
    floods = [_turn(flood, 10) for _ in range(300)]  # 3,000 calls of 50 ms
    await asyncio.gather(*(client.submit(e) for e in floods))
    await asyncio.sleep(1.0)  # wait-ok: the scenario, the light turn comes 1 s later
    loaded = await _latency(fleet, client, light)
    print(f"light tenant: idle {idle * 1000:.0f} ms, during the flood {loaded * 1000:.0f} ms")
    results = [await result_of(fleet, client, e.run_id, within=180) for e in floods]
    assert {r.status for r in results} == {"completed"}
    assert loaded <= 2 * idle


async def test_backlogged_tenants_share_the_fleet_by_weight(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    tag = uuid.uuid4().hex[:6]
    one, three = f"w1-{tag}", f"w3-{tag}"
    admission = Admission(redis, keys)
    await admission.set_limits("tenants", one, Limits(weight=1))
    await admission.set_limits("tenants", three, Limits(weight=3))
    events = [_turn(t, 10) for _ in range(80) for t in (one, three)]  # 800 calls each
    await asyncio.gather(*(client.submit(e) for e in events))
    results = [await result_of(fleet, client, e.run_id, within=180) for e in events]
    assert {r.status for r in results} == {"completed"}
    # While both had calls waiting (until the heavier one ran out), starts went 1:3.
    ends = [float(s) for _, s in await redis.zrange(starts_key(three), -1, -1, withscores=True)]
    both_busy_until = ends[0]
    counts = {t: await redis.zcount(starts_key(t), "-inf", both_busy_until) for t in (one, three)}
    print(f"starts while both were backlogged: {counts}")
    assert counts[three] / counts[one] == pytest.approx(3, rel=0.1)


async def test_a_planner_killed_while_calls_wait_loses_and_repeats_none(
    fleet: LocalFleet, client: FleetClient, redis: Redis
) -> None:
    tenant = f"kill-{uuid.uuid4().hex[:6]}"
    events = [_turn(tenant, 10) for _ in range(40)]  # 400 calls: 1 s of backlog
    await asyncio.gather(*(client.submit(e) for e in events))
    fleet.kill("planner")  # mid-backlog; planner-2 takes its partitions over
    fleet.start("planner", ["planner"])
    results = [await result_of(fleet, client, e.run_id, within=180) for e in events]
    assert {r.status for r in results} == {"completed"}
    call_ids = [c.call_id for e in events for c in e.function_calls]
    runs = [int(await redis.get(runs_key(cid)) or 0) for cid in call_ids]
    assert runs == [1] * len(call_ids)
