"""Limits that hold fleet-wide: three workers and two planners, a per-tool rate limit and a
tenant quota, set live as an operator would."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from kernel.settings import Settings
from kernel.stores.admission import Admission, Limits
from kernel.stores.keys import Keys
from tests.conftest import wait_for
from tests.integration.fair_tools import starts_key
from tests.integration.side_effects import in_flight_keys
from tests.integration.test_fairness import fair_turn
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = [pytest.mark.integration, pytest.mark.long_scenario]

TOOLS = "tests.integration.fair_tools:tools"
RATE = 50
QUOTA = 10
QUOTA_BODY_MS = 500


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    with LocalFleet(settings, tools=TOOLS, workers=3, worker_args=["--concurrency", "20"]) as f:
        f.start("planner-2", ["planner"])
        yield f


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


async def test_a_tool_rate_limit_is_never_exceeded_in_any_second(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    tenant = f"rate-{uuid.uuid4().hex[:6]}"
    admission = Admission(redis, keys)
    await admission.set_limits("tools", "limited", Limits(rate=RATE))
    try:
        events = [fair_turn(tenant, 10, "limited") for _ in range(25)]  # 250 calls: 5 s and more
        await asyncio.gather(*(client.submit(e) for e in events))
        results = [await result_of(fleet, client, e.run_id, within=120) for e in events]
    finally:
        await admission.set_limits("tools", "limited", Limits())
    assert {r.status for r in results} == {"completed"}
    starts = sorted(s for _, s in await redis.zrange(starts_key(tenant), 0, -1, withscores=True))
    busiest = max(sum(1 for t in starts[i:] if t < first + 1.0) for i, first in enumerate(starts))
    span = starts[-1] - starts[0]
    print(f"{len(starts)} calls over {span:.1f} s; at most {busiest} in any 1 s window")
    assert len(starts) == 250
    assert busiest <= RATE


async def test_calls_admitted_apart_that_reach_their_workers_together_start_at_the_rate(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    """Admission spaces a rate-limited tool's calls; the time from admission to start varies.
    Workers that stall while admission goes on get what it admitted all at once: their starts
    still keep to the rate, which holds where the upstream sees it."""
    tenant = f"burst-{uuid.uuid4().hex[:6]}"
    admission = Admission(redis, keys)
    await admission.set_limits("tools", "limited", Limits(rate=RATE))
    workers = [f"worker-{n}" for n in range(fleet.workers)]
    slots = 20 * len(workers)  # every slot of the pool: more than one second's worth

    async def every_worker_counts() -> bool:
        return (await admission.pool_capacity(time.time())).get("default") == slots

    await wait_for(every_worker_counts, within=60)
    try:
        for name in workers:
            os.kill(fleet.pid(name), signal.SIGSTOP)
        try:
            events = [fair_turn(tenant, 10, "limited") for _ in range(slots // 10)]
            await asyncio.gather(*(client.submit(e) for e in events))

            async def all_admitted() -> bool:
                running = await redis.hget(keys.admission("running"), f"t:{tenant}")
                return int(running or 0) == slots

            await wait_for(all_admitted, within=30)  # at the rate, over more than a second
        finally:
            for name in workers:
                os.kill(fleet.pid(name), signal.SIGCONT)
        results = [await result_of(fleet, client, e.run_id, within=120) for e in events]
    finally:
        await admission.set_limits("tools", "limited", Limits())
    assert {r.status for r in results} == {"completed"}
    starts = sorted(s for _, s in await redis.zrange(starts_key(tenant), 0, -1, withscores=True))
    busiest = max(sum(1 for t in starts[i:] if t < first + 1.0) for i, first in enumerate(starts))
    print(f"{len(starts)} calls delivered at once; at most {busiest} started in any 1 s window")
    assert len(starts) == slots
    assert busiest <= RATE


async def test_a_tenant_quota_is_never_exceeded(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    tenant = f"quota-{uuid.uuid4().hex[:6]}"
    admission = Admission(redis, keys)
    await admission.set_limits("tenants", tenant, Limits(max_concurrency=QUOTA))
    # Bodies long against the hops around them (dispatch, a worker's fetch, the outcome's
    # way back): a quota's slots are held from admission to release, so with short bodies
    # the slots are full while fewer bodies than the quota overlap, and "reached" would
    # measure scheduling jitter instead of the quota.
    events = [fair_turn(tenant, 10, ms=QUOTA_BODY_MS) for _ in range(6)]  # 60 calls, 10 slots
    await asyncio.gather(*(client.submit(e) for e in events))
    results = [await result_of(fleet, client, e.run_id, within=120) for e in events]
    assert {r.status for r in results} == {"completed"}
    peak = int(await redis.get(in_flight_keys(tenant)[1]) or 0)
    print(f"tenant quota {QUOTA}: peak {peak} in flight")
    assert peak == QUOTA  # reached, never exceeded


async def test_an_http_429_slows_the_tools_rate_buckets(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    tenant = f"429-{uuid.uuid4().hex[:6]}"
    admission = Admission(redis, keys)
    await admission.set_limits("tools", "rate_limited", Limits(rate=RATE, tenant_rate=RATE))
    try:
        await client.submit(fair_turn(tenant, 1, "rate_limited"))

        async def slowed() -> bool:
            count = await redis.hget(keys.admission("stats"), "throttled:o:rate_limited")
            return int(count or 0) >= 1

        await wait_for(slowed, within=60)
        bucket = await redis.hget(keys.admission("buckets"), "o:rate_limited")
        factor = float((bucket or b"0,0,1").decode().split(",")[2])
        assert factor <= 0.5  # halved (and recovering over RECOVERY_S)
    finally:
        await admission.set_limits("tools", "rate_limited", Limits())
