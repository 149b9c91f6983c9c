"""The other stores' scripts, each on its own: the circuit's window (kernel/stores/lua/circuit/),
the turn's and the gate's compare-and-set (turns/, gates/) and the reconciler's claims and
schedule (reconciling/)."""

from __future__ import annotations

import hashlib
import json

import redis

from tests.unit.lua.conftest import Lua

WINDOW_KEYS = ["cb:window", "cb:state", "cb:calls"]
WINDOW_S, MIN_CALLS, RATE, BUCKETS = 60.0, 4, 0.5, 12
AT_1000 = 200
"""The bucket of second 1000 (buckets of WINDOW_S / BUCKETS = 5 s)."""


def count(lua: Lua, now: float, calls: list[str], failed: int) -> list[str]:
    """count.lua as CircuitBreaker.count runs it: the call ids it returns (opened) or []."""
    args = [now, WINDOW_S, MIN_CALLS, RATE, BUCKETS, failed, *calls]
    return sorted(m.decode() for m in lua("circuit/count", WINDOW_KEYS, args))


# -- circuit/count ----------------------------------------------------------------------------


def test_failures_past_the_error_rate_open_the_circuit_and_name_the_windows_calls(
    lua: Lua, r: redis.Redis
) -> None:
    assert count(lua, 1000.0, ["ok1", "ok2"], 0) == []
    assert count(lua, 1001.0, ["f1"], 1) == []  # 1 of 3: under the rate, and under min_calls
    assert count(lua, 1002.0, ["f2"], 1) == ["f1", "f2", "ok1", "ok2"]  # 2 of 4
    state = json.loads(r.get("cb:state") or b"{}")
    assert state == {"opened_at": 1002.0, "failed": 2, "calls": 4}
    assert count(lua, 1003.0, ["f3"], 1) == []  # already open: no second opening
    assert 60 < r.ttl("cb:window") <= 120


def test_successes_alone_never_open_the_circuit(lua: Lua, r: redis.Redis) -> None:
    r.hset("cb:window", mapping={f"{AT_1000}:n": 10, f"{AT_1000}:f": 9})
    assert count(lua, 1000.0, ["ok"], 0) == []
    assert r.exists("cb:state") == 0


def test_failures_that_left_the_window_no_longer_count(lua: Lua, r: redis.Redis) -> None:
    assert count(lua, 1000.0, ["f1", "f2", "f3"], 3) == []  # 3 calls: under min_calls
    assert count(lua, 1060.0, ["f4"], 1) == []  # a window later: f1..f3 are gone
    assert r.hget("cb:window", f"{AT_1000}:n") is None
    r.delete(*WINDOW_KEYS)
    assert count(lua, 1000.0, ["f1", "f2", "f3"], 3) == []
    assert count(lua, 1030.0, ["f4"], 1) == ["f1", "f2", "f3", "f4"]  # within the window


def test_the_calls_named_are_those_of_the_window(lua: Lua, r: redis.Redis) -> None:
    count(lua, 1000.0, ["old"], 0)
    count(lua, 1100.0, ["ok1", "ok2"], 0)
    assert count(lua, 1101.0, ["f1", "f2"], 2) == ["f1", "f2", "ok1", "ok2"]


# -- turns/write ------------------------------------------------------------------------------


def write(lua: Lua, version: str, deletes: list[str], sets: list[str]) -> int:
    """write.lua as TurnHashes.write runs it (ttl 60)."""
    return int(lua("turns/write", ["turn"], [version, 60, len(deletes), *deletes, *sets]))


def test_a_turn_write_applies_only_at_the_version_read(lua: Lua, r: redis.Redis) -> None:
    assert write(lua, "", [], ["plan", "p", "e:c1", "o1"]) == 1
    assert r.hgetall("turn") == {b"v": b"1", b"plan": b"p", b"e:c1": b"o1"}
    assert 0 < r.ttl("turn") <= 60
    assert write(lua, "", [], ["plan", "other"]) == 0  # another instance wrote meanwhile
    assert write(lua, "1", ["e:c1"], ["o:c1", "o1"]) == 2
    assert r.hgetall("turn") == {b"v": b"2", b"plan": b"p", b"o:c1": b"o1"}


