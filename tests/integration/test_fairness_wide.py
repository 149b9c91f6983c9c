"""Fair scheduling on wide workers: two workers of 50 slots each, a flood filling every slot.

Admission gives a freed slot to the fairest waiting call, and the worker whose slot freed
runs it at once (its own partition): a light tenant's call never queues behind a flooding
tenant's calls that a full worker already holds. Here each light turn beside a 3,000-call flood
(bodies of 100-900 ms: about 200 calls/s) ends in a fraction of the time the flood's backlog
ahead of it would take to run. How its latency compares with idle is a measurement, printed
here and kept by ``make bench`` (bench/fairness.py), not a bound: it follows the machine's
load.
"""

from __future__ import annotations

import asyncio
import statistics
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from kernel.settings import Settings
from kernel.stores.admission import Admission
from kernel.stores.keys import Keys
from schemas import CancelRequest, ModelResponseEvent
from tests.conftest import wait_for
from tests.integration.test_fairness import turn_latency
from tests.integration.test_pipeline import turn
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = [pytest.mark.integration, pytest.mark.long_scenario]

TOOLS = "tests.integration.fair_tools:tools"
SLOTS_PER_WORKER = 50
MEAN_BODY_S = 0.5
"""The flood's calls hold their slot 100-900 ms."""


def _flood_turn(tenant: str, n: int) -> ModelResponseEvent:
    """30 calls of 100-900 ms (500 on average): slots free one by one, not in waves of a
    hundred, as they would if every call held its slot for the same time."""
    calls = ((f"c{i}", "work", {"ms": 100 + (n * 30 + i) * 337 % 800}) for i in range(30))
    return turn(*calls).model_copy(update={"tenant_id": tenant})


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    args = ["--concurrency", str(SLOTS_PER_WORKER)]
    with LocalFleet(settings, tools=TOOLS, workers=2, worker_args=args) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


async def test_a_light_tenant_beside_a_flood_on_50_slot_workers(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    tag = uuid.uuid4().hex[:6]
    light, flood = f"light-{tag}", f"flood-{tag}"
    idle = statistics.median([await turn_latency(fleet, client, light) for _ in range(5)])
    floods = [_flood_turn(flood, n) for n in range(100)]  # 3,000 calls: about 15 s
    await asyncio.gather(*(client.submit(e) for e in floods))

    admission = Admission(redis, keys)

    async def flood_waiting() -> int:
        return next((v.waiting for v in await admission.tenants() if v.tenant_id == flood), 0)

    async def slots_full() -> bool:  # every slot holds a flood call, and more wait
        running = await redis.hget(keys.admission("running"), "p:default")
        return int(running or 0) == 2 * SLOTS_PER_WORKER and await flood_waiting() > 0

    await wait_for(slots_full)
    beside, backlogs = [], []
    for _ in range(5):
        # Queued behind the flood's waiting calls, the light call would start once they ran
        # on every slot: this long, at the least.
        backlogs.append(await flood_waiting() * MEAN_BODY_S / (2 * SLOTS_PER_WORKER))
        beside.append(await turn_latency(fleet, client, light))
    loaded = statistics.median(beside)
    waiting = await flood_waiting()
    for event in floods:
        await client.cancel(CancelRequest(tenant_id=flood, run_id=event.run_id, reason="done"))
    results = [await result_of(fleet, client, e.run_id, within=180) for e in floods]
    assert {r.status for r in results} <= {"completed", "cancelled"}
    failed = [c.error for r in results for c in r.calls if c.status == "failed"]
    assert failed == []  # cancelled or skipped, never failed
    print(
        f"light tenant: idle {idle * 1000:.0f} ms, beside the flood {loaded * 1000:.0f} ms "
        f"({loaded / idle:.2f}x; each {[round(t * 1000) for t in beside]} ms, behind the "
        f"backlog {[round(b * 1000) for b in backlogs]} ms); "
        f"{waiting} of the flood's 3,000 calls still waited when its last turn ended"
    )
    assert waiting > 0  # the light turns ran while the flood's backlog waited
    # None queued behind the backlog: each ended in a quarter of the time it would take.
    assert all(took < backlog / 4 for took, backlog in zip(beside, backlogs, strict=True))
