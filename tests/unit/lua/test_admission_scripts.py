"""Admission's scripts (kernel/stores/lua/admission/), each on its own: which call an admission
pass lets run, in which order, under which quota and rate; what waits, and what is taken out."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import pytest
import redis

from kernel.stores.admission import (
    PACED_SEP,
    RATE_SAFETY,
    RECOVERY_S,
    SEP,
    Limits,
    Waiting,
    _entries,
)
from tests.unit.lua.conftest import Lua

NAMES = (
    "active", "clock", "waiting", "info", "payloads", "deadlines", "running", "admitted",
    "pending", "tenants", "tools", "buckets", "workers", "slots", "seq",
)  # fmt: skip
ADMIT_KEYS = [f"adm:{name}" for name in NAMES]
"""admit.lua's KEYS, in the order Admission.admit passes them."""
ENQUEUE_KEYS = [f"adm:{name}" for name in (*NAMES[:6], "seq")]
WITHDRAW_KEYS = [f"adm:{name}" for name in ("waiting", "info", "payloads", "deadlines")]
NOW = 1000.0
NO_LIMITS = Limits()


def call(
    tenant: str, call_id: str, tool: str = "add", *, run: str = "run", deadline: float | None = None
) -> Waiting:
    """A call handed to admission, its payload naming it."""
    return Waiting(tenant, run, call_id, 1, tool, "default", f"payload:{call_id}", deadline)


def ids(admitted: Sequence[str]) -> list[str]:
    """The call ids of admitted members (tenant, run, call, attempt)."""
    return [m.split(SEP)[2] for m in admitted]


def admit(
    lua: Lua,
    now: float = NOW,
    *,
    release: Sequence[Waiting] = (),
    published: Sequence[Waiting] = (),
    enqueue: Sequence[Waiting] = (),
    default: Limits = NO_LIMITS,
    lease_s: float = 900.0,
    max_calls: int = 1000,
    scan: bool = True,
) -> tuple[list[str], float | None]:
    """One pass, as Admission.admit runs it: the members handed out (in order), and the
    seconds until a bucket that held a call back has a token."""
    args = [
        now, max_calls, lease_s, 10.0, default.json(), RATE_SAFETY, RECOVERY_S, int(scan),
        len(release), *(c.member for c in release),
        len(published), *(c.member for c in published),
        len(enqueue), *_entries(enqueue),
    ]  # fmt: skip
    flat = [v.decode() for v in lua("admission/admit", ADMIT_KEYS, args)]
    members = flat[1::3]
    payloads = flat[2::3]
    assert payloads == [f"payload:{m.split(SEP)[2]}" for m in members]
    return members, float(flat[0]) if flat[0] else None


def workers(r: redis.Redis, slots: int, *, until: float = NOW + 60, name: str = "w1") -> None:
    """A worker of the default pool with ``slots`` slots, registered until ``until`` (as
    Admission.register_worker writes it)."""
    r.zadd("adm:workers", {f"default{SEP}{name}": until})
    r.hset("adm:slots", f"default{SEP}{name}", slots)


def running(r: redis.Redis) -> dict[str, int]:
    """The counts of running calls (tenant, tool, pool, admitted total)."""
    return {k.decode(): int(v) for k, v in r.hgetall("adm:running").items()}


def limits(r: redis.Redis, kind: str, name: str, value: Limits) -> None:
    """A tenant's or a tool's limits, as Admission.set_limits stores them."""
    r.hset(f"adm:{kind}", name, value.json())


def waiting_ids(r: redis.Redis) -> list[str]:
    """The call ids in the queue, in its order (an entry: tenant, sequence, member)."""
    return [e.decode().split(SEP)[4] for e in r.zrange("adm:waiting", 0, -1)]


# -- queue, slots and leases ------------------------------------------------------------------


