"""The worker's step after publishing, on the real Redis: a loop turn's outcomes at once."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.asyncio import Redis

from executors import AfterPublish
from kernel.settings import Settings
from kernel.stores.circuit import CircuitBreaker
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger, NewCall
from schemas import CallOutcome

pytestmark = pytest.mark.integration


async def _finished(ledger: Ledger, status: str = "succeeded") -> CallOutcome:
    call_id = f"call-{uuid.uuid4().hex}"
    await ledger.create("t", "run", [NewCall(call_id, "fp", "key", "run", 0, "tool", "default")])
    _attempt, token = await ledger.dispatch("t", "run", call_id) or (0, 0)
    await ledger.begin("t", "run", call_id, token=token, worker_id="w1", lease_s=30)
    outcome = CallOutcome(
        tenant_id="t", run_id="run", turn_id=0, call_id=call_id, tool_name="tool", index=0,
        attempt=1, fencing_token=token, status=status,
        effect="applied" if status == "succeeded" else "unknown",
    )  # fmt: skip
    assert await ledger.finish(outcome) == "ok"
    return outcome


async def test_a_burst_of_outcomes_is_committed_and_counted_in_one_step(
    redis: Redis, settings: Settings
) -> None:
    keys = Keys.of(settings)
    ledger = Ledger(redis, keys)
    circuits = CircuitBreaker(redis, settings)
    after = AfterPublish(Ledger(redis, keys, settings.ledger_retention_s), circuits)
    ref = f"tool@{uuid.uuid4().hex[:8]}"
    counted = [await _finished(ledger) for _ in range(5)]
    uncounted = await _finished(ledger)  # e.g. a call that never started: committed only
    replies = await asyncio.gather(*(after(o, ref) for o in counted), after(uncounted, None))
    assert replies == [[]] * 6
    entries = await ledger.read("t", "run", [o.call_id for o in [*counted, uncounted]])
    assert {e.state for e in entries.values()} == {"committed"}
    window = await redis.hgetall(keys.circuit("window", ref))
    assert sum(int(v) for k, v in window.items() if k.endswith(b":n")) == 5
    listed = await redis.lrange(keys.circuit("calls", ref), 0, -1)
    recent = [m.decode().partition("|")[2] for m in listed]  # tenant, run, call by \x1f
    assert sorted(recent) == sorted(f"t\x1frun\x1f{o.call_id}" for o in counted)
    assert (await circuits.check(ref)).state == "closed"


async def test_failures_that_open_the_circuit_name_the_window_to_one_caller(
    redis: Redis, settings: Settings
) -> None:
    keys = Keys.of(settings)
    ledger = Ledger(redis, keys)
    tight = settings.model_copy(update={"circuit_min_calls": 4, "circuit_error_rate": 0.5})
    circuits = CircuitBreaker(redis, tight)
    after = AfterPublish(Ledger(redis, keys, settings.ledger_retention_s), circuits)
    ref = f"tool@{uuid.uuid4().hex[:8]}"
    ok = [await _finished(ledger) for _ in range(2)]
    failed = [await _finished(ledger, "failed") for _ in range(3)]
    replies = await asyncio.gather(*(after(o, ref) for o in [*ok, *failed]))
    assert replies[:-1] == [[]] * 4, "only the last failed call files the task"
    # Each call by its full identity: a call id is unique only within its run.
    assert sorted(replies[-1]) == sorted(("t", "run", o.call_id) for o in [*ok, *failed])
    assert (await circuits.check(ref)).state == "open"


async def _ttls(redis: Redis, keys: Keys, call_id: str) -> tuple[int, int]:
    """Seconds left to the call's ledger entry and audit chain (-1: never, -2: no such key)."""
    return await redis.ttl(keys.call("t", "run", call_id)), await redis.ttl(
        keys.audit("t", "run", call_id)
    )


async def test_a_plain_run_expires_after_the_retention_and_a_call_with_history_is_kept(
    redis: Redis, settings: Settings
) -> None:
    keys = Keys.of(settings)
    ledger = Ledger(redis, keys, retention_s=600)
    after = AfterPublish(Ledger(redis, keys, 600), CircuitBreaker(redis, settings))
    plain, probed = await _finished(ledger), await _finished(ledger)
    await ledger.append_audit("t", "run", probed.call_id, "probe", state="applied")
    await asyncio.gather(after(plain, None), after(probed, None))
    entry_ttl, chain_ttl = await _ttls(redis, keys, plain.call_id)
    assert 0 < entry_ttl <= 600 and chain_ttl == -2  # a plain run's events are in its entry
    assert await _ttls(redis, keys, probed.call_id) == (-1, -1)
    # History added later (a human finds the effect wrong) keeps a call that was to expire.
    await ledger.append_audit("t", "run", plain.call_id, "human_verdict", effect="wrong_effect")
    assert await _ttls(redis, keys, plain.call_id) == (-1, -1)
    # Retention 0 keeps everything.
    forever = Ledger(redis, keys, retention_s=0)
    kept = await _finished(forever)
    await AfterPublish(Ledger(redis, keys, 0), CircuitBreaker(redis, settings))(kept, None)
    assert await _ttls(redis, keys, kept.call_id) == (-1, -2)
