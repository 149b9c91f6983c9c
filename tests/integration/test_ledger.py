"""The call ledger on the real Redis: the gate in front of user code."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.asyncio import Redis

from schemas import CallOutcome
from toolfleet.keys import Keys
from toolfleet.ledger import Ledger, NewCall
from toolfleet.settings import Settings

pytestmark = pytest.mark.integration


def _call(call_id: str) -> NewCall:
    return NewCall(call_id, "fp", "tf-key", "run", 0, "tool", "default")


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
    await ledger.create("t", [_call(call_id)])
    await ledger.create("t", [NewCall(call_id, "other", "k2", "run", 1, "tool", None)])
    entry = (await ledger.read("t", [call_id]))[call_id]
    assert (entry.fingerprint, entry.state, entry.idempotency_key) == ("fp", "planned", "tf-key")


async def test_only_one_of_many_concurrent_workers_may_start_an_attempt(
    redis: Redis, call_id: str, settings: Settings
) -> None:
    ledger = Ledger(redis, Keys.of(settings))
    await ledger.create("t", [_call(call_id)])
    _attempt, token = await ledger.dispatch("t", call_id) or (0, 0)
    verdicts = await asyncio.gather(
        *(ledger.begin("t", call_id, token, f"w{i}", 30) for i in range(10))
    )
    assert sorted(v for v, _ in verdicts) == ["busy"] * 9 + ["run"]


async def test_a_started_call_whose_lease_expired_is_unknown_not_rerun(
    redis: Redis, call_id: str, settings: Settings
) -> None:
    ledger = Ledger(redis, Keys.of(settings))
    await ledger.create("t", [_call(call_id)])
    _attempt, token = await ledger.dispatch("t", call_id) or (0, 0)
    assert (await ledger.begin("t", call_id, token, "w1", 0.0))[0] == "run"
    assert (await ledger.begin("t", call_id, token, "w2", 30))[0] == "unknown"


async def test_an_older_fencing_token_is_stale(
    redis: Redis, call_id: str, settings: Settings
) -> None:
    ledger = Ledger(redis, Keys.of(settings))
    await ledger.create("t", [_call(call_id)])
    await ledger.dispatch("t", call_id)
    _attempt, token = await ledger.dispatch("t", call_id, reason="retry", force=True) or (0, 0)
    assert (await ledger.begin("t", call_id, token - 1, "w1", 30))[0] == "stale"
    assert await ledger.finish(_outcome(call_id, token - 1)) == "stale"


async def test_planner_dispatch_is_idempotent_and_a_forced_retry_fences_the_old_attempt(
    redis: Redis, call_id: str, settings: Settings
) -> None:
    ledger = Ledger(redis, Keys.of(settings))
    await ledger.create("t", [_call(call_id)])
    assert await ledger.dispatch("t", call_id) == (1, 1)
    assert await ledger.dispatch("t", call_id) == (1, 1)
    await ledger.begin("t", call_id, 1, "w1", 30)
    assert await ledger.dispatch("t", call_id) is None
    assert await ledger.dispatch("t", call_id, reason="probe: not applied", force=True) == (2, 2)
    assert await ledger.finish(_outcome(call_id, 1)) == "stale"


async def test_a_finished_call_returns_its_stored_outcome_instead_of_running(
    redis: Redis, call_id: str, settings: Settings
) -> None:
    ledger = Ledger(redis, Keys.of(settings))
    await ledger.create("t", [_call(call_id)])
    _attempt, token = await ledger.dispatch("t", call_id) or (0, 0)
    await ledger.begin("t", call_id, token, "w1", 30)
    assert await ledger.finish(_outcome(call_id, token)) == "ok"
    await ledger.commit("t", call_id)
    verdict, stored = await ledger.begin("t", call_id, token, "w2", 30)
    assert verdict == "done"
    assert stored == _outcome(call_id, token)
    assert await ledger.dispatch("t", call_id) is None
    events = [e["event"] for e in await ledger.audit("t", call_id)]
    assert events == ["planned", "dispatched", "started", "finished"]


async def test_a_call_of_a_cancelled_run_never_starts(
    redis: Redis, call_id: str, settings: Settings
) -> None:
    keys = Keys.of(settings)
    ledger = Ledger(redis, keys)
    await ledger.create("t", [_call(call_id)])
    _attempt, token = await ledger.dispatch("t", call_id) or (0, 0)
    await redis.set(keys.cancelled("t", "run"), "user pressed stop")
    assert (await ledger.begin("t", call_id, token, "w1", 30, run_id="run"))[0] == "cancelled"
    assert (await ledger.read("t", [call_id]))[call_id].state == "dispatched"
