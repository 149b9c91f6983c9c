"""One trace per turn: the planner's, two workers' and the aggregator's spans, parented.

The services run in this process (as ``toolfleet planner``/``worker``/``aggregator`` would
run them, over real Kafka and Redis) so that one in-memory exporter sees every span; the
trace context between them travels only as it does between processes: in Kafka headers, and
with a command queued for admission or a plan kept in the aggregator's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from agents import Agent, function_tool
from agents.tracing import set_tracing_disabled
from aiokafka.partitioner import DefaultPartitioner
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from aggregator.service import Aggregator
from executors.worker import Worker
from kernel.adapters.bus import KafkaBus
from kernel.adapters.redis import connect_redis
from kernel.adapters.topics import command_topic
from kernel.adapters.tracing import tracer
from kernel.settings import Settings
from kernel.stores.door import Stores
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger
from planner.service import Planner
from schemas import ModelResponseEvent
from tests.conftest import wait_for
from tests.integration.fleet_tools import tools
from tests.integration.sdk_diff import Script
from toolfleet.agents import FleetRunner
from toolfleet.client import FleetClient
from toolfleet.testing import capture_spans

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]

SECRET_ARGUMENT = "marker-7f3a-value"
"""An argument value that must appear in no span attribute."""


@dataclass
class TracedFleet:
    """Services running in this process, the spans they made, and a client."""

    spans: InMemorySpanExporter
    workers: list[Worker]
    client: FleetClient
    settings: Settings


@pytest.fixture(scope="module")
async def fleet(settings: Settings, topics: list[str]) -> AsyncIterator[TracedFleet]:
    # The test tools record their side effects in the Redis a worker process would be given.
    with capture_spans() as exporter, _environment(REDIS_URL=settings.redis_url):
        connections = [connect_redis(settings) for _ in range(4)]
        workers = [
            Worker(
                settings,
                tools,
                "default",
                worker_id=f"traced-{n}",
                bus=KafkaBus(settings, f"worker-{n}"),
                stores=Stores(connections[n], settings),
            )
            for n in range(2)
        ]
        services = [
            Planner(
                settings, bus=KafkaBus(settings, "planner"), stores=Stores(connections[2], settings)
            ),
            *workers,
            Aggregator(
                settings,
                bus=KafkaBus(settings, "aggregator"),
                stores=Stores(connections[3], settings),
            ),
        ]
        running = [asyncio.create_task(service.run()) for service in services]

        async def both_workers_own_partitions() -> bool:
            for task in running:
                if task.done():
                    task.result()  # a service that died says why
            return all(w.owned_partitions for w in workers)

        try:
            await wait_for(both_workers_own_partitions, within=60)
            async with FleetClient(settings) as client:
                yield TracedFleet(exporter, workers, client, settings)
        finally:
            for service in services:
                service.stop()
            await asyncio.gather(*running, return_exceptions=True)
            for connection in connections:
                await connection.aclose()


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def turn(settings: Settings) -> ModelResponseEvent:
    """A turn of calls whose command keys cover every partition of the pool's topic, so
    both workers (each owns some partitions) run some of them."""
    run = f"run-{uuid.uuid4().hex[:10]}"
    partitions = list(range(settings.partitions_of(command_topic("default"))))
    by_partition: dict[int, str] = {}
    n = 0
    while len(by_partition) < len(partitions):
        call_id = f"{run}-c{n}"
        chosen = DefaultPartitioner()(call_id.encode(), partitions, partitions)
        by_partition.setdefault(chosen, call_id)
        n += 1
    items = [
        {
            "type": "function_call",
            "call_id": call_id,
            "name": "guarded_echo" if i % 2 else "add",
            "arguments": json.dumps({"text": SECRET_ARGUMENT} if i % 2 else {"a": i, "b": 1}),
        }
        for i, call_id in enumerate(by_partition.values())
    ]
    return ModelResponseEvent.model_validate(
        {
            "tenant_id": "acme",
            "run_id": run,
            "turn_id": 0,
            "agent": {"name": "assistant"},
            "response_id": f"resp-{uuid.uuid4().hex[:8]}",
            "items": items,
        }
    )


@dataclass
class Trace:
    """The spans of one run, by role."""

    all: list[ReadableSpan]

    def named(self, prefix: str) -> list[ReadableSpan]:
        """The spans whose name starts with ``prefix``."""
        return [s for s in self.all if s.name.startswith(prefix)]

    def one(self, prefix: str) -> ReadableSpan:
        """The only span whose name starts with ``prefix``."""
        [span] = self.named(prefix)
        return span

    def children(self, parent: ReadableSpan) -> list[ReadableSpan]:
        """The spans whose parent is ``parent``."""
        own = _id(parent)
        return [s for s in self.all if s.parent is not None and s.parent.span_id == own]


async def trace_of(fleet: TracedFleet, event: ModelResponseEvent) -> Trace:
    """Every span of ``event``'s turn, once its aggregation span has ended."""
    run = event.run_id

    def ours() -> list[ReadableSpan]:
        spans: Sequence[ReadableSpan] = fleet.spans.get_finished_spans()
        mine = [s for s in spans if (s.attributes or {}).get("toolfleet.run_id") == run]
        ids = {_id(s) for s in mine}
        # Phases (gate, body, publish...) carry no ids of their own: they are children.
        phases = [
            s
            for s in spans
            if s.parent is not None and s.parent.span_id in ids and _id(s) not in ids
        ]
        return mine + phases

    async def complete() -> bool:  # a span is exported when it ends: phases before calls
        trace = Trace(ours())
        calls = len(trace.named("toolfleet call"))
        return bool(trace.named("toolfleet aggregate")) and calls == len(event.function_calls)

    try:
        await wait_for(complete, within=10)
    except AssertionError:
        got = [(s.name, _scope(s), dict(s.attributes or {})) for s in ours()]
        raise AssertionError(f"spans of {run}: {got}") from None
    return Trace(ours())