def test_a_turn_kept_forever_has_no_expiry(lua: Lua, r: redis.Redis) -> None:
    # ledger_retention_s=0 means forever: the turn must not expire at once (EXPIRE 0 deletes).
    assert int(lua("turns/write", ["turn"], ["", 0, 0, "plan", "p"])) == 1
    assert r.hgetall("turn") == {b"v": b"1", b"plan": b"p"} and r.ttl("turn") == -1
    assert write(lua, "1", [], ["o:c1", "o1"]) == 2 and 0 < r.ttl("turn") <= 60
    assert int(lua("turns/write", ["turn"], ["2", 0, 0])) == 3 and r.ttl("turn") == -1


def test_a_turn_write_of_thousands_of_fields_goes_through(lua: Lua, r: redis.Redis) -> None:
    sets = [x for i in range(1500) for x in (f"o:c{i}", f"out-{i}")]
    assert write(lua, "", [], sets) == 1
    assert r.hlen("turn") == 1501
    assert write(lua, "1", [f"o:c{i}" for i in range(1200)], []) == 2
    assert r.hlen("turn") == 301


def test_a_turn_stored_whole_as_one_string_is_replaced_by_its_hash(
    lua: Lua, r: redis.Redis
) -> None:
    legacy = b'{"plan": "p"}'  # as versions before 0.2 wrote a turn
    r.set("turn", legacy)
    assert write(lua, "not-its-sha", [], ["plan", "p"]) == 0
    assert r.get("turn") == legacy
    assert write(lua, hashlib.sha1(legacy).hexdigest(), [], ["plan", "p"]) == 1
    assert r.hgetall("turn") == {b"v": b"1", b"plan": b"p"}


# -- gates/cas --------------------------------------------------------------------------------


def test_a_gate_changes_only_if_it_still_holds_what_was_read(lua: Lua, r: redis.Redis) -> None:
    absent = hashlib.sha1(b"").hexdigest()
    assert lua("gates/cas", ["gate"], [absent, '{"n": 1}', 60]) == 1
    assert r.get("gate") == b'{"n": 1}' and 0 < r.ttl("gate") <= 60
    assert lua("gates/cas", ["gate"], [absent, '{"n": 2}', 60]) == 0
    read = hashlib.sha1(b'{"n": 1}').hexdigest()
    assert lua("gates/cas", ["gate"], [read, '{"n": 2}', 60]) == 1
    assert r.get("gate") == b'{"n": 2}'


def test_a_gate_kept_forever_has_no_expiry(lua: Lua, r: redis.Redis) -> None:
    absent = hashlib.sha1(b"").hexdigest()  # ledger_retention_s=0: SET ... EX 0 is an error
    assert lua("gates/cas", ["gate"], [absent, '{"n": 1}', 0]) == 1
    assert r.get("gate") == b'{"n": 1}' and r.ttl("gate") == -1


# -- reconciling/ -----------------------------------------------------------------------------


def test_an_attempt_is_claimed_for_reconciling_once(lua: Lua, r: redis.Redis) -> None:
    assert lua("reconciling/claim", ["recon"], [1]) == 1
    assert r.hgetall("recon") == {
        b"token": b"1", b"probes": b"0", b"awaiting_probe": b"0", b"status": b"reconciling",
        b"claimant": b"",
    }  # fmt: skip
    assert lua("reconciling/claim", ["recon"], [1]) == 0  # a redelivered outcome
    r.hset("recon", mapping={"probes": 2, "status": "handed_over"})
    assert lua("reconciling/claim", ["recon"], [0]) == 0  # an older attempt's outcome
    assert lua("reconciling/claim", ["recon"], [2]) == 1  # a retry's: starts afresh
    assert r.hmget("recon", "token", "probes", "status") == [b"2", b"0", b"reconciling"]


