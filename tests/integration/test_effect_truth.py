"""A lost response is not a failed action: every row of the classification table, end to end.

Real broker and Redis, two worker processes, the planner, aggregator and reconciler. Each
tool's fake upstream counts its effects, so "applied exactly once" is checked upstream, not
only in the turn result.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

from kernel.rules.texts import COMPENSATED, DEFAULT_ERROR
from kernel.settings import Settings
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger, LedgerEntry
from kernel.stores.registry import publish_tools
from kernel.stores.tasks import StoredTask, TaskStore
from schemas import ApprovalDecision, ModelResponseEvent, ToolSpec, TurnResult
from tests.conftest import wait_for
from tests.integration.effect_tools import (
    applies_key,
    compensated_ref_key,
    keys_key,
    record_key,
    runs_key,
)
from tests.integration.test_pipeline import turn
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = pytest.mark.integration

ENV = {
    "TOOLFLEET_RECOVERY_PROBE_BACKOFF_S": "0.1",
    "TOOLFLEET_RECOVERY_RETRY_BACKOFF_S": "0.1",
    "TOOLFLEET_RECOVERY_REPORT_AFTER_S": "120",  # turns wait for the operators in these tests
    "TOOLFLEET_SESSION_TIMEOUT_MS": "6000",  # a killed worker's partitions move on quickly
    "TOOLFLEET_CIRCUIT_MIN_CALLS": str(10**9),  # failures on purpose, not a failing version
}


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    with LocalFleet(
        settings,
        tools="tests.integration.effect_tools:tools",
        workers=2,
        worker_args=["--lease-s", "2"],
        extra_env=ENV,
    ) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


async def _one_call(
    fleet: LocalFleet, client: FleetClient, tool: str, args: dict[str, Any]
) -> tuple[str, TurnResult]:
    event = turn(("c", tool, args))
    await client.submit(event)
    return event.function_calls[0].call_id, await result_of(fleet, client, event.run_id)


def _run_of(call_id: str) -> str:
    return call_id.rsplit("-", 1)[0]  # turn() names a call "<run>-<suffix>"


async def _entry(redis: Redis, keys: Keys, call_id: str) -> LedgerEntry:
    return (await Ledger(redis, keys).read("acme", _run_of(call_id), [call_id]))[call_id]


async def _count(redis: Redis, key: str) -> int:
    return int(await redis.get(key) or 0)


async def _events(redis: Redis, keys: Keys, call_id: str) -> list[str]:
    return [e["event"] for e in await Ledger(redis, keys).audit("acme", _run_of(call_id), call_id)]


async def _task_for(redis: Redis, keys: Keys, call_id: str) -> StoredTask:
    async def find() -> StoredTask | None:
        tasks = await TaskStore(redis, keys).all()
        return next((t for t in tasks if t.task.call_id == call_id), None)

    return await wait_for(find, within=60)


def _toolfleet(fleet: LocalFleet, *args: str) -> str:
    return fleet.cli(*args).stdout


@pytest.mark.parametrize("lose", ["timeout", "reset", "httpx_read_timeout", "http_502"])
async def test_an_applied_call_whose_response_is_lost_is_resolved_by_its_probe(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys, lose: str
) -> None:
    call_id, result = await _one_call(fleet, client, "open_ticket", {"title": lose, "lose": lose})
    entry = await _entry(redis, keys, call_id)
    record = result.calls[0]
    assert (result.status, record.status, record.effect) == ("completed", "succeeded", "applied")
    assert result.outputs[0].output == f"found upstream: ticket {lose}"  # the probe's answer
    assert await _count(redis, applies_key(entry.idempotency_key)) == 1
    assert await _count(redis, runs_key(call_id)) == 1
    assert entry.upstream_ref == f"T-{lose}"
    events = await _events(redis, keys, call_id)
    assert events[-3:] == ["finished", "probe", "resolved_applied"]
    assert "upstream_ref" in events


async def test_a_refused_connection_on_an_idempotent_tool_is_retried_with_the_same_key(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    call_id, result = await _one_call(
        fleet, client, "put_value", {"value": "v1", "first": "refused"}
    )
    entry = await _entry(redis, keys, call_id)
    assert (result.calls[0].effect, result.calls[0].attempts) == ("applied", 2)
    assert result.outputs[0].output == "stored v1"  # the model sees only the final attempt
    used = await redis.lrange(keys_key(call_id), 0, -1)
    assert used == [entry.idempotency_key.encode()] * 2
    assert await _count(redis, applies_key(entry.idempotency_key)) == 1
    events = await _events(redis, keys, call_id)
    assert events.count("dispatched") == 2 and events.count("finished") == 2


async def test_http_429_is_retried_after_its_retry_after(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    call_id, result = await _one_call(
        fleet, client, "put_value", {"value": "v2", "first": "http_429"}
    )
    assert (result.calls[0].effect, result.calls[0].attempts) == ("applied", 2)
    chain = await Ledger(redis, keys).audit("acme", _run_of(call_id), call_id)
    finished = next(e for e in chain if e["event"] == "finished")
    redispatched = [e for e in chain if e["event"] == "dispatched"][1]
    assert redispatched["at"] - finished["at"] >= 1.0  # Retry-After: 1


@pytest.mark.parametrize("why", ["declined", "http_404", "definite"])
async def test_a_definite_refusal_is_reported_and_never_retried(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys, why: str
) -> None:
    call_id, result = await _one_call(fleet, client, "refused", {"why": why})
    assert (result.calls[0].status, result.calls[0].effect) == ("failed", "not_executed")
    assert result.calls[0].attempts == 1
    assert result.outputs[0].output == DEFAULT_ERROR
    assert await _count(redis, runs_key(call_id)) == 1
    assert not [t for t in await TaskStore(redis, keys).all() if t.task.call_id == call_id]


async def test_a_declared_validation_error_stays_out_of_the_human_queue(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    call_id, result = await _one_call(fleet, client, "file_claim", {"title": ""})
    assert (result.calls[0].effect, result.outputs[0].output) == ("not_executed", DEFAULT_ERROR)
    assert "probe" not in await _events(redis, keys, call_id)
    assert not [t for t in await TaskStore(redis, keys).all() if t.task.call_id == call_id]


async def test_a_non_idempotent_tool_without_a_probe_waits_for_a_human_then_runs(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    event = turn(("c", "submit_order", {"item": "anvil"}))
    call_id = event.function_calls[0].call_id
    first = await client.run_turn(event)
    assert first.status == "interrupted" and first.interruptions[0].call_id == call_id
    assert await _count(redis, runs_key(call_id)) == 0  # prepared, not submitted
    await _approve(client, redis, keys, event, call_id=call_id, tool="submit_order")
    done = await client.run_turn(event.model_copy(update={"resume": True}))
    assert (done.status, done.outputs[0].output) == ("completed", "ordered anvil")
    assert await _count(redis, runs_key(call_id)) == 1
    assert "runs unattended: no" in _toolfleet(fleet, "tools", "describe", "submit_order")


async def _approve(
    client: FleetClient, redis: Redis, keys: Keys, event: ModelResponseEvent, *, call_id: str,
    tool: str,
) -> None:  # fmt: skip
    await client.decide(
        ApprovalDecision(
            tenant_id=event.tenant_id, run_id=event.run_id, call_id=call_id, tool_name=tool,
            approve=True, decided_by="ops",
        )
    )  # fmt: skip

    async def stored() -> bool:
        return bool(await redis.hexists(keys.approvals("acme", event.run_id), f"call:{call_id}"))

    await wait_for(stored)


async def test_a_wrong_effect_holds_the_run_and_its_ref_survives_a_crash_into_compensation(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    booking = turn(("b", "book_seat", {"seat": "12A", "hang_s": 60}))
    call_id = booking.function_calls[0].call_id
    await client.submit(booking)

    async def recorded() -> LedgerEntry | None:
        entry = (await Ledger(redis, keys).read("acme", booking.run_id, [call_id])).get(call_id)
        return entry if entry is not None and entry.upstream_ref else None

    entry = await wait_for(recorded)
    assert entry.upstream_ref == "B-12A"
    # Crash the worker that runs the call, after the ref was recorded, before it answers.
    holder = next(f"worker-{n}" for n in range(2) if entry.worker_id == _worker_id(fleet, n))
    fleet.kill(holder)
    fleet.start_worker(int(holder.rsplit("-", 1)[1]))

    task = await _task_for(redis, keys, call_id)  # lease expired -> probe -> wrong effect
    assert task.task.kind == "compensation_approval"
    assert (await _entry(redis, keys, call_id)).upstream_ref == "B-12A"

    # While the wrong effect stands, the run's next side-effecting call waits for a human;
    # a read in the same turn runs.
    follow = turn(("w", "put_value", {"value": "after"}), ("r", "peek", {"what": "seat"}),
                  run_id=booking.run_id).model_copy(update={"turn_id": 1})  # fmt: skip
    held = await client.run_turn(follow)
    assert held.status == "interrupted"
    assert [i.call_id for i in held.interruptions] == [follow.function_calls[0].call_id]
    assert "wrong effect" in (held.interruptions[0].reason or "")
    assert [o.output for o in held.outputs] == ["saw seat"]

    _toolfleet(fleet, "tasks", "resolve", task.task.task_id, "--as", "approve_compensation",
               "--by", "ops")  # fmt: skip
    result = await result_of(fleet, client, booking.run_id)
    assert result.outputs[0].output == COMPENSATED.format(name="book_seat")
    key = entry.idempotency_key
    assert await redis.get(compensated_ref_key(key)) == b"B-12A"  # the ref reached it
    assert await redis.get(record_key(key)) == b"CANCELLED"
    assert await _count(redis, applies_key(key)) == 1
    printed = _toolfleet(
        fleet, "inspect", "call", call_id, "--tenant", "acme", "--run", booking.run_id
    )
    assert '"upstream_ref": "B-12A"' in printed and "arguments_digest" in printed

    async def released() -> bool:
        return not await redis.exists(keys.held("acme", booking.run_id))

    await wait_for(released)
    resumed = await client.run_turn(follow.model_copy(update={"resume": True}))
    assert (resumed.status, [o.output for o in resumed.outputs]) == (
        "completed", ["stored after", "saw seat"],
    )  # fmt: skip


def _worker_id(fleet: LocalFleet, n: int) -> str:
    return f"{socket.gethostname()}-{fleet.pid(f'worker-{n}')}"


async def test_tools_review_exits_non_zero_for_a_tool_unattended_without_a_probe(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    # A tool published as an SDK tool nobody declared an effect class for.
    sdk = ToolSpec(name="legacy_refund", pool="nowhere", parameters={}, effect_declared=False,
                   sdk_tool=True)  # fmt: skip
    await publish_tools(redis, keys, [sdk])
    done = _review(fleet)
    assert done.returncode == 1 and "legacy_refund" in done.stderr
    assert "open_ticket@1" in done.stdout and "first action" in done.stdout
    assert "submit_order@1" in done.stdout
    assert "submit_order" not in done.stderr and "open_ticket" not in done.stderr
    # Declaring why it may run unattended settles the review.
    await publish_tools(redis, keys, [sdk.model_copy(update={"unattended_reason": "refunds "
                                                             "are capped at 5 EUR"})])  # fmt: skip
    again = _review(fleet)
    assert "legacy_refund" not in again.stderr
    assert "opted out of the release gate: refunds are capped at 5 EUR" in again.stdout


def _review(fleet: LocalFleet) -> subprocess.CompletedProcess[str]:
    return fleet.cli("tools", "review", check=False)
