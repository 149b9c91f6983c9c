"""The ledger's scripts (kernel/stores/lua/ledger/), each on its own: which state change each
allows, and what it answers when it refuses one."""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from kernel.stores.ledger import CallPolicy
from tests.unit.lua.conftest import Lua

CALL, AUDIT, LEASES, CANCELLED = "tf:call", "tf:audit", "tf:leases", "tf:cancelled"
MEMBER = "t\x1frun\x1fc1"
"""The call's name in the lease index (``lease_member``)."""


def _fields(**changed: Any) -> list[Any]:
    """create.lua's ARGV: fingerprint, idem key, run, turn, tool, pool, now, arguments, index,
    dispatch, policy, trace id."""
    fields: dict[str, Any] = {
        "fingerprint": "fp", "idem": "idem-1", "run": "run", "turn": 0, "tool": "add",
        "pool": "default", "now": 100.0, "arguments": '{"a": 1}', "index": 0, "dispatch": "1",
        "policy": CallPolicy().encode(), "trace": "",
    }  # fmt: skip
    fields.update(changed)
    return list(fields.values())


def _create(lua: Lua, **changed: Any) -> list[int]:
    return [int(v) for v in lua("ledger/create", [CALL, AUDIT], _fields(**changed))]


def _begin(lua: Lua, token: int = 1, worker: str = "w1", lease_s: float = 30) -> tuple[str, str]:
    verdict, outcome = lua(
        "ledger/begin", [CALL, AUDIT, LEASES, CANCELLED], [token, worker, lease_s, MEMBER, "v1"]
    )
    return verdict.decode(), outcome.decode()


def _finish(lua: Lua, token: int = 1, failure: str = "") -> str:
    outcome = json.dumps({"status": "succeeded", "effect": "applied", "output": "3"})
    args = [token, outcome, "succeeded", "applied", 105.0, MEMBER, failure]
    (reply,) = lua("ledger/finish", [CALL, AUDIT, LEASES], args)
    return str(reply.decode())


def _entry(r: redis.Redis) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in r.hgetall(CALL).items()}


def _events(r: redis.Redis) -> list[str]:
    return [json.loads(e)["event"] for e in r.lrange(AUDIT, 0, -1)]


# -- create, create_fresh, dispatch -----------------------------------------------------------


def test_create_records_a_planned_call_and_dispatches_its_first_attempt(
    lua: Lua, r: redis.Redis
) -> None:
    assert _create(lua, dispatch="0") == [0, 0]
    entry = _entry(r)
    assert entry["state"] == "planned"
    assert (entry["fingerprint"], entry["idempotency_key"], entry["tool_name"]) == (
        "fp", "idem-1", "add",
    )  # fmt: skip
    assert (entry["attempts"], entry["fencing_token"]) == ("0", "0")
    assert _create(lua) == [1, 1]
    entry = _entry(r)
    assert (entry["state"], entry["attempts"], entry["dispatched_at"]) == ("dispatched", "1", "100")
    assert "dispatch_reason" not in entry  # 'planned' is the default reason
    assert r.llen(AUDIT) == 0  # a plain run keeps its events in the entry


def test_create_again_leaves_the_entry_and_resends_the_same_attempt(
    lua: Lua, r: redis.Redis
) -> None:
    assert _create(lua) == [1, 1]
    assert _create(lua, fingerprint="other", tool="sub") == [1, 1]
    assert (_entry(r)["fingerprint"], _entry(r)["tool_name"]) == ("fp", "add")


def test_create_sends_nothing_for_a_started_or_finished_call(lua: Lua, r: redis.Redis) -> None:
    _create(lua)
    assert _begin(lua)[0] == "run"
    assert _create(lua) == [-3, 0]
    assert _finish(lua) == "ok"
    assert _create(lua) == [-2, 0]


