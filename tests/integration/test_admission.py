"""Admission on the real Redis: capacity, quotas, weights, rate limits, withdrawal, leases.

Time is passed in (``now``), so a rate or a lease is tested without waiting for it.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import Counter

import pytest
from redis.asyncio import Redis

from kernel.stores.admission import Admission, Limits, Waiting
from kernel.stores.keys import Keys

pytestmark = pytest.mark.integration


@pytest.fixture
def admission(redis: Redis) -> Admission:
    return Admission(redis, Keys(f"tf:adm-{uuid.uuid4().hex[:8]}"), lease_s=60.0)


def _calls(tenant: str, n: int, tool: str = "t", *, deadline: float | None = None) -> list[Waiting]:
    run = f"run-{uuid.uuid4().hex[:6]}"
    return [
        Waiting(tenant, run, f"c{i}", 1, tool, "default", f"cmd {tenant} {tool} {i}", deadline)
        for i in range(n)
    ]


def _tenant(member: str) -> str:
    return member.split("\x1f", 1)[0]


async def test_nothing_is_admitted_beyond_the_pools_live_slots(admission: Admission) -> None:
    await admission.enqueue(_calls("acme", 5), now=0)
    assert (await admission.admit(now=1)).calls == []  # no worker serves the pool yet
    await admission.register_worker("default", "w1", 2, ttl_s=30, now=1)
    first = (await admission.admit(now=2)).calls
    assert [p for _, p, _ in first] == ["cmd acme t 0", "cmd acme t 1"]
    assert (await admission.admit(now=3, published=[m for m, _, _ in first])).calls == []
    freed = (await admission.admit(now=4, release=[first[0][0]])).calls
    assert [p for _, p, _ in freed] == ["cmd acme t 2"]
    # The worker stops renewing: its slots leave the pool's capacity.
    assert (await admission.admit(now=40, release=[first[1][0], freed[0][0]])).calls == []


async def test_one_pass_queues_frees_and_admits_and_a_repeated_release_frees_one_slot(
    admission: Admission,
) -> None:
    await admission.register_worker("default", "w1", 2, ttl_s=600, now=0)
    first = (await admission.admit(now=1, enqueue=_calls("acme", 3))).calls
    assert [p for _, p, _ in first] == ["cmd acme t 0", "cmd acme t 1"]  # queued, then admitted
    again = _calls("acme", 3)  # another run: its calls queue behind the third one
    held = first[0][0]
    # The outcome of one call arrives twice in one pass (a redelivery): one slot frees.
    freed = (await admission.admit(now=2, release=[held, held], enqueue=again)).calls
    assert [p for _, p, _ in freed] == ["cmd acme t 2"]
    assert (await admission.admit(now=3, release=[held])).calls == []  # already free


async def test_calls_a_pass_queues_and_cannot_admit_wait_like_any_other(
    admission: Admission,
) -> None:
    """A pass admits the calls it queues without writing them to the queue when it can; the
    ones it cannot admit are queued as ``enqueue`` would queue them: they keep their order,
    expire at their deadline and leave with their cancelled run."""
    await admission.register_worker("default", "w1", 1, ttl_s=600, now=0)
    a = _calls("acme", 2, deadline=50)
    assert [p for _, p, _ in (await admission.admit(now=1, enqueue=a)).calls] == ["cmd acme t 0"]
    b, c = _calls("acme", 1, tool="b"), _calls("acme", 1, tool="c")
    assert (await admission.admit(now=2, enqueue=b + c)).calls == []  # the pool is full
    assert [p for _, p in await admission.withdraw_expired(now=60)] == ["cmd acme t 1"]
    assert [p for _, p in await admission.withdraw_run("acme", c[0].run_id)] == ["cmd acme c 0"]
    freed = (await admission.admit(now=61, release=[a[0].member])).calls
    assert [p for _, p, _ in freed] == ["cmd acme b 0"]
    assert (await admission.admit(now=62, release=[b[0].member])).calls == []  # none left


async def test_backlogged_tenants_share_capacity_by_weight(admission: Admission) -> None:
    await admission.set_limits("tenants", "light", Limits(weight=1))
    await admission.set_limits("tenants", "heavy", Limits(weight=3))
    await admission.enqueue(_calls("light", 400) + _calls("heavy", 400), now=0)
    await admission.register_worker("default", "w1", 4, ttl_s=600, now=0)
    shares: Counter[str] = Counter()
    held: list[str] = []
    for step in range(50):
        admitted = (await admission.admit(now=1 + step, release=held)).calls
        held = [m for m, _, _ in admitted]
        shares.update(_tenant(m) for m in held)
    assert shares["heavy"] / shares["light"] == pytest.approx(3, rel=0.1), shares


async def test_a_tenant_that_arrives_gets_the_next_free_slot(admission: Admission) -> None:
    await admission.register_worker("default", "w1", 2, ttl_s=600, now=0)
    await admission.enqueue(_calls("flood", 1000), now=0)
    held = [m for m, _, _ in (await admission.admit(now=1)).calls]
    await admission.enqueue(_calls("newcomer", 1), now=2)
    after_one = (await admission.admit(now=3, release=held[:1])).calls
    assert [_tenant(m) for m, _, _ in after_one] == ["newcomer"]


async def test_tenant_and_tool_limits_hold_and_a_blocked_tool_does_not_block_others(
    admission: Admission,
) -> None:
    await admission.register_worker("default", "w1", 50, ttl_s=600, now=0)
    await admission.set_limits("tenants", "acme", Limits(max_concurrency=3))
    await admission.set_limits("tools", "slow", Limits(max_concurrency=1))
    await admission.enqueue(_calls("acme", 10), now=0)
    await admission.enqueue(_calls("beta", 3, "slow") + _calls("beta", 2, "fast"), now=0)
    admitted = (await admission.admit(now=1)).calls
    by_tenant = Counter(_tenant(m) for m, _, _ in admitted)
    assert by_tenant == {"acme": 3, "beta": 3}  # beta: one slow call, then its fast calls
    assert sum("slow" in p for _, p, _ in admitted) == 1


async def test_a_rate_limit_spaces_admissions_and_a_429_slows_it(admission: Admission) -> None:
    await admission.register_worker("default", "w1", 100, ttl_s=600, now=0)
    await admission.set_limits("tools", "api", Limits(rate=10))  # burst 1: evenly spaced
    await admission.enqueue(_calls("acme", 100, "api"), now=0)
    times = [round(0.01 * i, 2) for i in range(300)]  # every 10 ms over 3 s
    admitted_at = [t for t in times if (await admission.admit(now=t)).calls]
    refill = (await admission.admit(now=3.0)).refill_in_s  # just after one was admitted
    assert refill is not None and 0 < refill <= 1 / (10 * 0.9)
    assert len(admitted_at) == pytest.approx(3 * 10 * 0.9, abs=2)
    gaps = [b - a for a, b in itertools.pairwise(admitted_at)]
    assert min(gaps) >= 1 / 10  # never faster than the declared rate
    await admission.throttle("acme", "api", now=3.0)
    slowed = [t for t in (3 + 0.01 * i for i in range(100)) if (await admission.admit(now=t)).calls]
    assert len(slowed) < 10 * 0.9 / 2 + 1  # at most half the rate in the second after a 429


async def test_withdrawn_calls_leave_the_queue(admission: Admission) -> None:
    cancelled, late = _calls("acme", 3), _calls("acme", 2, deadline=5.0)
    await admission.enqueue(cancelled + late, now=0)
    out = await admission.withdraw_run("acme", cancelled[0].run_id)
    assert sorted(p for _, p in out) == [f"cmd acme t {i}" for i in range(3)]
    assert await admission.withdraw_expired(now=4) == []
    assert len(await admission.withdraw_expired(now=6)) == 2
    await admission.register_worker("default", "w1", 10, ttl_s=600, now=6)
    assert (await admission.admit(now=7)).calls == []  # nothing is left waiting


async def test_an_admitted_command_not_confirmed_is_handed_out_again(
    admission: Admission,
) -> None:
    await admission.register_worker("default", "w1", 1, ttl_s=600, now=0)
    await admission.enqueue(_calls("acme", 1), now=0)
    [(member, payload, paced)] = (await admission.admit(now=1)).calls
    assert paced == ()  # no rate applies
    # Its planner died before confirming: after the publish lease, another one gets it.
    assert (await admission.admit(now=5)).calls == []
    assert (await admission.admit(now=12)).calls == [(member, payload, ())]
    assert (await admission.admit(now=30, published=[member])).calls == []
    # Its outcome never came: the slot comes back at the admission lease (60 s).
    await admission.enqueue(_calls("acme", 1), now=30)
    assert (await admission.admit(now=40)).calls == []
    assert len((await admission.admit(now=62)).calls) == 1


async def test_concurrent_admitters_never_exceed_capacity(admission: Admission) -> None:
    await admission.register_worker("default", "w1", 5, ttl_s=600, now=0)
    await admission.enqueue(_calls("acme", 100), now=0)
    rounds = await asyncio.gather(*(admission.admit(now=1) for _ in range(20)))
    members = [m for r in rounds for m, _, _ in r.calls]
    assert len(members) == len(set(members)) == 5
