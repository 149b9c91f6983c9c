"""Recovery against a fake upstream: a timeout is not "did not happen"."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

from kernel.rules.effects import CLASSIFICATION
from kernel.rules.texts import COMPENSATED, DEFAULT_ERROR
from kernel.settings import Settings
from kernel.stores.circuit import CircuitBreaker
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger
from kernel.stores.tasks import StoredTask, TaskStore
from schemas import TurnResult
from tests.conftest import wait_for
from tests.integration.test_pipeline import turn
from tests.integration.upstream_tools import count_key, effect_key, executions_key
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = pytest.mark.integration

TOOLS = "tests.integration.upstream_tools:tools"
ENV = {
    "TOOLFLEET_RECOVERY_PROBE_BACKOFF_S": "0.1",
    "TOOLFLEET_RECOVERY_REPORT_AFTER_S": "120",  # turns wait for the operators in these tests
    "TOOLFLEET_CIRCUIT_MIN_CALLS": "4",
    "TOOLFLEET_CIRCUIT_ERROR_RATE": "0.5",
    "TOOLFLEET_CIRCUIT_CACHE_S": "0",
}


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    with LocalFleet(settings, tools=TOOLS, workers=2, extra_env=ENV) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


async def _run(fleet: LocalFleet, client: FleetClient, tool: str, args: dict[str, Any]) -> str:
    """Submit a one-call turn; returns the call_id (the result is awaited separately)."""
    event = turn(("c", tool, args))
    await client.submit(event)
    return event.function_calls[0].call_id


async def _task_for(redis: Redis, keys: Keys, call_id: str) -> StoredTask:
    async def find() -> StoredTask | None:
        return next(
            (t for t in await TaskStore(redis, keys).all() if t.task.call_id == call_id), None
        )

    return await wait_for(find, within=60)


def _toolfleet(fleet: LocalFleet, *args: str) -> str:
    return fleet.cli(*args).stdout


def _run_id(call_id: str) -> str:
    return call_id.rsplit("-", 1)[0]


async def _idempotency_key(redis: Redis, keys: Keys, call_id: str) -> str:
    entries = await Ledger(redis, keys).read("acme", _run_id(call_id), [call_id])
    return entries[call_id].idempotency_key


async def test_a_timed_out_call_that_did_apply_is_resolved_by_the_probe_and_never_run_twice(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    call_id = await _run(fleet, client, "pay", {"value": "42", "mode": "apply_then_drop"})
    result = await result_of(fleet, client, _run_id(call_id))
    key = await _idempotency_key(redis, keys, call_id)
    assert (result.status, result.outputs[0].output) == ("completed", "stored 42")
    assert (result.calls[0].status, result.calls[0].effect) == ("succeeded", "applied")
    assert int(await redis.get(executions_key(call_id)) or 0) == 1
    assert int(await redis.get(count_key(key)) or 0) == 1
    printed = _toolfleet(
        fleet, "inspect", "call", call_id, "--tenant", "acme", "--run", _run_id(call_id)
    )
    chain = [line.split()[1] for line in printed.split("audit chain:")[1].splitlines() if line]
    assert chain == ["planned", "dispatched", "started", "finished", "probe", "resolved_applied"]


async def test_a_call_that_did_not_apply_is_retried_once_with_the_same_key_only_if_idempotent(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    idempotent = await _run(fleet, client, "put_record", {"value": "r1", "drop_first": True})
    result = await result_of(fleet, client, _run_id(idempotent))
    key = await _idempotency_key(redis, keys, idempotent)
    assert (result.calls[0].status, result.calls[0].effect, result.calls[0].attempts) == (
        "succeeded", "applied", 2,
    )  # fmt: skip
    assert int(await redis.get(executions_key(idempotent)) or 0) == 2  # same key both times
    assert int(await redis.get(count_key(key)) or 0) == 1
    assert (await redis.get(effect_key(key))) == b"r1"

    # The same situation with a non_idempotent tool: never re-submitted, a human decides.
    blind = await _run(fleet, client, "pay", {"value": "p1", "mode": "drop"})
    task = await _task_for(redis, keys, blind)
    assert "never re-submitted" in task.task.reason
    _toolfleet(fleet, "tasks", "resolve", task.task.task_id, "--as", "not_applied", "--by", "ops")
    result = await result_of(fleet, client, _run_id(blind))
    assert result.outputs[0].output == DEFAULT_ERROR
    assert (result.calls[0].effect, result.calls[0].attempts) == ("not_executed", 1)
    assert int(await redis.get(executions_key(blind)) or 0) == 1


async def test_a_tool_without_a_probe_goes_to_a_human_task(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    call_id = await _run(fleet, client, "notify", {"value": "n1", "mode": "apply_then_drop"})
    task = await _task_for(redis, keys, call_id)
    assert task.task.kind == "unknown_effect" and "no probe" in task.task.reason
    assert task.task.task_id in _toolfleet(fleet, "tasks", "list")
    _toolfleet(
        fleet, "tasks", "resolve", task.task.task_id, "--as", "applied",
        "--output", "notified n1", "--by", "ops",
    )  # fmt: skip
    result: TurnResult = await result_of(fleet, client, _run_id(call_id))
    assert (result.status, result.outputs[0].output) == ("completed", "notified n1")
    assert result.calls[0].effect == "applied"
    assert int(await redis.get(executions_key(call_id)) or 0) == 1


async def test_compensation_runs_only_after_approval_and_is_linked_in_the_audit_chain(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    call_id = await _run(fleet, client, "pay", {"value": "7", "mode": "wrong_then_drop"})
    task = await _task_for(redis, keys, call_id)
    key = await _idempotency_key(redis, keys, call_id)
    assert task.task.kind == "compensation_approval"
    assert await redis.get(effect_key(key)) == b"WRONG 7"  # nothing compensated yet
    ledger = Ledger(redis, keys)
    entry = (await ledger.read("acme", _run_id(call_id), [call_id]))[call_id]
    assert entry.outcome is not None and entry.outcome.effect == "wrong_effect"

    _toolfleet(
        fleet, "tasks", "resolve", task.task.task_id, "--as", "approve_compensation", "--by", "ops"
    )
    result = await result_of(fleet, client, _run_id(call_id))
    assert result.outputs[0].output == COMPENSATED.format(name="pay")
    assert await redis.get(effect_key(key)) == b"COMPENSATED"
    entry = (await ledger.read("acme", _run_id(call_id), [call_id]))[call_id]
    assert entry.outcome is not None and entry.outcome.effect == "compensated"
    events = [e["event"] for e in await ledger.audit("acme", _run_id(call_id), call_id)]
    assert events[-5:] == [
        "wrong_effect", "handed_over", "human_resolution", "compensation_dispatched", "compensated",
    ]  # fmt: skip
    links = [
        e
        for e in await ledger.audit("acme", _run_id(call_id), call_id)
        if e["event"] == "compensated"
    ]
    assert links[0]["compensation"] == f"{call_id}#compensate"
    comp_events = [
        e["event"] for e in await ledger.audit("acme", _run_id(call_id), f"{call_id}#compensate")
    ]
    assert comp_events == ["planned", "dispatched", "started", "finished"]


async def test_a_failing_tool_version_trips_the_circuit_and_later_calls_are_not_executed(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys, settings: Settings
) -> None:
    circuits = CircuitBreaker(redis, settings)
    await circuits.close("flaky@7")  # a clean window (Redis outlives test sessions)
    # One at a time, so the call that trips the circuit is known: the 4th of the window.
    failing = turn(*((f"f{i}", "flaky", {"fail": True}) for i in range(5)), max_concurrency=1)
    await client.submit(failing)
    result = await result_of(fleet, client, failing.run_id)
    assert [c.status for c in result.calls] == ["failed"] * 5
    assert "temporarily unavailable" in result.outputs[4].output  # refused, not executed
    assert result.calls[4].effect == "not_executed"
    assert await _is_open(circuits)
    tasks = [t for t in await TaskStore(redis, keys).all() if t.task.kind == "circuit_open"]
    # Each call by run and call: a call id alone names a call only within its run.
    assert set(tasks[-1].task.calls) == {
        f"{failing.run_id}/{c.call_id}" for c in failing.function_calls[:4]
    }

    later = turn(("a", "flaky", {"fail": False}), ("b", "flaky", {"fail": False}))
    await client.submit(later)
    result = await result_of(fleet, client, later.run_id)
    assert all("temporarily unavailable" in o.output for o in result.outputs)
    assert {(c.status, c.effect) for c in result.calls} == {("failed", "not_executed")}

    assert "flaky@7: closed" in _toolfleet(fleet, "tools", "resume", "flaky@7")
    again = turn(("a", "flaky", {"fail": False}))
    await client.submit(again)
    assert (await result_of(fleet, client, again.run_id)).outputs[0].output == "fine"


async def _is_open(circuits: CircuitBreaker) -> bool:
    return "flaky@7" in await circuits.open_circuits()


async def test_tools_describe_prints_the_failure_table(
    fleet: LocalFleet, client: FleetClient
) -> None:
    printed = await asyncio.to_thread(_toolfleet, fleet, "tools", "describe", "pay")
    assert "effect=non_idempotent" in printed and "probe=yes" in printed
    assert "runs unattended: yes (its probe can establish any unknown effect)" in printed
    for signal, _effect, _retry in CLASSIFICATION:  # the table comes from kernel.rules.effects
        assert signal in printed
    assert "compensate after approval" in printed