def _id(span: ReadableSpan) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.span_id


def _trace_id(span: ReadableSpan) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.trace_id


def _scope(span: ReadableSpan) -> str:
    scope = span.instrumentation_scope
    assert scope is not None
    return scope.name


def _check_turn_shape(trace: Trace, event: ModelResponseEvent) -> ReadableSpan:
    """One trace, the planner's span at its root inside the fleet, a call span per call (on
    both workers) with its phases, and the aggregation: returns the planner's span."""
    plan = trace.one("toolfleet plan")
    assert _scope(plan) == "toolfleet.planner"
    assert "ledger" in {s.name for s in trace.children(plan)}  # the plan's own phase
    assert {_trace_id(s) for s in trace.all} == {_trace_id(plan)}
    calls = trace.named("toolfleet call")
    assert len(calls) == len(event.function_calls)
    assert {_scope(s) for s in calls} == {"toolfleet.worker"}
    for call in calls:
        assert call.parent is not None and call.parent.span_id == _id(plan)
        attributes = call.attributes or {}
        assert attributes["messaging.system"] == "kafka"
        assert attributes["rpc.method"] in ("add", "guarded_echo")
        assert attributes["toolfleet.status"] == "succeeded"
        assert attributes["toolfleet.effect"] == "applied"
        phases = {s.name for s in trace.children(call)}
        expected = {"gate", "body", "publish"}
        if attributes["rpc.method"] == "guarded_echo":
            expected.add("guardrails.input")
        assert phases == expected, (call.name, phases)
    workers = {(s.attributes or {})["toolfleet.worker_id"] for s in calls}
    assert workers == {"traced-0", "traced-1"}
    aggregate = trace.one("toolfleet aggregate")
    assert _scope(aggregate) == "toolfleet.aggregator"
    assert aggregate.parent is not None and aggregate.parent.span_id == _id(plan)
    for span in trace.all:  # never an argument value
        assert SECRET_ARGUMENT not in json.dumps(dict(span.attributes or {}), default=str)
    return plan


