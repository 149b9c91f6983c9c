"""The planner's handlers driven directly: an in-memory bus, the real Redis.

Services take their bus and Redis in their constructors, so a test can hand the planner an
``InMemoryBus`` and look at exactly what it would have published, without a broker.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from redis.asyncio import Redis

from executors import ToolRegistry
from kernel.errors import InvalidMessageError
from kernel.settings import Settings
from kernel.stores.admission import Admission
from kernel.stores.door import Stores
from kernel.stores.keys import Keys
from kernel.stores.registry import publish_tools
from planner import REUSED_IN_FLIGHT
from planner.service import Planner
from schemas import (
    CallError,
    CallOutcome,
    CancelRequest,
    ExecutionCommand,
    ModelResponseEvent,
    TurnPlan,
)
from toolfleet.testing import ConsumedRecord, InMemoryBus

pytestmark = pytest.mark.integration

tools = ToolRegistry()


@tools.tool(effect="read_only")
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


def _response(
    run_id: str, *calls: tuple[str, dict[str, int]], **config: object
) -> ModelResponseEvent:
    return ModelResponseEvent.model_validate({
        "tenant_id": "t", "run_id": run_id, "turn_id": 0, "agent": {"name": "a"},
        "response_id": f"resp-{run_id}", "config": config,
        "items": [{"type": "function_call", "call_id": f"{run_id}-{i}", "name": name,
                   "arguments": json.dumps(args)} for i, (name, args) in enumerate(calls)],
    })  # fmt: skip


async def _serving(own: Settings, redis: Redis, *, slots: int = 100) -> Planner:
    """A planner of ``own``'s deployment whose pool a worker serves: its tools published and
    its slots registered, as a running worker keeps them (admission admits up to them)."""
    await publish_tools(redis, Keys.of(own), tools.specs("default"))
    if slots:
        await Admission(redis, Keys.of(own)).register_worker(
            "default", "worker-1", slots, ttl_s=300, now=time.time()
        )
    return Planner(own, bus=InMemoryBus(settings=own), stores=Stores(redis, own))


@pytest.fixture
async def planner(settings: Settings, redis: Redis) -> Planner:
    own = settings.model_copy(update={"topic_prefix": f"handlers-{uuid.uuid4().hex[:8]}."})
    return await _serving(own, redis)


async def test_a_command_waits_in_admission_until_a_worker_serves_its_pool(
    settings: Settings, redis: Redis
) -> None:
    own = settings.model_copy(update={"topic_prefix": f"idle-{uuid.uuid4().hex[:8]}."})
    planner = await _serving(own, redis, slots=0)
    bus = planner.bus
    assert isinstance(bus, InMemoryBus)
    run = f"run-{uuid.uuid4().hex}"
    await planner.handle(
        ConsumedRecord.of(
            own, "model-responses", _response(run, ("add", {"a": 1, "b": 2})), key=run
        )
    )
    assert bus.on("commands.default") == []  # no slot anywhere: nothing reaches Kafka
    await Admission(redis, Keys.of(own)).register_worker(
        "default", "worker-1", 1, ttl_s=300, now=time.time()
    )
    await planner.admitter.tick(planner._report_never_started)
    [command] = [ExecutionCommand.decode(raw) for raw in bus.on("commands.default")]
    assert (command.run_id, command.admitted) == (run, True)


async def test_a_response_becomes_one_plan_and_one_command_per_call(planner: Planner) -> None:
    bus = planner.bus
    assert isinstance(bus, InMemoryBus)
    run = f"run-{uuid.uuid4().hex}"
    event = _response(run, ("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4}), deadline_s=30)
    await planner.handle(ConsumedRecord.of(planner.settings, "model-responses", event, key=run))

    [plan] = [TurnPlan.decode(raw) for raw in bus.on("plans")]
    assert [c.call_id for c in plan.calls] == [f"{run}-0", f"{run}-1"]
    commands = [ExecutionCommand.decode(raw) for raw in bus.on("commands.default")]
    assert [(c.call_id, c.arguments, c.attempt) for c in commands] == [
        (f"{run}-0", '{"a": 1, "b": 2}', 1), (f"{run}-1", '{"a": 3, "b": 4}', 1),
    ]  # fmt: skip
    assert all(c.deadline_at is not None for c in commands)
    # The ledger records every call before its command is published, with its turn's policy.
    entries = await planner.ledger.read("t", run, [c.call_id for c in commands])
    assert {e.state for e in entries.values()} == {"dispatched"}
    assert {e.policy.deadline_s for e in entries.values()} == {30}


async def test_the_same_response_again_issues_no_new_attempt_and_no_second_command(
    planner: Planner,
) -> None:
    bus = planner.bus
    assert isinstance(bus, InMemoryBus)
    run = f"run-{uuid.uuid4().hex}"
    record = ConsumedRecord.of(
        planner.settings, "model-responses", _response(run, ("add", {"a": 1, "b": 1})), key=run
    )
    await planner.handle(record)
    await planner.handle(record)  # redelivered after a rebalance
    commands = [ExecutionCommand.decode(raw) for raw in bus.on("commands.default")]
    # The same attempt, already admitted: admission does not send it again (and were it
    # sent, the worker's ledger gate would run it at most once).
    assert [(c.call_id, c.attempt, c.fencing_token) for c in commands] == [(f"{run}-0", 1, 1)]


async def test_bytes_that_are_not_a_response_raise_for_the_dead_letter_topic(
    planner: Planner,
) -> None:
    record = ConsumedRecord(planner.settings.topic("model-responses"), b"{not json", b"run")
    with pytest.raises(InvalidMessageError):
        await planner.handle(record)


def _numbered(run_id: str, arguments: dict[str, int]) -> ModelResponseEvent:
    """A response whose one call is ``call_0``, as providers that number their calls write."""
    return ModelResponseEvent.model_validate({
        "tenant_id": "t", "run_id": run_id, "turn_id": 0, "agent": {"name": "a"},
        "response_id": f"resp-{run_id}",
        "items": [{"type": "function_call", "call_id": "call_0", "name": "add",
                   "arguments": json.dumps(arguments)}],
    })  # fmt: skip


async def _plan(planner: Planner, event: ModelResponseEvent) -> TurnPlan:
    bus = planner.bus
    assert isinstance(bus, InMemoryBus)
    before = len(bus.on("plans"))
    await planner.handle(
        ConsumedRecord.of(planner.settings, "model-responses", event, key=event.run_id)
    )
    [plan] = [TurnPlan.decode(raw) for raw in bus.on("plans")[before:]]
    return plan


async def test_two_runs_of_a_tenant_may_both_use_call_0_for_different_calls(
    planner: Planner,
) -> None:
    first, second = f"run-{uuid.uuid4().hex}", f"run-{uuid.uuid4().hex}"
    assert (await _plan(planner, _numbered(first, {"a": 1, "b": 2}))).error is None
    assert (await _plan(planner, _numbered(second, {"a": 5, "b": 5}))).error is None
    bus = planner.bus
    assert isinstance(bus, InMemoryBus)
    commands = [ExecutionCommand.decode(raw) for raw in bus.on("commands.default")]
    assert [(c.run_id, c.call_id, c.arguments) for c in commands] == [
        (first, "call_0", '{"a": 1, "b": 2}'), (second, "call_0", '{"a": 5, "b": 5}'),
    ]  # fmt: skip


async def test_with_tenant_identity_scope_a_second_run_reusing_call_0_is_refused(
    settings: Settings, redis: Redis
) -> None:
    own = settings.model_copy(
        update={"topic_prefix": f"scope-{uuid.uuid4().hex[:8]}.", "identity_scope": "tenant"}
    )
    planner = await _serving(own, redis)
    first, second = f"run-{uuid.uuid4().hex}", f"run-{uuid.uuid4().hex}"
    assert (await _plan(planner, _numbered(first, {"a": 1, "b": 2}))).error is None
    refused = await _plan(planner, _numbered(second, {"a": 5, "b": 5}))
    assert refused.error is not None
    # The first call_0 is still in flight (dispatched, no worker here): the SDK's text for an
    # id reused for a different invocation.
    assert refused.error.message == REUSED_IN_FLIGHT
    bus = planner.bus
    assert isinstance(bus, InMemoryBus)
    commands = [ExecutionCommand.decode(raw) for raw in bus.on("commands.default")]
    assert [(c.run_id, c.call_id) for c in commands] == [(first, "call_0")]


async def test_a_capped_turn_cancelled_with_its_run_reports_no_queued_call_skipped_as_failed(
    planner: Planner,
) -> None:
    """The concurrency gate asks the aggregator's question (``kernel.rules.effects.fails_turn``):
    a call that ends cancelled after its run was cancelled is the run's cancellation, not a
    failure of the turn, so the gate does not declare the turn failed and report the calls it
    holds back as skipped (they never start: the run is cancelled)."""
    bus = planner.bus
    assert isinstance(bus, InMemoryBus)
    run = f"run-{uuid.uuid4().hex}"
    event = _response(
        run, *(("add", {"a": i, "b": i}) for i in range(3)),
        max_concurrency=1, failure_policy="fail_turn",
    )  # fmt: skip
    await planner.handle(ConsumedRecord.of(planner.settings, "model-responses", event, key=run))
    [first] = [ExecutionCommand.decode(raw) for raw in bus.on("commands.default")]
    assert first.call_id == f"{run}-0" and first.capped

    await planner.on_cancel(CancelRequest(tenant_id="t", run_id=run, reason="user stopped"))
    cancelled = CallOutcome(
        tenant_id="t", run_id=run, turn_id=0, call_id=first.call_id, tool_name="add", index=0,
        attempt=first.attempt, fencing_token=first.fencing_token, capped=True, admitted=True,
        status="cancelled", effect="unknown", fails_turn=True,
        error=CallError(type="CancelledError", message="cancelled", severity="cancellation"),
    )  # fmt: skip
    await planner.on_outcome(cancelled)
    assert bus.on("outcomes") == []  # no call reported skipped: the turn did not fail
    assert [ExecutionCommand.decode(raw).call_id for raw in bus.on("commands.default")] == [
        first.call_id
    ]  # and nothing more starts: the run is cancelled


async def test_a_capped_turns_call_the_fleet_retries_holds_its_place_until_it_settles(
    planner: Planner,
) -> None:
    """An outcome the fleet still acts on (unresolved: the reconciler retries it, or settles
    its unknown effect) is not the call's end: under fail_turn it fails nothing (the attempt
    after it may succeed), and it releases nothing (its retry takes its place). Its settling
    outcome does. (Seed 2106: the held-back call was reported skipped, then ran on resume.)"""
    bus = planner.bus
    assert isinstance(bus, InMemoryBus)
    run = f"run-{uuid.uuid4().hex}"
    event = _response(
        run, *(("add", {"a": i, "b": i}) for i in range(2)),
        max_concurrency=1, failure_policy="fail_turn",
    )  # fmt: skip
    await planner.handle(ConsumedRecord.of(planner.settings, "model-responses", event, key=run))
    [first] = [ExecutionCommand.decode(raw) for raw in bus.on("commands.default")]
    transient = CallOutcome(
        tenant_id="t", run_id=run, turn_id=0, call_id=first.call_id, tool_name="add", index=0,
        attempt=1, fencing_token=first.fencing_token, capped=True, admitted=True,
        status="failed", effect="not_executed", resolved=False, retry="transient",
    )  # fmt: skip
    await planner.on_outcome(transient)
    assert bus.on("outcomes") == []  # nothing reported skipped
    assert [ExecutionCommand.decode(raw).call_id for raw in bus.on("commands.default")] == [
        first.call_id
    ]  # and nothing more started
    retried = transient.model_copy(
        update={"attempt": 2, "fencing_token": first.fencing_token + 1, "status": "succeeded",
                "effect": "applied", "resolved": True, "retry": None, "output": "0"}
    )  # fmt: skip
    await planner.on_outcome(retried)
    assert bus.on("outcomes") == []
    assert [ExecutionCommand.decode(raw).call_id for raw in bus.on("commands.default")] == [
        first.call_id, f"{run}-1",
    ]  # fmt: skip