def test_the_record_that_claimed_an_attempt_may_claim_it_again(lua: Lua, r: redis.Redis) -> None:
    """Found by the simulator (seed 144): the claim's reply was lost, the reconciler handled
    the record again, its claim said "already claimed", and nobody ever retried the call."""
    assert lua("reconciling/claim", ["recon"], [1, "outcomes:0:7"]) == 1
    r.hset("recon", "probes", 1)
    assert lua("reconciling/claim", ["recon"], [1, "outcomes:0:7"]) == 1  # the same record
    assert r.hget("recon", "probes") == b"1"  # goes on where it stands
    assert lua("reconciling/claim", ["recon"], [1, "outcomes:0:8"]) == 0  # a duplicate
    assert lua("reconciling/claim", ["recon"], [1, ""]) == 0


def test_each_awaited_probe_answer_is_taken_once(lua: Lua, r: redis.Redis) -> None:
    lua("reconciling/claim", ["recon"], [1])
    assert lua("reconciling/take_probe", ["recon"]) == -1  # no probe sent
    r.hset("recon", "awaiting_probe", 1)
    assert lua("reconciling/take_probe", ["recon"]) == 1
    assert lua("reconciling/take_probe", ["recon"]) == -1  # a duplicate answer
    r.hset("recon", "awaiting_probe", 1)
    assert lua("reconciling/take_probe", ["recon"]) == 2


def test_the_record_that_took_a_probe_answer_may_take_it_again(lua: Lua, r: redis.Redis) -> None:
    """Its reply was lost, or its reconciler died before acting: the same record goes on with
    the same count; another record carrying the same answer (a duplicate) does not."""
    lua("reconciling/claim", ["recon"], [1])
    r.hset("recon", "awaiting_probe", 1)
    assert lua("reconciling/take_probe", ["recon"], ["outcomes:0:9"]) == 1
    assert lua("reconciling/take_probe", ["recon"], ["outcomes:0:9"]) == 1  # the same record
    assert lua("reconciling/take_probe", ["recon"], ["outcomes:0:12"]) == -1  # a duplicate
    assert lua("reconciling/take_probe", ["recon"], [""]) == -1


def test_due_actions_are_taken_once_a_lease_and_at_most_a_hundred_at_a_time(
    lua: Lua, r: redis.Redis
) -> None:
    r.zadd("due", {f"a{i:03}": 1000 + i for i in range(150)})
    r.zadd("due", {"later": 5000})
    first = lua("reconciling/pop_due", ["due"], [2000, 2060.5])
    assert [m.decode() for m in first] == [f"a{i:03}" for i in range(100)]
    second = lua("reconciling/pop_due", ["due"], [2000, 2060.5])
    assert [m.decode() for m in second] == [f"a{i:03}" for i in range(100, 150)]
    assert lua("reconciling/pop_due", ["due"], [2000, 2060.5]) == []
    # Taken, not removed: each is due again when its lease ends, unless done by then.
    assert r.zscore("due", "a000") == 2060.5 and r.zcard("due") == 151
    for i in range(149):
        assert lua("reconciling/done_due", ["due"], [f"a{i:03}", 2060.5]) == 1
    assert lua("reconciling/done_due", ["due"], ["a000", 2060.5]) == 0  # done already
    again = lua("reconciling/pop_due", ["due"], [2061, 2121.25])
    assert [m.decode() for m in again] == ["a149"]  # its reconciler never said it was done
    assert r.zrange("due", 0, -1) == [b"a149", b"later"]


def test_an_action_scheduled_again_while_taken_is_not_removed_as_done(
    lua: Lua, r: redis.Redis
) -> None:
    now = 1765063294.123456  # a clock's time: the lease's end goes through Redis and back
    r.zadd("due", {"probe": now - 1})
    [taken] = lua("reconciling/pop_due", ["due"], [now, now + 60])
    r.zadd("due", {"probe": now + 5})  # the same action, scheduled again meanwhile
    assert lua("reconciling/done_due", ["due"], [taken, now + 60]) == 0
    assert r.zscore("due", "probe") == now + 5
    r.zadd("due", {"probe": now + 60})
    assert lua("reconciling/done_due", ["due"], [taken, now + 60]) == 1