def test_create_fresh_writes_every_call_or_none(lua: Lua, r: redis.Redis) -> None:
    approvals, held = "tf:approvals", "tf:held"
    keys = [approvals, held, "tf:c1", "tf:a1", "tf:c2", "tf:a2"]
    per_call = _fields()
    del per_call[9], per_call[6]  # no dispatch flag, and now comes first
    assert len(per_call) == 10
    args = [100.0, *per_call, *per_call]
    assert lua("ledger/create_fresh", keys, args) == 2
    for call in ("tf:c1", "tf:c2"):
        assert r.hmget(call, "state", "attempts", "fencing_token") == [b"dispatched", b"1", b"1"]
    r.flushall()
    r.sadd(held, "c0")  # the run holds a wrong effect: the planner must look first
    assert lua("ledger/create_fresh", keys, args) == 0
    assert r.exists("tf:c1", "tf:c2") == 0
    r.flushall()
    r.hset("tf:c2", "state", "planned")  # one call exists already
    assert lua("ledger/create_fresh", keys, args) == 0
    assert r.exists("tf:c1") == 0


def test_dispatch_is_idempotent_and_a_retry_fences_off_the_attempt_it_follows(
    lua: Lua, r: redis.Redis
) -> None:
    assert [int(v) for v in lua("ledger/dispatch", [CALL, AUDIT], [100.0, "planned", ""])] == [
        -1, 0,
    ]  # fmt: skip
    _create(lua, dispatch="0")
    dispatch = [100.0, "planned", ""]
    assert [int(v) for v in lua("ledger/dispatch", [CALL, AUDIT], dispatch)] == [1, 1]
    assert [int(v) for v in lua("ledger/dispatch", [CALL, AUDIT], dispatch)] == [1, 1]
    assert _begin(lua)[0] == "run"
    assert _finish(lua) == "ok"
    assert [int(v) for v in lua("ledger/dispatch", [CALL, AUDIT], dispatch)] == [-2, 0]
    retry = [110.0, "probe: not applied", 1]
    assert [int(v) for v in lua("ledger/dispatch", [CALL, AUDIT], retry)] == [2, 2]
    # The same retry again (carried out again): the attempt it issued, while dispatched.
    assert [int(v) for v in lua("ledger/dispatch", [CALL, AUDIT], retry)] == [2, 2]
    assert r.hmget(CALL, "state", "keep") == [b"dispatched", b"1"]
    # The plain run moved into the chain before the retry's event.
    assert _events(r) == ["planned", "dispatched", "started", "finished", "dispatched"]
    last = json.loads(r.lindex(AUDIT, -1) or b"{}")
    assert (last["attempt"], last["fencing_token"], last["reason"]) == (
        2, 2, "probe: not applied",
    )  # fmt: skip
    assert _begin(lua, token=1)[0] == "stale"  # the old holder is fenced off
    assert _begin(lua, token=2)[0] == "run"
    # Carried out again once its attempt began: nothing, not a third attempt beside it.
    assert [int(v) for v in lua("ledger/dispatch", [CALL, AUDIT], retry)] == [-4, 0]
    assert r.hmget(CALL, "state", "attempts") == [b"started", b"2"]


# -- begin, renew, upstream_ref ---------------------------------------------------------------


def test_begin_starts_the_current_attempt_once(lua: Lua, r: redis.Redis) -> None:
    _create(lua)
    before = time.time()
    assert _begin(lua) == ("run", "")
    entry = _entry(r)
    assert (entry["state"], entry["worker_id"], entry["tool_version"]) == ("started", "w1", "v1")
    lease = r.zscore(LEASES, MEMBER)
    assert lease is not None and before + 29 < lease < time.time() + 31
    assert float(entry["lease_until"]) == lease
    assert _begin(lua, worker="w2") == ("busy", "")  # its holder's lease runs
    assert _entry(r)["worker_id"] == "w1"


def test_begin_after_the_holders_lease_ran_out_says_the_effect_is_unknown(
    lua: Lua, r: redis.Redis
) -> None:
    _create(lua)
    _begin(lua)
    r.hset(CALL, "lease_until", time.time() - 1)  # its worker stopped renewing
    assert _begin(lua, worker="w2") == ("unknown", "")
    assert _entry(r)["state"] == "started"  # never run again blindly


def test_begin_refuses_a_stale_token_a_missing_call_and_a_cancelled_run(
    lua: Lua, r: redis.Redis
) -> None:
    assert _begin(lua) == ("missing", "")
    _create(lua)
    assert _begin(lua, token=0) == ("stale", "")
    r.set(CANCELLED, 1)
    assert _begin(lua) == ("cancelled", "")
    assert _entry(r)["state"] == "dispatched"


