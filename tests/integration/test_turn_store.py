"""The aggregator's turn state on the real Redis: one hash per turn, written field by field,
every write a compare-and-set."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.asyncio import Redis

from aggregator import StoredTurn, TurnState, TurnStore, accept_outcome
from kernel.stores.keys import Keys
from kernel.stores.turns import RunTurns, TurnHashes
from schemas import CallOutcome, PlannedCall, TurnPlan

pytestmark = pytest.mark.integration


def _plan(calls: int) -> TurnPlan:
    planned = [
        PlannedCall(call_id=f"c{i}", tool_name="add", index=i, arguments="{}",
                    disposition="dispatch")
        for i in range(calls)
    ]  # fmt: skip
    return TurnPlan(
        tenant_id="t", run_id="r", turn_id=0, response_id="resp", agent_name="assistant",
        calls=planned, planned_at=1.0,
    )  # fmt: skip


def _outcome(i: int) -> CallOutcome:
    return CallOutcome(
        tenant_id="t", run_id="r", turn_id=0, call_id=f"c{i}", tool_name="add", index=i,
        attempt=1, fencing_token=1, status="succeeded", effect="applied", output=f"out-{i}",
    )  # fmt: skip


def _store(redis: Redis) -> TurnStore:
    return TurnStore(TurnHashes(redis, ttl_s=60), cached=100)


def _early(i: int) -> object:
    def change(state: StoredTurn) -> None:
        state.early[f"c{i}"] = _outcome(i)

    return change


async def test_instances_writing_one_turn_at_once_lose_no_update(redis: Redis) -> None:
    """Two aggregator instances (a rebalance) racing on one turn: every change survives."""
    key = f"test:turn:{uuid.uuid4().hex}"
    one, other = _store(redis), _store(redis)
    updates = [store.update(key, _early(i)) for i in range(40) for store in (one, other)]
    await asyncio.gather(*updates)
    stored = await one.read(key)
    assert sorted(stored.early) == sorted(f"c{i}" for i in range(40))
    # Each outcome was written once: the second instance to record it found it there.
    assert stored.version == "40"
    assert 0 < await redis.ttl(key) <= 60


async def test_a_cached_or_guessed_state_is_checked_by_the_write_never_trusted(
    redis: Redis,
) -> None:
    key = f"test:turn:{uuid.uuid4().hex}"
    store = _store(redis)
    await store.update(key, _early(0), probably_new=True)
    await _store(redis).update(key, _early(1))  # another instance: this one's cache is stale
    await store.update(key, _early(2))
    # The turn exists: guessing it is new fails the write, which reads it and tries again.
    await _store(redis).update(key, _early(3), probably_new=True)
    assert sorted((await store.read(key)).early) == ["c0", "c1", "c2", "c3"]


async def test_an_update_writes_the_fields_it_changed_and_drops_those_it_removed(
    redis: Redis,
) -> None:
    key = f"test:turn:{uuid.uuid4().hex}"
    store = _store(redis)
    await store.update(key, _early(1))
    before = await redis.hgetall(key)

    def plan_arrives(state: StoredTurn) -> None:
        turn = TurnState(plan=_plan(3))
        for outcome in state.early.values():
            accept_outcome(turn, outcome)
        accept_outcome(turn, _outcome(0))
        state.turn, state.early = turn, {}

    await store.update(key, plan_arrives)
    after = await redis.hgetall(key)
    assert sorted(after) == [b"o:c0", b"o:c1", b"plan", b"v"]
    assert after[b"o:c1"] == before[b"e:c1"]  # the same outcome, under its new name
    # Unchanged fields are not written again: a foreign value in one survives an update.
    await redis.hset(key, "o:c0", _outcome(0).model_copy(update={"output": "kept"}).encode())
    await _store(redis).update(key, lambda s: accept_outcome(s.turn, _outcome(2)))  # type: ignore[arg-type]
    stored = await store.read(key)
    assert stored.turn is not None
    assert {k: o.output for k, o in stored.turn.outcomes.items()} == {
        "c0": "kept", "c1": "out-1", "c2": "out-2"
    }  # fmt: skip


async def test_a_turn_of_thousands_of_calls_is_written_and_cleared_in_one_update(
    redis: Redis,
) -> None:
    """More fields than one Lua unpack takes (~8,000 values) in one write, and in one delete."""
    key = f"test:turn:{uuid.uuid4().hex}"
    store = _store(redis)

    def many(state: StoredTurn) -> None:
        state.early.update({f"c{i}": _outcome(i) for i in range(5_000)})

    await store.update(key, many)
    assert await redis.hlen(key) == 5_001  # and the version
    await _store(redis).update(key, lambda s: s.early.clear())
    assert await redis.hkeys(key) == [b"v"]


async def test_a_run_kept_forever_keeps_its_turns_and_their_list(redis: Redis) -> None:
    """``ledger_retention_s=0`` means forever: nothing of the run may expire, at once or later."""
    key = f"test:turn:{uuid.uuid4().hex}"
    store = TurnStore(TurnHashes(redis, ttl_s=0), cached=100)
    await store.update(key, _early(1))
    assert sorted((await store.read(key)).early) == ["c1"]
    assert await redis.ttl(key) == -1
    keys = Keys(f"test:{uuid.uuid4().hex[:8]}")
    turns = RunTurns(redis, keys, ttl_s=0)
    await turns.add("t", "r", 0)
    assert await turns.of_run("t", "r") == [0]
    assert await redis.ttl(keys.turns("t", "r")) == -1