async def test_a_turn_joins_the_trace_of_the_client_traceparent(fleet: TracedFleet) -> None:
    client_trace, client_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    event = turn(fleet.settings)
    result = await fleet.client.run_turn(event, traceparent=f"00-{client_trace}-{client_span}-01")
    assert result.status == "completed", result.model_dump_json()
    plan = _check_turn_shape(await trace_of(fleet, event), event)
    assert format(_trace_id(plan), "032x") == client_trace
    assert plan.parent is not None and format(plan.parent.span_id, "016x") == client_span
    # The ledger names the trace, for a call's page and `toolfleet inspect call`.
    redis = connect_redis(fleet.settings)
    try:
        ledger = Ledger(redis, Keys.of(fleet.settings), fleet.settings.ledger_retention_s)
        entries = await ledger.read("acme", event.run_id, [c.call_id for c in event.function_calls])
    finally:
        await redis.aclose()
    assert {e.trace_id for e in entries.values()} == {client_trace}


async def test_without_a_trace_each_turn_starts_its_own(fleet: TracedFleet) -> None:
    first, second = turn(fleet.settings), turn(fleet.settings)
    for event in (first, second):
        assert (await fleet.client.run_turn(event)).status == "completed"
    plans = [_check_turn_shape(await trace_of(fleet, e), e) for e in (first, second)]
    assert all(p.parent is None for p in plans)
    assert _trace_id(plans[0]) != _trace_id(plans[1])


async def test_the_current_span_of_the_caller_is_the_parent(fleet: TracedFleet) -> None:
    """As an agent runtime traced with OpenTelemetry (``FleetRunner`` submits its batches in
    the caller's context) sees it: the turn is a child of the span current at submission."""
    event = turn(fleet.settings)
    with tracer("agent-runtime").start_as_current_span("agent turn") as agent:
        assert (await fleet.client.run_turn(event)).status == "completed"
    plan = _check_turn_shape(await trace_of(fleet, event), event)
    context: Any = agent.get_span_context()
    assert _trace_id(plan) == context.trace_id
    assert plan.parent is not None and plan.parent.span_id == context.span_id


async def test_a_fleet_runner_run_is_inside_the_agent_runtimes_trace(fleet: TracedFleet) -> None:
    """``FleetRunner`` submits the calls of a response in its caller's context: an agent
    runtime traced with OpenTelemetry sees the fleet's spans inside its own trace."""
    set_tracing_disabled(True)  # the SDK's own traces (exported to OpenAI) are not under test

    @function_tool
    def add(a: int, b: int) -> int:
        """Adds two numbers (served by the fleet's workers under the same name)."""
        return a + b

    script = Script()
    script.turn(script.call("a", "add", {"a": 1, "b": 2})).answer()
    agent = Agent(name="assistant", model=script.model(), tools=[add])
    runner = FleetRunner(fleet.client, tenant_id="acme", turn_timeout=30)
    with tracer("agent-runtime").start_as_current_span("agent run") as agent_run:
        result = await runner.run(agent, "add one and two")
    assert result.final_output == "done"
    run_id = runner.run_id_of(result)

    async def planned() -> list[ReadableSpan]:
        return [
            s
            for s in fleet.spans.get_finished_spans()
            if s.name == "toolfleet plan" and (s.attributes or {}).get("toolfleet.run_id") == run_id
        ]

    [plan] = await wait_for(planned, within=10)
    context: Any = agent_run.get_span_context()
    assert _trace_id(plan) == context.trace_id
    assert plan.parent is not None and plan.parent.span_id == context.span_id


async def test_span_attributes_name_topics_and_groups_as_kafka_knows_them(
    fleet: TracedFleet,
) -> None:
    """The deployment's topic prefix is part of every topic and consumer group name an
    operator finds in Kafka; the spans name them the same way (they named the planner's
    group ``planner`` and the aggregator's topic ``turn-results``, without the prefix)."""
    settings = fleet.settings
    assert settings.topic_prefix  # this session's own: the names below must carry it
    event = turn(settings)
    assert (await fleet.client.run_turn(event)).status == "completed"
    trace = await trace_of(fleet, event)
    plan = trace.one("toolfleet plan").attributes or {}
    assert plan["messaging.destination.name"] == settings.topic("model-responses")
    assert plan["messaging.consumer.group.name"] == settings.group("planner")
    for call in trace.named("toolfleet call"):
        attributes = call.attributes or {}
        assert attributes["messaging.destination.name"] == settings.topic("commands.default")
        assert attributes["messaging.consumer.group.name"] == settings.group("workers.default")
    aggregate = trace.one("toolfleet aggregate").attributes or {}
    assert aggregate["messaging.destination.name"] == settings.topic("turn-results")
