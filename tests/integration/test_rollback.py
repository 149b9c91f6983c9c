"""Two versions of one tool side by side: automatic rollback when the newest one's circuit
opens, and ``toolfleet tools rollback|pin|unpin`` by hand. A rollback never resolves the
circuit's human task, nor touches the ledger."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

from kernel.settings import Settings
from kernel.stores.circuit import CircuitBreaker, task_call_ref
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger
from kernel.stores.registry import live_versions, pinned_version
from kernel.stores.tasks import StoredTask, TaskStore
from schemas import ModelResponseEvent, TurnResult
from tests.conftest import wait_for
from tests.integration.test_pipeline import turn
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = pytest.mark.integration

TOOLS = "tests.integration.versioned_tools:tools"
ENV = {
    "TOOLFLEET_CIRCUIT_MIN_CALLS": "4",
    "TOOLFLEET_CIRCUIT_ERROR_RATE": "0.5",
    "TOOLFLEET_CIRCUIT_CACHE_S": "0",
    "TOOLFLEET_REGISTRY_CACHE_S": "0",  # a pin is in force from the planner's next turn on
}
V1, V2 = "pay_v@1", "pay_v@2"


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    with LocalFleet(settings, tools=TOOLS, workers=2, extra_env=ENV) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


async def _toolfleet(fleet: LocalFleet, *args: str) -> str:
    done = await asyncio.to_thread(fleet.cli, *args, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def _pay(
    fleet: LocalFleet, client: FleetClient, *values: str, **config: Any
) -> tuple[ModelResponseEvent, TurnResult]:
    """One turn of ``pay_v`` calls, one per value; the event and its result."""
    event = turn(*((f"p{i}", "pay_v", {"value": v}) for i, v in enumerate(values)), **config)
    await client.submit(event)
    return event, await result_of(fleet, client, event.run_id)


def _ran_on_v1(result: TurnResult, *values: str) -> bool:
    succeeded = [c.status for c in result.calls] == ["succeeded"] * len(values)
    return succeeded and [o.output for o in result.outputs] == [f"v1 paid {v}" for v in values]


def _failed_on_v2(result: TurnResult) -> bool:
    statuses = {c.status for c in result.calls}
    return statuses == {"failed"} and not any(o.output.startswith("v1") for o in result.outputs)


async def test_an_open_circuit_rolls_new_calls_back_and_operators_can_pin_and_unpin(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys, settings: Settings
) -> None:
    circuits = CircuitBreaker(redis, settings)
    for ref in (V1, V2):
        await circuits.close(ref)  # a clean window
    assert set(await live_versions(redis, keys, "pay_v")) == {"1", "2"}
    assert "new calls: pay_v@2: the newest live version" in await _toolfleet(
        fleet, "tools", "versions", "pay_v"
    )

    # The newest version takes the calls; one at a time, so the 4th of the window opens it.
    failing, result = await _pay(fleet, client, "a", "b", "c", "d", max_concurrency=1)
    assert [c.status for c in result.calls] == ["failed"] * 4 and _failed_on_v2(result)

    async def circuit_task() -> StoredTask | None:
        return next(
            (
                t
                for t in await TaskStore(redis, keys).all()
                if t.task.kind == "circuit_open"
                and (t.task.tool_name, t.task.tool_version) == ("pay_v", "2")
            ),
            None,
        )

    task = await wait_for(circuit_task)
    # Each call by its full identity (RUN/CALL): a call id is unique only within its run.
    v2_calls = {task_call_ref(failing.run_id, c.call_id) for c in failing.function_calls}
    assert set(task.task.calls) == v2_calls and task.status == "open"
    assert V2 in await circuits.open_circuits() and V1 not in await circuits.open_circuits()

    # Automatic rollback: new calls run on version 1, which is served and healthy.
    _, result = await _pay(fleet, client, "e", "f")
    assert _ran_on_v1(result, "e", "f")
    printed = await _toolfleet(fleet, "tools", "versions", "pay_v")
    assert "new calls: pay_v@1: automatic rollback, the circuit of pay_v@2 is open" in printed
    assert "pin: none" in printed and "pay_v@1  pool=default" in printed
    assert "circuit=open (4 of 4 calls failed)" in printed

    # By hand: a version that is not live is refused, naming the live ones.
    refused = await asyncio.to_thread(
        fleet.cli, "tools", "rollback", "pay_v", "--to", "3", check=False
    )
    assert refused.returncode != 0
    assert "pay_v@3 is not live; live versions of pay_v: 1, 2" in refused.stderr
    assert await pinned_version(redis, keys, "pay_v") is None

    assert "new calls go to pay_v@1" in await _toolfleet(
        fleet, "tools", "rollback", "pay_v", "--to", "1"
    )
    assert await pinned_version(redis, keys, "pay_v") == "1"
    assert "new calls: pay_v@1: pinned by an operator" in await _toolfleet(
        fleet, "tools", "versions", "pay_v"
    )

    # The pin holds even once version 2 is healthy again...
    assert f"{V2}: closed" in await _toolfleet(fleet, "tools", "resume", V2)
    _, result = await _pay(fleet, client, "g")
    assert _ran_on_v1(result, "g")

    # ...until it is dropped: then the newest takes the calls again.
    assert "pay_v: unpinned" in await _toolfleet(fleet, "tools", "unpin", "pay_v")
    assert "pay_v: was not pinned" in await _toolfleet(fleet, "tools", "unpin", "pay_v")
    _, result = await _pay(fleet, client, "h")
    assert _failed_on_v2(result)

    # ``pin`` is the same as ``rollback --to``.
    await _toolfleet(fleet, "tools", "pin", "pay_v", "1")
    _, result = await _pay(fleet, client, "i")
    assert _ran_on_v1(result, "i")
    await _toolfleet(fleet, "tools", "unpin", "pay_v")

    # Rolling back resolved nothing: the task still lists version 2's calls, and their
    # ledger entries still hold the failures.
    stored = await TaskStore(redis, keys).get(task.task.task_id)
    assert stored is not None and stored.status == "open"
    assert set(stored.task.calls) == v2_calls
    call_ids = sorted(c.call_id for c in failing.function_calls)
    entries = await Ledger(redis, keys).read("acme", failing.run_id, call_ids)
    assert {e.outcome.status for e in entries.values() if e.outcome} == {"failed"}
    assert len(entries) == 4