def test_a_call_with_a_free_slot_is_admitted_without_entering_the_queue(
    lua: Lua, r: redis.Redis
) -> None:
    workers(r, 2)
    a1 = call("acme", "a1")
    assert admit(lua, enqueue=[a1]) == ([a1.member], None)
    assert r.zcard("adm:waiting") == 0 and r.zcard("adm:deadlines") == 0
    assert r.zscore("adm:admitted", a1.member) == math.ceil(NOW + 900)
    assert r.zscore("adm:pending", a1.member) == math.ceil(NOW + 10)
    running = {k.decode(): int(v) for k, v in r.hgetall("adm:running").items()}
    assert running == {"t:acme": 1, "o:add": 1, "p:default": 1, "admitted:acme": 1}


def test_calls_without_a_slot_wait_in_order_and_each_release_admits_the_next(
    lua: Lua, r: redis.Redis
) -> None:
    workers(r, 1)
    a1, a2, a3 = (call("acme", f"a{i}") for i in (1, 2, 3))
    assert ids(admit(lua, enqueue=[a1, a2, a3])[0]) == ["a1"]
    assert waiting_ids(r) == ["a2", "a3"]
    assert ids(admit(lua, NOW + 1)[0]) == []  # still full
    assert ids(admit(lua, NOW + 1, release=[a1])[0]) == ["a2"]
    assert ids(admit(lua, NOW + 2, release=[a1])[0]) == []  # a repeated release is a no-op
    assert r.hget("adm:running", "p:default") == b"1"
    assert ids(admit(lua, NOW + 2, release=[a2])[0]) == ["a3"]
    assert r.zcard("adm:waiting") == 0


def test_enqueue_skips_a_call_already_queued_or_admitted(lua: Lua, r: redis.Redis) -> None:
    a1, a2 = call("acme", "a1"), call("acme", "a2")
    assert lua("admission/enqueue", ENQUEUE_KEYS, [NOW, *_entries([a1, a2, a1])]) == 2
    assert lua("admission/enqueue", ENQUEUE_KEYS, [NOW, *_entries([a1])]) == 0
    assert waiting_ids(r) == ["a1", "a2"]
    assert r.zscore("adm:active", "acme") == 0
    workers(r, 1)
    assert ids(admit(lua)[0]) == ["a1"]
    assert lua("admission/enqueue", ENQUEUE_KEYS, [NOW, *_entries([a1])]) == 0  # admitted


def test_a_lost_outcome_frees_its_slot_when_its_lease_runs_out(lua: Lua, r: redis.Redis) -> None:
    workers(r, 1, until=NOW + 600)
    a1, a2 = call("acme", "a1"), call("acme", "a2")
    assert ids(admit(lua, enqueue=[a1, a2], lease_s=4.2)[0]) == ["a1"]
    # Leases end on whole seconds, rounded up: 1004.2 -> 1005.
    assert ids(admit(lua, NOW + 4.5, published=[a1])[0]) == []
    assert ids(admit(lua, NOW + 5.0)[0]) == ["a2"]


def test_an_admission_no_planner_confirmed_is_handed_out_again(lua: Lua, r: redis.Redis) -> None:
    workers(r, 2, until=NOW + 600)
    a1, a2 = call("acme", "a1"), call("acme", "a2")
    assert ids(admit(lua, enqueue=[a1, a2])[0]) == ["a1", "a2"]
    # a1's planner confirmed it on Kafka; a2's died before it could.
    assert ids(admit(lua, NOW + 11, published=[a1])[0]) == ["a2"]
    assert r.zscore("adm:pending", a2.member) == math.ceil(NOW + 11 + 10)  # a new lease
    assert ids(admit(lua, NOW + 12, published=[a2])[0]) == []


