"""The call ledger on the real Redis: the gate in front of user code."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable

import pytest
from redis.asyncio import Redis

from kernel.settings import Settings
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger, NewCall
from schemas import CallOutcome

pytestmark = pytest.mark.integration


def _call(call_id: str, run_id: str = "run") -> NewCall:
    return NewCall(call_id, "fp", "tf-key", run_id, 0, "tool", "default")


def _outcome(call_id: str, token: int) -> CallOutcome:
    return CallOutcome(
        tenant_id="t",
        run_id="run",
        turn_id=0,
        call_id=call_id,
        tool_name="tool",
        index=0,
        attempt=1,
        fencing_token=token,
        status="succeeded",
        effect="applied",
        output="done",
    )


@pytest.fixture
def call_id() -> str:
    return f"call-{uuid.uuid4().hex}"


async def test_create_never_overwrites_an_existing_entry(
    redis: Redis, call_id: str, settings: Settings
) -> None:
    ledger = Ledger(redis, Keys.of(settings))
    await ledger.create("t", "run", [_call(call_id)])
    await ledger.create("t", "run", [NewCall(call_id, "other", "k2", "run", 1, "tool", None)])
    entry = (await ledger.read("t", "run", [call_id]))[call_id]
    assert (entry.fingerprint, entry.state, entry.idempotency_key) == ("fp", "planned", "tf-key")


async def test_a_fresh_turn_is_recorded_as_create_and_dispatch_would_record_it(
    redis: Redis, settings: Settings
) -> None:
    keys = Keys.of(settings)
    ledger = Ledger(redis, keys)
    fresh = [f"call-{uuid.uuid4().hex}" for _ in range(3)]
    usual = [f"call-{uuid.uuid4().hex}" for _ in range(3)]

    run = f"run-{uuid.uuid4().hex}"

    def calls(ids: list[str]) -> list[NewCall]:
        return [NewCall(c, f"fp{i}", f"k{i}", run, 2, "tool", None, "{}", i)
                for i, c in enumerate(ids)]  # fmt: skip

    issued = await ledger.create_fresh("t", run, calls(fresh))
    assert issued == await ledger.create("t", run, calls(usual), dispatch=usual) == [(1, 1)] * 3

    async def stored(call_id: str) -> tuple[dict[bytes, bytes], list[str]]:
        entry = await redis.hgetall(keys.call("t", run, call_id))
        entry.pop(b"created_at"), entry.pop(b"dispatched_at")
        return entry, [e["event"] for e in await ledger.audit("t", run, call_id)]

    for a, b in zip(fresh, usual, strict=True):
        assert await stored(a) == await stored(b)
    assert (await stored(fresh[0]))[1] == ["planned", "dispatched"]


async def test_a_fresh_turn_writes_nothing_if_the_ledger_knows_a_call_or_the_run_has_decisions(
    redis: Redis, settings: Settings
) -> None:
    keys = Keys.of(settings)
    ledger = Ledger(redis, keys)
    known, new = f"call-{uuid.uuid4().hex}", f"call-{uuid.uuid4().hex}"
    await ledger.create("t", "run", [_call(known)])
    assert await ledger.create_fresh("t", "run", [_call(new), _call(known)]) is None
    assert await redis.exists(keys.call("t", "run", new), keys.audit("t", "run", new)) == 0
    run = f"run-{uuid.uuid4().hex}"
    await redis.hset(keys.approvals("t", run), "sticky:tool", '{"approve": false}')
    assert await ledger.create_fresh("t", run, [_call(new)]) is None
    assert await redis.exists(keys.call("t", "run", new)) == 0
    assert await ledger.create_fresh("t", "run", [_call(new)]) == [(1, 1)]
    # Thousands of calls (more keys than one Lua unpack takes): a known one at the end
    # still stops it; without it, all are recorded.
    many = [_call(f"call-{uuid.uuid4().hex}") for _ in range(5_000)]
    assert await ledger.create_fresh("t", "run", [*many, _call(known)]) is None
    assert await redis.exists(keys.call("t", "run", many[0].call_id)) == 0
    assert await ledger.create_fresh("t", "run", many) == [(1, 1)] * 5_000
    assert len(await ledger.read("t", "run", [c.call_id for c in many])) == 5_000


async def test_only_one_of_many_concurrent_workers_may_start_an_attempt(
    redis: Redis, call_id: str, settings: Settings
) -> None:
    ledger = Ledger(redis, Keys.of(settings))
    await ledger.create("t", "run", [_call(call_id)])
    _attempt, token = await ledger.dispatch("t", "run", call_id) or (0, 0)
    verdicts = await asyncio.gather(
        *(
            ledger.begin("t", "run", call_id, token=token, worker_id=f"w{i}", lease_s=30)
            for i in range(10)
        )
    )
    assert sorted(v for v, _ in verdicts) == ["busy"] * 9 + ["run"]


async def test_a_started_call_whose_lease_expired_is_unknown_not_rerun(
    redis: Redis, call_id: str, settings: Settings
) -> None:
    ledger = Ledger(redis, Keys.of(settings))
    await ledger.create("t", "run", [_call(call_id)])
    _attempt, token = await ledger.dispatch("t", "run", call_id) or (0, 0)
    assert (await ledger.begin("t", "run", call_id, token=token, worker_id="w1", lease_s=0.0))[
        0
    ] == "run"
    assert (await ledger.begin("t", "run", call_id, token=token, worker_id="w2", lease_s=30))[
        0
    ] == "unknown"


async def test_an_older_fencing_token_is_stale(
    redis: Redis, call_id: str, settings: Settings
) -> None:
    ledger = Ledger(redis, Keys.of(settings))
    await ledger.create("t", "run", [_call(call_id)])
    await ledger.dispatch("t", "run", call_id)
    _attempt, token = await ledger.dispatch("t", "run", call_id, "retry", retry_after=1) or (0, 0)
    assert (await ledger.begin("t", "run", call_id, token=token - 1, worker_id="w1", lease_s=30))[
        0
    ] == "stale"
    assert await ledger.finish(_outcome(call_id, token - 1)) == "stale"


async def test_releasing_planned_calls_dispatches_them_as_planned_not_as_retries(
    redis: Redis, call_id: str, settings: Settings
) -> None:
    """A capped turn's calls are created first and dispatched as they are released: a plain
    first attempt (its dispatch time kept, nothing kept past retention), never a retry."""
    keys = Keys.of(settings)
    ledger = Ledger(redis, keys)
    await ledger.create("t", "run", [_call(call_id)])
    assert await ledger.dispatch_many("t", "run", [call_id]) == [(1, 1)]
    assert await ledger.dispatch_many("t", "run", [call_id]) == [(1, 1)]
    keep, dispatched_at = await redis.hmget(keys.call("t", "run", call_id), "keep", "dispatched_at")
    assert keep is None and dispatched_at is not None


async def test_planner_dispatch_is_idempotent_and_a_forced_retry_fences_the_old_attempt(
    redis: Redis, call_id: str, settings: Settings
) -> None:
    ledger = Ledger(redis, Keys.of(settings))
    await ledger.create("t", "run", [_call(call_id)])
    assert await ledger.dispatch("t", "run", call_id) == (1, 1)
    assert await ledger.dispatch("t", "run", call_id) == (1, 1)
    await ledger.begin("t", "run", call_id, token=1, worker_id="w1", lease_s=30)
    assert await ledger.dispatch("t", "run", call_id) is None
    retry = await ledger.dispatch("t", "run", call_id, "probe: not applied", retry_after=1)
    assert retry == (2, 2)
    assert await ledger.finish(_outcome(call_id, 1)) == "stale"
    # The retry carried out again (its reconciler died after it): the same attempt, no third.
    assert await ledger.dispatch("t", "run", call_id, "probe: not applied", retry_after=1) == retry
    await ledger.begin("t", "run", call_id, token=2, worker_id="w2", lease_s=30)
    # Once that attempt started, carrying the retry out again sends nothing.
    assert await ledger.dispatch("t", "run", call_id, "probe: not applied", retry_after=1) is None


async def test_a_finished_call_returns_its_stored_outcome_instead_of_running(
    redis: Redis, call_id: str, settings: Settings
) -> None:
    ledger = Ledger(redis, Keys.of(settings))
    await ledger.create("t", "run", [_call(call_id)])
    _attempt, token = await ledger.dispatch("t", "run", call_id) or (0, 0)
    await ledger.begin("t", "run", call_id, token=token, worker_id="w1", lease_s=30)
    assert await ledger.finish(_outcome(call_id, token)) == "ok"
    verdict, stored = await ledger.begin(
        "t", "run", call_id, token=token, worker_id="w2", lease_s=30
    )
    assert verdict == "done"
    assert stored == _outcome(call_id, token)
    assert await ledger.dispatch("t", "run", call_id) is None
    events = [e["event"] for e in await ledger.audit("t", "run", call_id)]
    assert events == ["planned", "dispatched", "started", "finished"]


async def test_a_call_of_a_cancelled_run_never_starts(
    redis: Redis, call_id: str, settings: Settings
) -> None:
    keys = Keys.of(settings)
    ledger = Ledger(redis, keys)
    run = f"run-{uuid.uuid4().hex}"  # cancelled for good: no other test may share it
    await ledger.create("t", run, [_call(call_id, run)])
    _attempt, token = await ledger.dispatch("t", run, call_id) or (0, 0)
    await redis.set(keys.cancelled("t", run), "user pressed stop")
    verdict, _ = await ledger.begin("t", run, call_id, token=token, worker_id="w1", lease_s=30)
    assert verdict == "cancelled"
    assert (await ledger.read("t", run, [call_id]))[call_id].state == "dispatched"


async def test_begins_and_finishes_issued_together_each_get_their_own_verdict(
    redis: Redis, settings: Settings
) -> None:
    """Calls of several runs (several slot groups on a cluster) started in one loop turn
    share a script (one per slot group): each still gets the verdict it would get alone."""
    keys = Keys.of(settings)
    ledger = Ledger(redis, keys)
    runs = [f"run-{uuid.uuid4().hex}" for _ in range(5)]
    ready, stale, done, cancelled, unknown = runs
    tokens = {}
    for run in runs:
        await ledger.create("t", run, [_call("c", run)])
        tokens[run] = (await ledger.dispatch("t", run, "c") or (0, 0))[1]
    await ledger.begin("t", done, "c", token=tokens[done], worker_id="w0", lease_s=30)
    finished = _outcome("c", tokens[done]).model_copy(update={"run_id": done})
    assert await ledger.finish(finished) == "ok"
    await redis.set(keys.cancelled("t", cancelled), "stop")
    await ledger.begin("t", unknown, "c", token=tokens[unknown], worker_id="w0", lease_s=0.0)

    def begin(run: str, call_id: str = "c", token: int | None = None) -> Awaitable[object]:
        token = tokens.get(run, 1) if token is None else token
        return ledger.begin("t", run, call_id, token=token, worker_id="w1", lease_s=30)

    verdicts = await asyncio.gather(
        begin(ready), begin(stale, token=tokens[stale] - 1), begin(done), begin(cancelled),
        begin(unknown), begin(ready, "never-planned"),
    )  # fmt: skip
    assert [v for v, _ in verdicts] == ["run", "stale", "done", "cancelled", "unknown", "missing"]
    assert verdicts[2][1] == finished
    entry = (await ledger.read("t", ready, ["c"]))["c"]
    assert (entry.state, entry.worker_id) == ("started", "w1")

    replies = await asyncio.gather(
        ledger.finish(_outcome("c", tokens[ready]).model_copy(update={"run_id": ready})),
        ledger.finish(_outcome("c", tokens[done]).model_copy(update={"run_id": done})),
        ledger.finish(_outcome("c", tokens[stale] - 1).model_copy(update={"run_id": stale})),
        ledger.finish(_outcome("never-planned", 1).model_copy(update={"run_id": ready})),
    )
    assert replies == ["ok", "done", "stale", "missing"]
    assert (await ledger.read("t", ready, ["c"]))["c"].state == "finished"


async def test_retention_lets_a_plain_settled_call_expire_and_keeps_any_other_history(
    redis: Redis, settings: Settings
) -> None:
    keys = Keys.of(settings)
    ledger = Ledger(redis, keys, retention_s=600)
    rejected, approved, resolved, retried = (f"call-{uuid.uuid4().hex}" for _ in range(4))
    await ledger.create("t", "run", [_call(c) for c in (rejected, approved, resolved, retried)])

    async def ttls(call_id: str) -> tuple[int, int]:
        return await redis.ttl(keys.call("t", "run", call_id)), await redis.ttl(
            keys.audit("t", "run", call_id)
        )

    # Settled without running (a missing tool): a plain history, it expires (and has no
    # chain of its own: its events are in its entry).
    await ledger.settle(_outcome(rejected, 0).model_copy(update={"effect": "not_executed"}))
    entry_ttl, chain_ttl = await ttls(rejected)
    assert 0 < entry_ttl <= 600 and chain_ttl == -2
    assert [e["event"] for e in await ledger.audit("t", "run", rejected)] == [
        "planned", "settled_without_running"
    ]  # fmt: skip
    # A human's decision, a reconciler's verdict, a forced retry: kept, whatever comes after.
    await ledger.set_approval("t", "run", approved, approve=False, message="no", by="ops")
    await ledger.settle(_outcome(approved, 0).model_copy(update={"effect": "not_executed"}))
    await ledger.resolve(_outcome(resolved, 0), "probe_resolved", probe="applied")
    await ledger.dispatch("t", "run", retried, "probe proved it not applied", retry_after=0)
    for call_id in (approved, resolved, retried):
        assert await ttls(call_id) == (-1, -1), call_id
        assert (await redis.hget(keys.call("t", "run", call_id), "keep")) == b"1"


async def test_a_retry_keeps_the_first_attempts_events_before_its_own(
    redis: Redis, call_id: str, settings: Settings
) -> None:
    """A plain run's events live in its entry; the first event beyond it (a probe) moves
    them into the chain before the retry overwrites the entry's fields."""
    keys = Keys.of(settings)
    ledger = Ledger(redis, keys)
    await ledger.create("t", "run", [_call(call_id)], dispatch=[call_id])
    await ledger.begin("t", "run", call_id, token=1, worker_id="w1", lease_s=30)
    plain = await ledger.audit("t", "run", call_id)
    assert [(e["event"], e.get("attempt"), e.get("worker")) for e in plain] == [
        ("planned", None, None), ("dispatched", 1, None), ("started", None, "w1"),
    ]  # fmt: skip
    assert plain[1]["reason"] == "planned" and plain[2]["fencing_token"] == 1
    assert not await redis.exists(keys.audit("t", "run", call_id))

    await ledger.append_audit("t", "run", call_id, "probe", state="not_applied")
    assert await ledger.dispatch("t", "run", call_id, "probe: not applied", retry_after=1) == (
        2, 2,
    )  # fmt: skip
    await ledger.begin("t", "run", call_id, token=2, worker_id="w2", lease_s=30)
    assert await ledger.finish(_outcome(call_id, 2)) == "ok"
    events = await ledger.audit("t", "run", call_id)
    assert [(e["event"], e.get("fencing_token"), e.get("worker")) for e in events] == [
        ("planned", None, None), ("dispatched", 1, None), ("started", 1, "w1"),
        ("probe", None, None), ("dispatched", 2, None), ("started", 2, "w2"),
        ("finished", 2, None),
    ]  # fmt: skip
    assert events[:3] == plain
    assert events[4]["reason"] == "probe: not applied"
    assert (events[-1]["status"], events[-1]["effect"]) == ("succeeded", "applied")