def test_begin_of_a_finished_call_hands_back_its_outcome(lua: Lua, r: redis.Redis) -> None:
    _create(lua)
    _begin(lua)
    _finish(lua)
    verdict, outcome = _begin(lua)
    assert verdict == "done" and json.loads(outcome)["output"] == "3"


def test_begin_takes_a_batch_and_answers_each_call(lua: Lua, r: redis.Redis) -> None:
    _create(lua)
    keys = [CALL, AUDIT, LEASES, CANCELLED, "tf:other", "tf:other-audit", LEASES, CANCELLED]
    args = [1, "w1", 30, MEMBER, "v1", 1, "w1", 30, "t\x1frun\x1fc2", ""]
    assert lua("ledger/begin", keys, args) == [b"run", b"", b"missing", b""]


def test_begin_of_a_kept_call_appends_started_to_its_chain(lua: Lua, r: redis.Redis) -> None:
    _create(lua)
    r.hset(CALL, "keep", 1)
    _begin(lua)
    assert _events(r) == ["started"]


def test_renew_extends_only_the_holders_lease(lua: Lua, r: redis.Redis) -> None:
    _create(lua)
    renew = [1, "w1", 60, MEMBER]
    assert lua("ledger/renew", [CALL, LEASES], renew) == 0  # not started
    _begin(lua, lease_s=1)
    assert lua("ledger/renew", [CALL, LEASES], [1, "w2", 60, MEMBER]) == 0
    assert lua("ledger/renew", [CALL, LEASES], [2, "w1", 60, MEMBER]) == 0
    assert lua("ledger/renew", [CALL, LEASES], renew) == 1
    lease = r.zscore(LEASES, MEMBER)
    assert lease is not None and lease > time.time() + 55
    assert float(_entry(r)["lease_until"]) == lease


def test_renew_never_puts_back_a_lease_the_index_dropped(lua: Lua, r: redis.Redis) -> None:
    _create(lua)
    _begin(lua)
    r.zrem(LEASES, MEMBER)  # the reconciler took the expired lease out
    assert lua("ledger/renew", [CALL, LEASES], [1, "w1", 60, MEMBER]) == 1
    assert r.zscore(LEASES, MEMBER) is None  # ZADD XX


def test_upstream_ref_is_recorded_for_the_running_attempt_only(lua: Lua, r: redis.Redis) -> None:
    _create(lua)
    assert lua("ledger/upstream_ref", [CALL, AUDIT], [1, "T-9"]) == 0  # not started
    _begin(lua)
    assert lua("ledger/upstream_ref", [CALL, AUDIT], [2, "T-9"]) == 0  # fenced off
    assert lua("ledger/upstream_ref", [CALL, AUDIT], [1, "T-9"]) == 1
    assert _entry(r)["upstream_ref"] == "T-9" and "upstream_ref_at" in _entry(r)
    assert r.llen(AUDIT) == 0  # in the entry, for a plain run


def test_heartbeat_keeps_the_running_attempts_details_and_extends_its_lease(
    lua: Lua, r: redis.Redis
) -> None:
    _create(lua)
    beat = [1, "w1", 60, MEMBER, '{"page": 3}']
    assert lua("ledger/heartbeat", [CALL, LEASES], beat) == 0  # not started
    assert "heartbeat" not in _entry(r)
    _begin(lua, lease_s=1)
    assert lua("ledger/heartbeat", [CALL, LEASES], [2, "w1", 60, MEMBER, "{}"]) == 0  # fenced
    assert lua("ledger/heartbeat", [CALL, LEASES], [1, "w2", 60, MEMBER, "{}"]) == 0  # not its
    assert "heartbeat" not in _entry(r)
    assert lua("ledger/heartbeat", [CALL, LEASES], beat) == 1
    entry = _entry(r)
    assert entry["heartbeat"] == '{"page": 3}' and float(entry["heartbeat_at"]) > 0
    lease = r.zscore(LEASES, MEMBER)
    assert lease is not None and lease > time.time() + 55
    assert float(entry["lease_until"]) == lease
    assert _finish(lua) == "ok"
    later = [1, "w1", 60, MEMBER, '{"page": 4}']
    assert lua("ledger/heartbeat", [CALL, LEASES], later) == 0  # finished: too late
    assert _entry(r)["heartbeat"] == '{"page": 3}'  # a retry is given the last one written