def test_a_release_pass_with_nothing_waiting_frees_slots_and_leaves_the_sweeps_to_a_scan(
    lua: Lua, r: redis.Redis
) -> None:
    workers(r, 3, until=NOW + 5)
    a1, a2, a3 = (call("acme", f"a{i}") for i in (1, 2, 3))
    assert ids(admit(lua, enqueue=[a1, a2, a3], lease_s=4.2)[0]) == ["a1", "a2", "a3"]
    # At NOW + 11: a2's lease has run out, a3 was never confirmed, and the worker is gone.
    assert admit(lua, NOW + 11, release=[a1], published=[a2], scan=False) == ([], None)
    assert running(r) == {"t:acme": 2, "o:add": 2, "p:default": 2, "admitted:acme": 3}
    assert r.zscore("adm:admitted", a1.member) is None and r.hget("adm:info", a1.member) is None
    assert r.zscore("adm:admitted", a2.member) is not None  # its lease is a scan's to end
    assert r.zscore("adm:pending", a3.member) is not None
    assert r.zcard("adm:workers") == 1
    # The scanning pass ends the expired leases (a3's too: its release takes its pending).
    assert admit(lua, NOW + 11) == ([], None)
    assert running(r) == {"admitted:acme": 3}
    assert r.zcard("adm:admitted") == 0 and r.zcard("adm:pending") == 0
    assert r.zcard("adm:workers") == 0


def test_a_release_pass_gives_the_freed_slot_to_the_fairest_waiting_tenant(
    lua: Lua, r: redis.Redis
) -> None:
    workers(r, 1)
    backlog = [call("a", f"a{i}") for i in range(3)]
    assert ids(admit(lua, enqueue=backlog)[0]) == ["a0"]
    b0 = call("b", "b0")
    assert ids(admit(lua, NOW + 1, enqueue=[b0])[0]) == []  # the pool is full
    # b arrived at the fleet's clock, below a's virtual time: the freed slot is b's.
    assert ids(admit(lua, NOW + 2, release=[backlog[0]], scan=False)[0]) == ["b0"]
    assert r.zscore("adm:pending", b0.member) == math.ceil(NOW + 2 + 10)
    assert waiting_ids(r) == ["a1", "a2"]
    assert ids(admit(lua, NOW + 3, release=[b0], scan=False)[0]) == ["a1"]


def test_admitting_attempt_2_of_a_call_frees_the_slot_of_attempt_1(
    lua: Lua, r: redis.Redis
) -> None:
    workers(r, 1)
    first = call("acme", "a1")
    assert admit(lua, enqueue=[first]) == ([first.member], None)
    # Attempt 1's release never came (its reconciler retried it): attempt 2 takes its slot.
    second = replace(first, attempt=2)
    assert admit(lua, NOW + 1, enqueue=[second]) == ([second.member], None)
    assert running(r) == {"t:acme": 1, "o:add": 1, "p:default": 1, "admitted:acme": 2}
    for key in ("adm:admitted", "adm:pending"):
        assert r.zrange(key, 0, -1) == [second.member.encode()]
    assert r.hkeys("adm:info") == [second.member.encode()]
    assert r.hkeys("adm:payloads") == [second.member.encode()]


def test_the_same_member_released_by_two_passes_frees_one_slot(lua: Lua, r: redis.Redis) -> None:
    workers(r, 2)
    a1, a2 = call("acme", "a1"), call("acme", "a2")
    assert ids(admit(lua, enqueue=[a1, a2])[0]) == ["a1", "a2"]
    # Its worker frees it, and a planner reading its outcome frees it again.
    assert admit(lua, NOW + 1, release=[a1], scan=False) == ([], None)
    assert admit(lua, NOW + 2, release=[a1]) == ([], None)
    assert admit(lua, NOW + 3, release=[a1], scan=False) == ([], None)
    assert running(r) == {"t:acme": 1, "o:add": 1, "p:default": 1, "admitted:acme": 2}
    assert r.zrange("adm:admitted", 0, -1) == [a2.member.encode()]


def test_workers_that_stopped_registering_take_their_slots_away(lua: Lua, r: redis.Redis) -> None:
    workers(r, 3, until=NOW + 1)
    a1, a2 = call("acme", "a1"), call("acme", "a2")
    assert ids(admit(lua, NOW + 2, enqueue=[a1])[0]) == []
    assert r.zcard("adm:workers") == 0 and r.hlen("adm:slots") == 0
    workers(r, 1, until=NOW + 60, name="w2")
    assert ids(admit(lua, NOW + 3, enqueue=[a2])[0]) == ["a1"]