async def test_a_chain_written_before_plain_runs_lived_in_the_entry_reads_without_doubles(
    redis: Redis, call_id: str, settings: Settings
) -> None:
    """During an upgrade: 0.1 appended every transition, this version finishes the call."""
    keys = Keys.of(settings)
    ledger = Ledger(redis, keys)
    await ledger.create("t", "run", [_call(call_id)], dispatch=[call_id])
    fields = await redis.hmget(keys.call("t", "run", call_id), ["created_at", "dispatched_at"])
    # As Lua's cjson wrote them: 14 significant digits.
    created, dispatched = (float(f"{float(v):.14g}") for v in fields)
    await redis.hdel(keys.call("t", "run", call_id), "dispatched_at")  # 0.1 did not write it
    await redis.rpush(
        keys.audit("t", "run", call_id),
        json.dumps({"event": "planned", "at": created}),
        json.dumps({"event": "dispatched", "attempt": 1, "fencing_token": 1,
                    "reason": "planned", "at": dispatched}),
    )  # fmt: skip
    await ledger.begin("t", "run", call_id, token=1, worker_id="w1", lease_s=30)
    assert await ledger.finish(_outcome(call_id, 1)) == "ok"
    events = [e["event"] for e in await ledger.audit("t", "run", call_id)]
    assert events == ["planned", "dispatched", "started", "finished"]