def _never_started(lua: Lua, token: int = 1) -> str:
    outcome = json.dumps({"status": "timed_out", "effect": "not_executed"})
    return str(lua("ledger/never_started", [CALL, AUDIT], [token, outcome, 107.0, 5]).decode())


def test_never_started_ends_an_attempt_only_while_nothing_started_it(
    lua: Lua, r: redis.Redis
) -> None:
    assert _never_started(lua) == "missing"
    _create(lua)
    assert _never_started(lua, token=2) == "stale"
    assert _never_started(lua) == "ok"
    entry = _entry(r)
    assert entry["state"] == "finished" and "started_at" not in entry
    assert json.loads(entry["outcome"])["effect"] == "not_executed"
    assert _events(r)[-1] == "not_started_in_time" and entry["keep"] == "1"
    assert _begin(lua)[0] == "done"  # a redelivered command never starts it now
    assert _never_started(lua) == "finished"


def test_never_started_leaves_a_started_call_to_its_holder(lua: Lua, r: redis.Redis) -> None:
    _create(lua)
    _begin(lua)
    assert _never_started(lua) == "started"
    assert _entry(r)["state"] == "started" and "outcome" not in _entry(r)


def _defer(lua: Lua, token: int = 1, worker: str = "w1") -> int:
    return int(lua("ledger/defer", [CALL, AUDIT, LEASES], [token, worker, MEMBER, 3700.0, 100.0]))


def _complete(lua: Lua, token: int = 1, output: str = "done") -> str:
    outcome = json.dumps({"status": "succeeded", "effect": "applied", "output": output})
    return str(lua("ledger/complete", [CALL, AUDIT], [token, outcome, 200.0, "farm"]).decode())


def test_defer_parks_the_holders_started_attempt_until_its_deadline(
    lua: Lua, r: redis.Redis
) -> None:
    _create(lua)
    assert _defer(lua) == 0  # not started
    _begin(lua)
    assert _defer(lua, token=2) == 0 and _defer(lua, worker="w2") == 0  # not this holder's
    assert _defer(lua) == 1
    entry = _entry(r)
    assert (entry["state"], entry["deferred_until"], entry["lease_until"]) == (
        "deferred", "3700.0", "3700.0",
    )  # fmt: skip
    assert r.zscore(LEASES, MEMBER) == 3700.0  # due for the reconciler at its deadline
    assert _events(r) == ["planned", "dispatched", "started", "deferred"]
    assert _begin(lua) == ("deferred", "")  # a redelivered command leaves it alone
    assert _begin(lua, token=2) == ("deferred", "")


def test_an_overdue_deferral_becomes_a_started_call_whose_holder_is_gone(
    lua: Lua, r: redis.Redis
) -> None:
    _create(lua)
    _begin(lua)
    assert lua("ledger/expire_deferral", [CALL, AUDIT], [5000.0]) == 0  # not deferred
    _defer(lua)
    assert lua("ledger/expire_deferral", [CALL, AUDIT], [3600.0]) == 0  # not due yet
    assert _entry(r)["state"] == "deferred"
    assert lua("ledger/expire_deferral", [CALL, AUDIT], [3701.0]) == 1
    entry = _entry(r)
    assert (entry["state"], entry["lease_until"]) == ("started", "0")
    assert _events(r)[-1] == "deferral_expired"
    assert _begin(lua)[0] == "unknown"  # as a call whose worker was lost
    assert _complete(lua) == "started"  # a late completion changes nothing


def test_complete_ends_a_deferred_call_once_and_only_with_its_attempts_token(
    lua: Lua, r: redis.Redis
) -> None:
    assert _complete(lua) == "missing"
    _create(lua)
    _begin(lua)
    assert _complete(lua) == "started"  # not deferred: the running body reports itself
    _defer(lua)
    assert _complete(lua, token=2) == "stale"
    assert _complete(lua) == "ok"
    entry = _entry(r)
    assert entry["state"] == "finished" and json.loads(entry["outcome"])["output"] == "done"
    assert _complete(lua, output="again") == "done"  # a repeated completion changes nothing
    assert json.loads(_entry(r)["outcome"])["output"] == "done"
    assert _events(r).count("completed") == 1