# -- fairness ---------------------------------------------------------------------------------


def test_backlogged_tenants_share_slots_in_proportion_to_their_weights(
    lua: Lua, r: redis.Redis
) -> None:
    limits(r, "tenants", "a", Limits(weight=2))
    backlog = [call(t, f"{t}{i}") for i in range(6) for t in ("a", "b")]
    lua("admission/enqueue", ENQUEUE_KEYS, [NOW, *_entries(backlog)])
    workers(r, 6)
    # Start-time fair queueing: a's virtual time grows by 1/2 per call, b's by 1 (ties go
    # to the lower name).
    assert ids(admit(lua)[0]) == ["a0", "b0", "a1", "a2", "b1", "a3"]


def test_an_arriving_tenant_starts_at_the_fleet_clock_without_saved_credit(
    lua: Lua, r: redis.Redis
) -> None:
    workers(r, 1, until=NOW + 600)
    backlog = [call("a", f"a{i}") for i in range(10)]
    previous: Waiting | None = None
    for i in range(5):
        admitted = admit(lua, NOW + i, enqueue=backlog if i == 0 else (),
                         release=[previous] if previous else ())[0]  # fmt: skip
        assert ids(admitted) == [f"a{i}"]
        previous = backlog[i]
    late = [call("b", f"b{i}") for i in range(3)]
    order = []
    for i in range(3):
        admitted = admit(lua, NOW + 10 + i, enqueue=late if i == 0 else (), release=[previous])[0]
        order += ids(admitted)
        previous = next(c for c in [*backlog, *late] if c.member == admitted[0])
    # b's virtual time starts at the clock (4, the last admitted call's), not at 0: it
    # alternates with a instead of taking every slot until it catches up.
    assert order == ["b0", "a5", "b1"]


def test_a_tenant_at_its_quota_waits_while_others_take_the_slots(lua: Lua, r: redis.Redis) -> None:
    workers(r, 10)
    calls = [call("a", "a1"), call("a", "a2"), call("a", "a3"), call("b", "b1")]
    members, _ = admit(lua, enqueue=calls, default=Limits(max_concurrency=1))
    assert ids(members) == ["a1", "b1"]
    limits(r, "tenants", "a", Limits(max_concurrency=2))  # a configured tenant's own quota
    assert ids(admit(lua, NOW + 1, default=Limits(max_concurrency=1))[0]) == ["a2"]


def test_a_tool_at_its_quota_does_not_hold_back_the_tenants_other_tools(
    lua: Lua, r: redis.Redis
) -> None:
    workers(r, 10)
    limits(r, "tools", "slow", Limits(max_concurrency=1))
    calls = [call("a", "s1", "slow"), call("a", "s2", "slow"), call("a", "f1", "fast")]
    assert ids(admit(lua, enqueue=calls)[0]) == ["s1", "f1"]
    assert waiting_ids(r) == ["s2"]


@pytest.mark.parametrize(("held_back", "admitted"), [(7, True), (8, False)])
def test_admission_looks_eight_calls_into_a_tenants_queue(
    lua: Lua, r: redis.Redis, held_back: int, admitted: bool
) -> None:
    workers(r, 20)
    limits(r, "tools", "slow", Limits(max_concurrency=1))
    slow = [call("a", f"s{i}", "slow") for i in range(held_back + 1)]
    lua("admission/enqueue", ENQUEUE_KEYS, [NOW, *_entries([*slow, call("a", "f1", "fast")])])
    assert ids(admit(lua)[0]) == (["s0", "f1"] if admitted else ["s0"])


# -- rate limits ------------------------------------------------------------------------------


