"""Hostile input through the public topics: nothing crashes, nothing is lost, tenants stay apart.

Each test reproduces one observation of an outside test of the fleet (oversized garbage that
used to crash-loop the planner and wedge the aggregator, an argument object that made its
outcome unpublishable, cancellations that crossed tenants) and checks the fleet is whole
afterwards: every service alive and a valid turn completing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from redis.asyncio import Redis

from kernel.adapters.bus import KafkaBus
from kernel.adapters.topics import ensure_topics
from kernel.errors import UsageError
from kernel.rules.texts import DEFAULT_ERROR
from kernel.settings import Settings
from schemas import ApprovalDecision, CallOutcome, CancelRequest, DeadLetter, ModelResponseEvent
from tests.conftest import wait_for
from tests.integration.fleet_tools import effects_key, starts_key
from tests.integration.test_pipeline import turn
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    with LocalFleet(settings, tools="tests.integration.fleet_tools:tools", workers=2) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


async def _letters(
    bus: KafkaBus, group: str, wanted: Callable[[DeadLetter], bool], count: int
) -> list[DeadLetter]:
    """The first ``count`` dead letters that ``wanted`` accepts, reading from the start."""
    consumer = bus.consumer(["dead-letter"], group=group)
    await consumer.start()
    found: list[DeadLetter] = []

    async def more() -> bool:
        batch = await consumer.getmany(timeout_ms=500)
        for records in batch.values():
            letters = (DeadLetter.model_validate_json(r.value or b"") for r in records)
            found.extend(letter for letter in letters if wanted(letter))
        return len(found) >= count

    try:
        await wait_for(more, within=60)
    finally:
        await consumer.stop()
    return found


async def _still_serving(fleet: LocalFleet, client: FleetClient) -> None:
    event = turn(("ok", "sleep_then_echo", {"text": "still here"}))
    result = await client.run_turn(event, within=60)
    assert result.outputs[0].output == "still here"
    fleet.check()  # every service process is alive


async def test_oversized_garbage_is_dead_lettered_cut_and_no_service_stops(
    fleet: LocalFleet, client: FleetClient, bus: KafkaBus, settings: Settings
) -> None:
    garbage = {topic: os.urandom(900_000) for topic in ("model-responses", "approvals",
                                                         "cancellations")}  # fmt: skip
    for topic, raw in garbage.items():
        await bus.publish_and_wait(topic, b"hostile-big", raw)
    digests = {hashlib.sha256(raw).hexdigest() for raw in garbage.values()}

    # The planner reads all three topics, the aggregator cancellations too: each dead-letters
    # what it cannot read, and goes on.
    letters = await _letters(bus, "hostile-big", lambda d: d.value_sha256 in digests, 4)
    for letter in letters:
        assert letter.value_cut and letter.value_size == 900_000
        assert letter.value is not None
        assert len(letter.value) == settings.dead_letter_value_max_bytes
        assert "not valid JSON" in letter.reason
    by_topic = sorted((d.original_topic.rsplit(".", 1)[-1], d.service) for d in letters)
    assert by_topic == [
        ("approvals", "planner"), ("cancellations", "aggregator"),
        ("cancellations", "planner"), ("model-responses", "planner"),
    ]  # fmt: skip
    await _still_serving(fleet, client)


async def test_an_argument_object_with_ten_thousand_keys_still_gets_its_result(
    fleet: LocalFleet, client: FleetClient
) -> None:
    args = {f"key{i}": i for i in range(10_000)}
    event = turn(("wide", "sleep_then_echo", args))
    await client.submit(event)
    result = await result_of(fleet, client, event.run_id, within=60)
    assert (result.status, result.outputs[0].output) == ("completed", DEFAULT_ERROR)
    assert (result.calls[0].status, result.calls[0].effect) == ("failed", "not_executed")
    await _still_serving(fleet, client)


async def test_loosely_typed_fields_are_dead_lettered_not_coerced(
    fleet: LocalFleet, client: FleetClient, bus: KafkaBus
) -> None:
    base = turn(("c", "sleep_then_echo", {"text": "x"})).model_dump(mode="json")
    variants = [dict(base, turn_id="7"), dict(base, turn_id=True), dict(base, turn_id=7.0),
                dict(base, schema_version=True), dict(base, resume="yes")]  # fmt: skip
    marker = base["run_id"]
    for variant in variants:
        await bus.publish_and_wait("model-responses", marker, json.dumps(variant).encode())
    letters = await _letters(bus, f"lax-{marker}", lambda d: d.key == marker.encode(), 5)
    assert len(letters) == 5 and all(d.service == "planner" for d in letters)
    await _still_serving(fleet, client)


def _tenant(event: ModelResponseEvent, tenant: str) -> ModelResponseEvent:
    return event.model_copy(update={"tenant_id": tenant})


async def _started(redis: Redis, call_id: str) -> bool:
    return bool(await redis.exists(starts_key(call_id)))


async def test_a_cancellation_never_reaches_another_tenants_calls(
    fleet: LocalFleet, client: FleetClient, redis: Redis
) -> None:
    a = turn(("a", "charge", {"amount": 1, "hold_ms": 2_000}))
    run_id, a_call = a.run_id, a.function_calls[0].call_id
    await client.submit(a)
    await wait_for(lambda: _started(redis, a_call))
    # Tenant beta names acme's run and call: parent and tool-local cancellation.
    await client.cancel(CancelRequest(tenant_id="beta", run_id=run_id, reason="hostile"))
    await client.cancel(
        CancelRequest(tenant_id="beta", run_id=run_id, call_id=a_call, reason="hostile")
    )
    result = await result_of(fleet, client, run_id)
    assert (result.status, result.outputs[0].output) == ("completed", "charged 1")
    assert int(await redis.get(effects_key(a_call)) or 0) == 1

    # acme's next turn in that run is not skipped by beta's cancellation either.
    again = turn(("a2", "sleep_then_echo", {"text": "next"}), run_id=run_id)
    again = again.model_copy(update={"turn_id": 1})
    assert (await client.run_turn(again)).outputs[0].output == "next"

    # Both tenants use one new run id; acme cancels its run: beta's call under it goes on.
    b = _tenant(turn(("b", "charge", {"amount": 2, "hold_ms": 2_000})), "beta")
    b_call = b.function_calls[0].call_id
    await client.submit(b)
    await wait_for(lambda: _started(redis, b_call))
    await client.cancel(CancelRequest(tenant_id="acme", run_id=b.run_id, reason="done"))
    b_result = await result_of(fleet, client, b.run_id)
    assert (b_result.tenant_id, b_result.outputs[0].output) == ("beta", "charged 2")


async def test_two_tenants_turns_of_one_run_id_each_get_their_own_result(
    client: FleetClient,
) -> None:
    """One client for two tenants that number their runs alike: the turns share run id and
    turn id, and each gets its own tenant's result and, when followed, outcomes."""
    acme = turn(("c", "sleep_then_echo", {"text": "for acme"}))
    beta = _tenant(turn(("c", "sleep_then_echo", {"text": "for beta"}), run_id=acme.run_id), "beta")
    seen: dict[str, list[CallOutcome]] = {"acme": [], "beta": []}
    stops = [
        await client.follow(acme.run_id, 0, seen[tenant].append, tenant_id=tenant)
        for tenant in seen
    ]
    try:
        for_beta, for_acme = await asyncio.gather(client.run_turn(beta), client.run_turn(acme))
    finally:
        for stop in stops:
            stop()
    assert (for_acme.tenant_id, for_acme.outputs[0].output) == ("acme", "for acme")
    assert (for_beta.tenant_id, for_beta.outputs[0].output) == ("beta", "for beta")
    for tenant, outcomes in seen.items():
        assert outcomes and {(o.tenant_id, o.output) for o in outcomes} == {
            (tenant, f"for {tenant}")
        }
    # Awaited without its tenant, a turn the client holds for both is ambiguous.
    for tenant in seen:
        client.expect(acme.run_id, 1, tenant_id=tenant)
    with pytest.raises(UsageError, match="tenant_id"):
        await client.result(acme.run_id, 1, within=1)


