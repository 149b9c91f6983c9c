"""Fair scheduling between tenants on a real fleet: two planners, two workers.

A call waits for admission in Redis, not in a Kafka partition: a flooding tenant's backlog
never sits in front of another tenant's call, and backlogged tenants share the fleet by
weight. Every test uses tenants of its own (admission state is fleet-wide). Bench (h)
(``python -m bench.fairness``) measures the light tenant's latency percentiles beside a
flood; here the test holds its median within 2x of its idle median, and checks the order
calls started in.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from kernel.rules.texts import NEVER_STARTED_DEADLINE
from kernel.settings import Settings
from kernel.stores.admission import Admission, Limits
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger
from schemas import CancelRequest, ModelResponseEvent
from tests.conftest import wait_for
from tests.integration.fair_tools import runs_key, starts_key
from tests.integration.test_pipeline import turn
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = [pytest.mark.integration, pytest.mark.long_scenario]

TOOLS = "tests.integration.fair_tools:tools"
SLOTS_PER_WORKER = 2
"""Every slot of the fleet is busy while a flood drains (80 calls/s), and the 2-core test
machine, which also runs Kafka, Redis and six service processes, keeps CPU to spare: the
light tenant's latency then shows the scheduling, not the test machine's CPU contention.
With 4 slots a worker the machine runs at about 90% CPU and the ratio swings 1.3-2.7x."""
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


def fair_turn(tenant: str, calls: int, tool: str = "work", ms: int = TOOL_MS) -> ModelResponseEvent:
    """A turn of ``calls`` calls of ``tool`` for ``tenant``, each holding ``ms``."""
    event = turn(*((f"c{i}", tool, {"ms": ms}) for i in range(calls)))
    return event.model_copy(update={"tenant_id": tenant})


async def turn_latency(fleet: LocalFleet, client: FleetClient, tenant: str) -> float:
    """Seconds from submitting a one-call turn of ``tenant`` to reading its result (the hops
    are printed: to start, body, to result)."""
    event = fair_turn(tenant, 1)
    began, wall = time.perf_counter(), time.time()
    await client.submit(event)
    result = await result_of(fleet, client, event.run_id, within=120)
    assert result.status == "completed"
    took = time.perf_counter() - began
    call = result.calls[0]
    assert call.status == "succeeded"
    print(
        f"  to start {((call.started_at or 0) - wall) * 1000:.0f} ms, body "
        f"{((call.finished_at or 0) - (call.started_at or 0)) * 1000:.0f} ms, to result "
        f"{(wall + took - (call.finished_at or 0)) * 1000:.0f} ms"
    )
    return took


async def test_a_light_tenant_is_not_stuck_behind_a_flood(
    fleet: LocalFleet, client: FleetClient, redis: Redis
) -> None:
    tag = uuid.uuid4().hex[:6]
    light, flood = f"light-{tag}", f"flood-{tag}"
    idle = statistics.median([await turn_latency(fleet, client, light) for _ in range(5)])
    floods = [fair_turn(flood, 30) for _ in range(100)]  # 3,000 calls of 50 ms: 38 s on 4 slots
    await asyncio.gather(*(client.submit(e) for e in floods))
    await asyncio.sleep(1.0)  # wait-ok: the scenario, the light turn comes 1 s later
    # The light tenant's turns one after the other, well inside the flood (under a second
    # of its 38 s); the median, as for idle: one turn's latency on a shared 2-core machine
    # swings with whatever else is scheduled in that moment.
    beside = [await turn_latency(fleet, client, light) for _ in range(5)]
    loaded = statistics.median(beside)
    # The light calls went ahead of the flood's backlog: when the last of them started,
    # nearly all of the flood's calls were still waiting (in a FIFO, every one of the 3,000
    # would have started before it).
    light_starts = await redis.zrange(starts_key(light), -1, -1, withscores=True)
    light_started = float(light_starts[0][1])
    ahead = await redis.zcount(starts_key(flood), "-inf", f"({light_started}")
    # What is left of the flood proves nothing more: cancelled, its waiting calls are
    # withdrawn, and every flood turn still ends with a result.
    for event in floods:
        await client.cancel(CancelRequest(tenant_id=flood, run_id=event.run_id, reason="done"))
    results = [await result_of(fleet, client, e.run_id, within=180) for e in floods]
    assert {r.status for r in results} <= {"completed", "cancelled"}
    print(
        f"light tenant: idle {idle * 1000:.0f} ms, beside the flood {loaded * 1000:.0f} ms "
        f"({loaded / idle:.2f}x; each {[round(t * 1000) for t in beside]} ms); "
        f"{ahead} of the flood's 3,000 calls started before its last turn"
    )
    assert ahead <= 500
    assert loaded <= 2 * idle


async def test_backlogged_tenants_share_the_fleet_by_weight(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    tag = uuid.uuid4().hex[:6]
    one, three = f"w1-{tag}", f"w3-{tag}"
    admission = Admission(redis, keys)
    await admission.set_limits("tenants", one, Limits(weight=1))
    await admission.set_limits("tenants", three, Limits(weight=3))
    events = [fair_turn(t, 10) for _ in range(40) for t in (one, three)]  # 400 calls each
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
    events = [fair_turn(tenant, 10) for _ in range(40)]  # 400 calls: 5 s of backlog
    await asyncio.gather(*(client.submit(e) for e in events))
    fleet.kill("planner")  # mid-backlog; planner-2 takes its partitions over
    fleet.start("planner", ["planner"])
    results = [await result_of(fleet, client, e.run_id, within=180) for e in events]
    assert {r.status for r in results} == {"completed"}
    call_ids = [c.call_id for e in events for c in e.function_calls]
    runs = [int(await redis.get(runs_key(cid)) or 0) for cid in call_ids]
    assert runs == [1] * len(call_ids)


async def test_a_cancelled_runs_waiting_calls_leave_the_queue_as_skipped(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    tenant = f"cancel-{uuid.uuid4().hex[:6]}"
    admission = Admission(redis, keys)
    await admission.set_limits("tenants", tenant, Limits(max_concurrency=1))
    # Another run of the tenant holds its only slot for the whole test, so no slot frees while
    # the cancelled run's calls wait. (A cancelled run's own running call frees its slot when
    # the worker cancels it, and that slot can admit the run's next waiting call before the
    # aggregator withdraws the queue: that call reaches a worker, never begins, and the turn
    # reports it cancelled, effect unknown. Which of the two comes first is a race.)
    holder = turn(("hold", "work", {"ms": 60_000})).model_copy(update={"tenant_id": tenant})
    await client.submit(holder)

    async def one_running() -> bool:
        return await redis.zcard(starts_key(tenant)) == 1

    await wait_for(one_running, within=30)
    event = turn(*((f"c{i}", "work", {"ms": 2000}) for i in range(3)))
    event = event.model_copy(update={"tenant_id": tenant})
    await client.submit(event)

    async def three_waiting() -> bool:
        return [t.waiting for t in await admission.tenants() if t.tenant_id == tenant] == [3]

    await wait_for(three_waiting, within=30)
    await client.cancel(CancelRequest(tenant_id=tenant, run_id=event.run_id, reason="user"))
    result = await result_of(fleet, client, event.run_id, within=60)
    # Taken out of the queue: skipped, not executed, and never started.
    assert result.status == "cancelled"
    assert [(c.status, c.effect) for c in result.calls] == [("skipped", "not_executed")] * 3
    assert await redis.zcard(starts_key(tenant)) == 1
    # The ledger says what the turn result says: settled without running, not "dispatched".
    ids = [c.call_id for c in event.function_calls]
    entries = await Ledger(redis, keys).read(tenant, event.run_id, ids)
    assert [(e.state, e.outcome and e.outcome.status) for e in entries.values()] == [
        ("committed", "skipped")
    ] * 3
    await client.cancel(CancelRequest(tenant_id=tenant, run_id=holder.run_id, reason="done"))
    assert (await result_of(fleet, client, holder.run_id, within=60)).status == "cancelled"


async def test_a_call_still_waiting_at_its_deadline_never_starts(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    tenant = f"late-{uuid.uuid4().hex[:6]}"
    await Admission(redis, keys).set_limits("tenants", tenant, Limits(max_concurrency=1))
    event = turn(("a", "work", {"ms": 1500}), ("b", "work", {"ms": 10}), deadline_s=0.5)
    event = event.model_copy(update={"tenant_id": tenant})
    await client.submit(event)
    result = await result_of(fleet, client, event.run_id, within=60)
    late = next(c for c in result.calls if c.call_id.endswith("-b"))
    assert (late.status, late.effect) == ("timed_out", "not_executed")
    output = next(o.output for o in result.outputs if o.call_id.endswith("-b"))
    assert output == NEVER_STARTED_DEADLINE.format(name="work")
    started = [m.decode() for m in await redis.zrange(starts_key(tenant), 0, -1)]
    assert started == [event.function_calls[0].call_id]
    entry = (await Ledger(redis, keys).read(tenant, event.run_id, [late.call_id]))[late.call_id]
    assert (entry.state, entry.outcome and entry.outcome.status) == ("committed", "timed_out")