def test_a_tenants_rate_spaces_its_calls_and_the_pass_says_when_a_token_is_free(
    lua: Lua, r: redis.Redis
) -> None:
    workers(r, 10, until=NOW + 60)
    limits(r, "tenants", "a", Limits(rate=1.0))
    members, refill = admit(lua, enqueue=[call("a", "a1"), call("a", "a2"), call("b", "b1")])
    assert ids(members) == ["a1", "b1"]  # b has no rate
    # The bucket refills at RATE_SAFETY of the declared rate.
    assert refill == pytest.approx(1 / (1.0 * RATE_SAFETY))
    assert ids(admit(lua, NOW + 1.0)[0]) == []
    assert ids(admit(lua, NOW + 1 / RATE_SAFETY + 0.01)[0]) == ["a2"]


def test_a_burst_admits_that_many_calls_at_once(lua: Lua, r: redis.Redis) -> None:
    workers(r, 10)
    limits(r, "tools", "api", Limits(rate=1.0, burst=3))
    members, _ = admit(lua, enqueue=[call("a", f"a{i}", "api") for i in range(5)])
    assert ids(members) == ["a0", "a1", "a2"]


def test_a_tools_rate_per_tenant_limits_each_tenant_apart(lua: Lua, r: redis.Redis) -> None:
    workers(r, 10)
    limits(r, "tools", "api", Limits(tenant_rate=1.0))
    calls = [call("a", "a1", "api"), call("a", "a2", "api"), call("b", "b1", "api")]
    assert ids(admit(lua, enqueue=calls)[0]) == ["a1", "b1"]


def test_a_429_halves_the_tools_rate_which_recovers_over_time(lua: Lua, r: redis.Redis) -> None:
    workers(r, 10, until=NOW + 600)
    limits(r, "tools", "api", Limits(rate=10.0, burst=5))
    scopes = ["o:api", f"to:a{SEP}api"]
    assert lua("admission/throttle", ["adm:buckets", "adm:stats"], [NOW, RECOVERY_S, *scopes]) == 1
    assert r.hget("adm:buckets", "o:api") == b"0,1000,0.5"  # empty, at half the rate
    assert r.hget("adm:stats", "throttled:o:api") == b"1"
    members, refill = admit(lua, enqueue=[call("a", "a1", "api")])
    assert members == []
    assert refill == pytest.approx(1 / (10.0 * RATE_SAFETY * 0.5))
    # Once the factor has recovered, the bucket refills at the full (safe) rate.
    later = NOW + RECOVERY_S
    assert ids(admit(lua, later)[0]) == ["a1"]
    tokens, _, factor = (r.hget("adm:buckets", "o:api") or b"").decode().split(",")
    assert (float(tokens), float(factor)) == (4.0, 1.0)


def test_an_admitted_call_names_the_rate_scopes_its_start_must_pass(
    lua: Lua, r: redis.Redis
) -> None:
    workers(r, 10)
    limits(r, "tools", "api", Limits(rate=5.0, tenant_rate=2.0))
    args = [NOW, 1000, 900.0, 10.0, NO_LIMITS.json(), RATE_SAFETY, RECOVERY_S, 1, 0, 0]
    calls = [call("a", "a1", "api"), call("a", "a2", "free")]
    flat = [v.decode() for v in lua("admission/admit", ADMIT_KEYS, [*args, 2, *_entries(calls)])]
    paced = {ids([flat[i]])[0]: flat[i + 2] for i in range(1, len(flat), 3)}
    assert paced == {"a1": PACED_SEP.join(["o:api", f"to:a{SEP}api"]), "a2": ""}


def pace(lua: Lua, now: float, member: str, *scopes: str, slack: float = 0.0) -> float | None:
    """Admission.pace: None when the start may go now, else the seconds to wait."""
    keys = ["adm:tenants", "adm:tools", *(f"adm:starts{SEP}{s}" for s in scopes)]
    args = [now, member, slack, NO_LIMITS.json(), *scopes]
    wait = lua("admission/pace", keys, args).decode()
    return float(wait) if wait else None