# -- finish, commit, settle -------------------------------------------------------------------


def test_finish_stores_the_current_attempts_outcome_once(lua: Lua, r: redis.Redis) -> None:
    assert _finish(lua) == "missing"
    _create(lua)
    _begin(lua)
    assert _finish(lua, token=2) == "stale"
    failure = json.dumps({"type": "ValueError", "message": "no", "traceback": "", "attempt": 1})
    assert _finish(lua, failure=failure) == "ok"
    entry = _entry(r)
    assert (entry["state"], entry["lease_until"]) == ("finished", "0")
    assert float(entry["finished_at"]) == 105.0
    assert json.loads(entry["outcome"])["effect"] == "applied"
    assert json.loads(entry["failure"])["type"] == "ValueError"
    assert r.zscore(LEASES, MEMBER) is None
    assert _finish(lua) == "done"


def test_finish_keeps_every_failed_attempts_failure_the_latest_where_it_always_was(
    lua: Lua, r: redis.Redis
) -> None:
    def failure(attempt: int) -> str:
        return json.dumps({"type": "OSError", "message": f"try {attempt}", "attempt": attempt})

    _create(lua)
    _begin(lua)
    assert _finish(lua, failure=failure(1)) == "ok"
    for attempt in (2, 3):  # forced retries (the reconciler's), each failing again
        retry = [110.0 + attempt, "transient", attempt - 1]
        assert [int(v) for v in lua("ledger/dispatch", [CALL, AUDIT], retry)] == [attempt] * 2
        assert _begin(lua, token=attempt)[0] == "run"
        assert _finish(lua, token=attempt, failure=failure(attempt)) == "ok"
    entry = _entry(r)
    assert json.loads(entry["failure"])["message"] == "try 3"  # what earlier readers read
    assert json.loads(entry["failure:1"])["message"] == "try 1"
    assert json.loads(entry["failure:2"])["message"] == "try 2"
    assert "failure:3" not in entry  # the latest is not kept twice
    # A retry that succeeds (no failure) leaves every record in place.
    assert [int(v) for v in lua("ledger/dispatch", [CALL, AUDIT], [120.0, "t", 3])] == [4, 4]
    _begin(lua, token=4)
    assert _finish(lua, token=4) == "ok"
    assert {k for k in _entry(r) if k.startswith("failure")} == {
        "failure", "failure:1", "failure:2",
    }  # fmt: skip


def test_finish_takes_a_batch(lua: Lua, r: redis.Redis) -> None:
    _create(lua)
    _begin(lua)
    outcome = json.dumps({"status": "failed", "effect": "not_executed"})
    one = [1, outcome, "failed", "not_executed", 105.0, MEMBER, ""]
    keys = [CALL, AUDIT, LEASES, CALL, AUDIT, LEASES, "tf:none", "tf:none-audit", LEASES]
    assert lua("ledger/finish", keys, one * 3) == [b"ok", b"done", b"missing"]


def test_commit_marks_finished_calls_committed_and_lets_plain_runs_expire(
    lua: Lua, r: redis.Redis
) -> None:
    _create(lua)
    _begin(lua)
    _finish(lua)
    others = ["tf:kept", "tf:kept-audit", "tf:running", "tf:running-audit"]
    r.hset("tf:kept", mapping={"state": "finished", "keep": 1})
    r.rpush("tf:kept-audit", "{}")
    r.hset("tf:running", "state", "started")
    assert lua("ledger/commit", [CALL, AUDIT, *others], [600]) == 1
    assert r.hget(CALL, "state") == b"committed"
    assert 0 < r.ttl(CALL) <= 600
    assert r.hget("tf:kept", "state") == b"committed"
    assert r.ttl("tf:kept") == -1 and r.ttl("tf:kept-audit") == -1  # kept: never expires
    assert r.hget("tf:running", "state") == b"started"  # not finished: left as it is