def _shared_call_id_in_three_runs(call_id: str) -> list[ModelResponseEvent]:
    return [
        ModelResponseEvent.model_validate(
            {
                "tenant_id": "acme", "run_id": f"run-{uuid.uuid4().hex[:8]}", "turn_id": 0,
                "agent": {"name": "a"}, "response_id": f"resp-{i}",
                "items": [{"type": "function_call", "call_id": call_id, "name": "charge",
                           "arguments": json.dumps({"amount": 7, "hold_ms": 300})}],
            }
        )
        for i in range(3)
    ]  # fmt: skip


async def _each_turn_gets_its_result(
    fleet: LocalFleet, client: FleetClient, events: list[ModelResponseEvent]
) -> None:
    await asyncio.gather(*(client.submit(event) for event in events))
    results = [await result_of(fleet, client, event.run_id) for event in events]
    for event, result in zip(events, results, strict=True):
        assert (result.run_id, result.status) == (event.run_id, "completed")
        assert result.outputs[0].output == "charged 7"


async def test_one_call_id_in_several_runs_is_a_call_of_each_run(
    fleet: LocalFleet, client: FleetClient, redis: Redis
) -> None:
    """Identity is per run, as in the SDK: providers that number their calls reuse ids."""
    call_id = f"shared-{uuid.uuid4().hex[:8]}"
    await _each_turn_gets_its_result(fleet, client, _shared_call_id_in_three_runs(call_id))
    assert int(await redis.get(effects_key(call_id)) or 0) == 3  # three runs, three calls