def test_starts_of_a_rate_limited_tool_never_exceed_its_rate_in_any_window(
    lua: Lua, r: redis.Redis
) -> None:
    limits(r, "tools", "api", Limits(rate=3.0))
    # Admitted apart, arriving together: three start, the fourth waits for the first to age out.
    assert [pace(lua, NOW + i * 0.01, f"m{i}", "o:api") for i in range(3)] == [None] * 3
    assert pace(lua, NOW + 0.5, "m3", "o:api") == pytest.approx(0.5)
    assert pace(lua, NOW + 1.0, "m3", "o:api") is None
    # A start counted once even when its command comes again (a redelivery).
    assert pace(lua, NOW + 1.005, "m3", "o:api") is None
    assert r.zcard(f"adm:starts{SEP}o:api") == 3


def test_the_slack_widens_each_window(lua: Lua, r: redis.Redis) -> None:
    limits(r, "tools", "api", Limits(rate=1.0))
    assert pace(lua, NOW, "a1", "o:api", slack=0.1) is None
    assert pace(lua, NOW + 1.0, "a2", "o:api", slack=0.1) == pytest.approx(0.1)


def test_a_slow_rate_allows_one_start_per_period_and_a_burst_that_many(
    lua: Lua, r: redis.Redis
) -> None:
    limits(r, "tenants", "slow", Limits(rate=0.5))
    assert pace(lua, NOW, "s1", "t:slow") is None
    assert pace(lua, NOW + 1.5, "s2", "t:slow") == pytest.approx(0.5)
    limits(r, "tools", "bursty", Limits(rate=1.0, burst=3))
    assert [pace(lua, NOW, f"b{i}", "o:bursty") for i in range(4)][3] == pytest.approx(1.0)


def test_a_start_waits_for_the_tightest_of_its_scopes_and_a_lifted_rate_frees_it(
    lua: Lua, r: redis.Redis
) -> None:
    limits(r, "tools", "api", Limits(rate=10.0, tenant_rate=1.0))
    scopes = ("o:api", f"to:a{SEP}api")
    assert pace(lua, NOW, "a1", *scopes) is None
    assert pace(lua, NOW + 0.2, "a2", *scopes) == pytest.approx(0.8)
    assert r.zcard(f"adm:starts{SEP}o:api") == 1  # a start that waits is logged nowhere
    limits(r, "tools", "api", Limits())
    assert pace(lua, NOW + 0.3, "a2", *scopes) is None


# -- withdraw ---------------------------------------------------------------------------------


def test_withdraw_takes_out_the_waiting_calls_past_their_deadline(lua: Lua, r: redis.Redis) -> None:
    due, later, never = (
        call("a", "a1", deadline=NOW + 5),
        call("a", "a2", deadline=NOW + 50),
        call("a", "a3"),
    )
    lua("admission/enqueue", ENQUEUE_KEYS, [NOW, *_entries([due, later, never])])
    flat = lua("admission/withdraw", WITHDRAW_KEYS, ["deadline", NOW + 10])
    assert [v.decode() for v in flat] == [due.member, "payload:a1"]
    assert waiting_ids(r) == ["a2", "a3"]
    assert r.hget("adm:info", due.member) is None and r.hget("adm:payloads", due.member) is None
    assert r.zrange("adm:deadlines", 0, -1) == [later.member.encode()]


def test_withdraw_of_a_run_takes_out_its_waiting_calls_only(lua: Lua, r: redis.Redis) -> None:
    workers(r, 1)
    first, mine, other = call("a", "a1"), call("a", "a2"), call("a", "o1", run="other")
    admit(lua, enqueue=[first, mine, other])  # first is admitted: no longer waiting
    flat = lua("admission/withdraw", WITHDRAW_KEYS, ["run", "a", f"a{SEP}run{SEP}"])
    assert [v.decode() for v in flat] == [mine.member, "payload:a2"]
    assert waiting_ids(r) == ["o1"]