def test_commit_with_no_retention_keeps_every_call(lua: Lua, r: redis.Redis) -> None:
    r.hset(CALL, "state", "finished")
    lua("ledger/commit", [CALL, AUDIT], [0])
    assert r.hget(CALL, "state") == b"committed" and r.ttl(CALL) == -1


def test_settle_commits_a_call_that_never_ran(lua: Lua, r: redis.Redis) -> None:
    rejected = json.dumps({"status": "rejected", "effect": "not_executed"})
    assert lua("ledger/settle", [CALL, AUDIT], [rejected, 101.0, 600]) == 0  # missing
    _create(lua, dispatch="0")
    assert lua("ledger/settle", [CALL, AUDIT], [rejected, 101.0, 600]) == 1
    entry = _entry(r)
    assert (entry["state"], float(entry["settled_at"])) == ("committed", 101.0)
    assert json.loads(entry["outcome"])["status"] == "rejected"
    assert 0 < r.ttl(CALL) <= 600
    assert lua("ledger/settle", [CALL, AUDIT], [rejected, 102.0, 600]) == 0  # committed


def test_settle_leaves_a_finished_call_alone(lua: Lua, r: redis.Redis) -> None:
    _create(lua)
    _begin(lua)
    _finish(lua)
    assert lua("ledger/settle", [CALL, AUDIT], ['{"status": "rejected"}', 106.0, 600]) == 0
    assert json.loads(_entry(r)["outcome"])["status"] == "succeeded"


# -- resolve, append, audit -------------------------------------------------------------------


def test_resolve_replaces_the_outcome_whatever_the_state_and_keeps_the_call(
    lua: Lua, r: redis.Redis
) -> None:
    verdict = json.dumps({"status": "succeeded", "effect": "applied", "resolved": True})
    event = json.dumps({"event": "resolved_applied", "at": 120.0})
    assert lua("ledger/resolve", [CALL, AUDIT, LEASES], [verdict, event, MEMBER]) == 0
    _create(lua)
    _begin(lua)
    assert lua("ledger/resolve", [CALL, AUDIT, LEASES], [verdict, event, MEMBER]) == 1
    entry = _entry(r)
    assert (entry["state"], entry["lease_until"], entry["keep"]) == ("committed", "0", "1")
    assert json.loads(entry["outcome"])["resolved"] is True
    assert r.zscore(LEASES, MEMBER) is None
    assert _events(r) == ["planned", "dispatched", "started", "resolved_applied"]
    assert r.ttl(CALL) == -1


def test_append_sets_fields_first_and_keeps_the_call(lua: Lua, r: redis.Redis) -> None:
    _create(lua, dispatch="0")
    event = json.dumps({"event": "approval", "approval": "approved", "at": 101.0})
    lua("ledger/append", [CALL, AUDIT], [event, "approval", "approved", "pending_approval", "0"])
    assert r.hmget(CALL, "approval", "pending_approval", "keep") == [b"approved", b"0", b"1"]
    assert _events(r) == ["planned", "approval"]
    lua("ledger/append", [CALL, AUDIT], [json.dumps({"event": "probe", "at": 102.0})])
    assert _events(r) == ["planned", "approval", "probe"]


def test_audit_reads_a_plain_run_from_the_entry_and_a_kept_call_from_its_chain(
    lua: Lua, r: redis.Redis
) -> None:
    _create(lua)
    _begin(lua)
    _finish(lua)
    chain, plain = lua("ledger/audit", [CALL, AUDIT])
    assert chain == []
    events = [json.loads(e) for e in plain]
    assert [e["event"] for e in events] == ["planned", "dispatched", "started", "finished"]
    assert (events[1]["attempt"], events[1]["reason"]) == (1, "planned")
    assert (events[2]["worker"], events[3]["effect"]) == ("w1", "applied")
    lua("ledger/append", [CALL, AUDIT], [json.dumps({"event": "probe", "at": 110.0})])
    chain, plain = lua("ledger/audit", [CALL, AUDIT])
    assert plain == []
    assert [json.loads(e)["event"] for e in chain] == [
        "planned", "dispatched", "started", "finished", "probe",
    ]  # fmt: skip