async def test_with_tenant_scope_one_new_call_id_in_several_runs_at_once_runs_once(
    settings: Settings, redis: Redis
) -> None:
    own = settings.model_copy(
        update={"topic_prefix": f"tenant-scope-{uuid.uuid4().hex[:6]}.", "identity_scope": "tenant"}
    )
    await ensure_topics(own)
    with LocalFleet(own, tools="tests.integration.fleet_tools:tools", workers=1) as scoped:
        async with connected_client(scoped, own) as client:
            call_id = f"shared-{uuid.uuid4().hex[:8]}"
            events = _shared_call_id_in_three_runs(call_id)
            await _each_turn_gets_its_result(scoped, client, events)
    assert int(await redis.get(effects_key(call_id)) or 0) == 1  # one identity, one effect


async def test_unsigned_and_forged_decisions_are_dead_lettered_and_change_nothing(
    fleet: LocalFleet, client: FleetClient, bus: KafkaBus, redis: Redis
) -> None:
    running = turn(("a", "charge", {"amount": 3, "hold_ms": 1_500}))
    call_id = running.function_calls[0].call_id
    await client.submit(running)
    await wait_for(lambda: _started(redis, call_id))
    unsigned = CancelRequest(tenant_id="acme", run_id=running.run_id, reason="unsigned")
    await bus.publish_and_wait("cancellations", running.run_id, unsigned)
    result = await result_of(fleet, client, running.run_id)
    assert (result.status, result.outputs[0].output) == ("completed", "charged 3")

    gated = turn(("g", "delete_repo", {"name": "prod"}))
    first = await client.run_turn(gated)
    assert first.status == "interrupted"
    forged = ApprovalDecision(
        tenant_id="acme", run_id=gated.run_id, call_id=gated.function_calls[0].call_id,
        tool_name="delete_repo", approve=True, decided_by="mallory",
        signature="hmac-sha256:" + "0" * 64,
    )  # fmt: skip
    await bus.publish_and_wait("approvals", gated.run_id, forged)
    keys = {running.run_id.encode(), gated.run_id.encode()}
    letters = await _letters(bus, f"auth-{gated.run_id}", lambda d: d.key in keys, 3)
    reasons = sorted((d.service, d.reason.split(":")[0]) for d in letters)
    assert reasons == [
        ("aggregator", "unsigned CancelRequest"), ("planner", "forged ApprovalDecision"),
        ("planner", "unsigned CancelRequest"),
    ]  # fmt: skip
    again = await client.run_turn(gated.model_copy(update={"resume": True}))
    assert again.status == "interrupted"  # the forged approval decided nothing
