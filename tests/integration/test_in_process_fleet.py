"""toolfleet.testing.InProcessFleet: the real services on the test's event loop, against the
real broker and Redis, serving tool objects made at run time.

Each test defines its tools where an application's test would: inside the test, as closures, or
from a factory; two tests use one name for different bodies. What each shows is fleet
behaviour, observed where the fleet keeps it: the turn result, the ledger in Redis, the
registry the planner reads, the consumer groups' committed offsets.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents import Agent, FunctionTool, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext as SdkToolContext
from agents.tracing import set_tracing_disabled
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from redis.asyncio import Redis

from executors import ProbeResult, ToolContext, ToolRegistry
from kernel.errors import ConfigurationError, UsageError
from kernel.settings import Settings
from kernel.stores.ledger import Ledger
from kernel.stores.registry import live_versions
from schemas import AgentRef, ApprovalDecision, ModelResponseEvent
from tests.conftest import wait_for
from toolfleet.agents import FleetRunner
from toolfleet.serving import current_tool_server
from toolfleet.testing import InProcessFleet

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]

set_tracing_disabled(True)

TENANT = "inproc"


@pytest.fixture(scope="module")
async def fleet(settings: Settings) -> AsyncIterator[InProcessFleet]:
    """One fleet for the module, as a harness's conftest would start one per session."""
    async with InProcessFleet(settings, auto_serve=True) as running:
        yield running


def turn(*calls: tuple[str, str, dict[str, Any]], run_id: str | None = None) -> ModelResponseEvent:
    """A model response calling ``(call_id, tool, arguments)`` in order, in a run of its own."""
    run = run_id or f"run-{uuid.uuid4().hex[:12]}"
    return ModelResponseEvent(
        tenant_id=TENANT,
        run_id=run,
        turn_id=0,
        agent=AgentRef(name="tester"),
        response_id=f"resp-{run}",
        items=[
            {"type": "function_call", "call_id": cid, "name": name, "arguments": json.dumps(args)}
            for cid, name, args in calls
        ],
    )


def get_function_tool(name: str, return_value: str) -> FunctionTool:
    """A function tool built at test time, as the Agents SDK's own tests build theirs."""

    async def invoke(ctx: SdkToolContext[Any], arguments: str) -> str:
        return return_value

    return FunctionTool(
        name=name,
        description=f"Returns {return_value}.",
        params_json_schema={"type": "object", "properties": {}, "additionalProperties": False},
        on_invoke_tool=invoke,
    )


async def approve(
    fleet: InProcessFleet, redis: Redis, event: ModelResponseEvent, tool: str
) -> None:
    """A human's signed approval of the turn's only call, once the planner has recorded it."""
    call_id = event.function_calls[0].call_id
    await fleet.client.decide(
        ApprovalDecision(
            tenant_id=TENANT,
            run_id=event.run_id,
            call_id=call_id,
            tool_name=tool,
            approve=True,
            decided_by="tester",
        )
    )

    async def recorded() -> bool:
        key = fleet.keys.approvals(TENANT, event.run_id)
        return bool(await redis.hexists(key, f"call:{call_id}"))

    await wait_for(recorded)


async def committed_everything(settings: Settings) -> dict[str, list[str]]:
    """Per consumer group of the fleet, the partitions whose committed offset is behind the
    end (empty lists: every record consumed was committed)."""
    groups = {
        "planner": ("model-responses", "approvals", "cancellations", "outcomes"),
        "aggregator": ("plans", "outcomes", "cancellations"),
        "reconciler": ("outcomes", "task-resolutions"),
        "workers.default": ("commands.default",),
    }
    behind: dict[str, list[str]] = {}
    for group, topics in groups.items():
        consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.kafka_servers(),
            group_id=f"{settings.topic_prefix}{group}",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            partitions = [
                TopicPartition(settings.topic(t), p)
                for t in topics
                for p in range(settings.partitions_of(t))
            ]
            ends = await consumer.end_offsets(partitions)
            behind[group] = [
                f"{tp.topic}:{tp.partition}"
                for tp in partitions
                if ends[tp] and (await consumer.committed(tp) or 0) < ends[tp]
            ]
        finally:
            await consumer.stop()
    return behind


async def test_stop_finishes_every_task_commits_every_offset_and_purge_leaves_nothing(
    settings: Settings, redis: Redis
) -> None:
    before = asyncio.all_tasks()
    seen: list[str] = []
    tools = ToolRegistry()

    @tools.tool(effect="read_only")
    async def echo(text: str) -> str:
        """Says it back."""
        seen.append(text)
        return text

    fleet = InProcessFleet(settings, echo, workers=2, auto_serve=True, cleanup=False)
    await fleet.start()
    try:
        assert current_tool_server() is fleet
        result = await fleet.client.run_turn(turn(("c1", "echo", {"text": "hello"})))
        assert [o.output for o in result.outputs] == ["hello"]
    finally:
        await fleet.stop()
    assert current_tool_server() is not fleet
    assert fleet.started_in_s is not None and fleet.stopped_in_s is not None
    print(f"in-process fleet: started in {fleet.started_in_s:.2f} s, "
          f"stopped in {fleet.stopped_in_s:.2f} s")  # fmt: skip
    assert seen == ["hello"]
    left = [t for t in asyncio.all_tasks() - before if t is not asyncio.current_task()]
    assert left == [], f"tasks left behind: {left}"
    assert await committed_everything(fleet.settings) == {
        "planner": [],
        "aggregator": [],
        "reconciler": [],
        "workers.default": [],
    }

    await fleet.purge()
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_servers())
    await admin.start()
    try:
        topics = [t for t in await admin.list_topics() if t.startswith(fleet.settings.topic_prefix)]
    finally:
        await admin.close()
    assert topics == []
    assert [k async for k in redis.scan_iter(match=f"{fleet.keys.namespace}:*")] == []


async def test_a_closure_defined_in_the_test_runs_on_a_worker(
    fleet: InProcessFleet, redis: Redis
) -> None:
    notes: list[str] = []  # the closure's state: only this test's body can reach it
    tools = ToolRegistry()

    @tools.tool(effect="idempotent")
    async def add_note(ctx: ToolContext, text: str) -> str:
        """Adds a note."""
        notes.append(text)
        return f"{len(notes)} note(s), by {ctx.worker_id}"

    await fleet.serve(add_note)
    event = turn(("c1", "add_note", {"text": "buy milk"}))
    result = await fleet.client.run_turn(event)

    assert notes == ["buy milk"]
    assert result.status == "completed"
    entry = (await Ledger(redis, fleet.keys).read(TENANT, event.run_id, ["c1"]))["c1"]
    assert entry.state == "committed" and (entry.worker_id or "").startswith("inproc-")
    assert result.outputs[0].output == f"1 note(s), by {entry.worker_id}"


async def test_a_function_tool_from_a_factory_is_served(fleet: InProcessFleet) -> None:
    await fleet.serve(get_function_tool("foo", "result"), get_function_tool("bar", "other"))
    result = await fleet.client.run_turn(turn(("c1", "foo", {}), ("c2", "bar", {})))
    assert [(o.call_id, o.output) for o in result.outputs] == [("c1", "result"), ("c2", "other")]


async def test_a_function_tool_served_with_fleet_options_is_under_the_release_gate(
    fleet: InProcessFleet,
) -> None:
    refunds: dict[str, str] = {}

    @function_tool
    def refund(order: str) -> str:
        """Refunds an order."""
        refunds[order] = "refunded"
        return f"refunded {order}"

    def find_refund(ctx: ToolContext) -> ProbeResult:
        return ProbeResult.not_applied()

    @function_tool
    def wire_money(to: str) -> str:
        """Sends money: irreversible."""
        return f"sent to {to}"

    [refund_tool] = await fleet.serve(refund, effect="non_idempotent", probe=find_refund)
    [wire_tool] = await fleet.serve(wire_money, effect="irreversible")
    # A non_idempotent tool with a probe runs unattended; an irreversible one waits for a human.
    assert (refund_tool.spec("default").has_probe, refund_tool.needs_approval) == (True, False)
    result = await fleet.client.run_turn(
        turn(("c1", "refund", {"order": "A-1"}), ("c2", "wire_money", {"to": "B"}))
    )
    assert [o.output for o in result.outputs] == ["refunded A-1"]
    assert [i.call_id for i in result.interruptions] == ["c2"] and wire_tool.needs_approval


async def test_a_name_reused_first_body(fleet: InProcessFleet, redis: Redis) -> None:
    @function_tool
    def lookup(city: str) -> str:
        """Looks a city up (the first test's body)."""
        return f"first body: {city}"

    served = (await fleet.serve(lookup))[0]
    result = await fleet.client.run_turn(turn(("c1", "lookup", {"city": "Oslo"})))

    assert (result.status, result.outputs[0].output) == ("completed", "first body: Oslo")
    assert list(await live_versions(redis, fleet.keys, "lookup")) == [served.version]


async def test_a_name_reused_second_body_replaces_the_first_and_its_release_gate(
    fleet: InProcessFleet, redis: Redis
) -> None:
    ran: list[str] = []

    @function_tool(needs_approval=True)
    def lookup(city: str) -> str:
        """Looks a city up (the second test's body, which needs a human's approval)."""
        ran.append(city)
        return f"second body: {city}"

    served = (await fleet.serve(lookup))[0]
    event = turn(("c1", "lookup", {"city": "Bergen"}))
    held = await fleet.client.run_turn(event)

    # The planner plans with the new object's spec at once: the call waits for a human.
    assert held.status == "interrupted" and [i.call_id for i in held.interruptions] == ["c1"]
    assert ran == []
    await approve(fleet, redis, event, "lookup")
    done = await fleet.client.run_turn(event.model_copy(update={"resume": True}))
    assert (done.status, done.outputs[0].output) == ("completed", "second body: Bergen")
    assert ran == ["Bergen"]
    # Only the newest object is live; an earlier test's version is no longer served.
    assert list(await live_versions(redis, fleet.keys, "lookup")) == [served.version]
    entry = (await Ledger(redis, fleet.keys).read(TENANT, event.run_id, ["c1"]))["c1"]
    assert entry.tool_version == served.version


async def test_an_approval_gated_tool_waits_for_a_human_then_runs_once(
    fleet: InProcessFleet, redis: Redis
) -> None:
    charged: list[int] = []
    tools = ToolRegistry()

    @tools.tool(effect="irreversible")
    async def charge_card(cents: int) -> str:
        """Charges the card: irreversible, so the release gate asks a human every time."""
        charged.append(cents)
        return f"charged {cents}"

    await fleet.serve(charge_card)
    event = turn(("c1", "charge_card", {"cents": 1250}))
    held = await fleet.client.run_turn(event)
    assert held.status == "interrupted" and [i.call_id for i in held.interruptions] == ["c1"]
    assert charged == []

    await approve(fleet, redis, event, "charge_card")
    done = await fleet.client.run_turn(event.model_copy(update={"resume": True}))
    assert (done.status, done.outputs[0].output) == ("completed", "charged 1250")
    again = await fleet.client.run_turn(event.model_copy(update={"resume": True}))
    assert again.outputs[0].output == "charged 1250"
    assert charged == [1250]


async def test_a_non_idempotent_call_delivered_twice_has_exactly_one_ledger_entry(
    fleet: InProcessFleet, redis: Redis
) -> None:
    tickets: dict[str, str] = {}
    tools = ToolRegistry()

    @tools.tool(effect="non_idempotent")
    async def open_ticket(ctx: ToolContext, title: str) -> str:
        """Opens a ticket upstream."""
        ticket = f"T-{len(tickets) + 1}"
        tickets[ctx.idempotency_key] = ticket
        return f"opened {ticket}: {title}"

    @open_ticket.probe
    async def find_ticket(ctx: ToolContext) -> ProbeResult:
        found = tickets.get(ctx.idempotency_key)
        return ProbeResult.applied(found) if found else ProbeResult.not_applied()

    await fleet.serve(open_ticket)
    event = turn(("c1", "open_ticket", {"title": "umbrellas"}))
    first = await fleet.client.run_turn(event)
    # The same response again (a runner restarted from a saved state sends it again).
    second = await fleet.client.run_turn(event.model_copy(update={"resume": True}))

    assert first.outputs[0].output == second.outputs[0].output == "opened T-1: umbrellas"
    assert len(tickets) == 1
    ledger = Ledger(redis, fleet.keys)
    entry = (await ledger.read(TENANT, event.run_id, ["c1"]))["c1"]
    assert (entry.state, entry.attempts) == ("committed", 1)
    call_keys = [
        k
        async for k in redis.scan_iter(match=f"{fleet.keys.namespace}:*:call:{TENANT}\x1f*")
        if f"\x1f{event.run_id}\x1f".encode() in k
    ]
    assert call_keys == [fleet.keys.call(TENANT, event.run_id, "c1").encode()]
    events = [e["event"] for e in await ledger.audit(TENANT, event.run_id, "c1")]
    assert events.count("started") == 1 and events.count("finished") == 1


async def test_auto_serve_serves_each_object_before_its_call(fleet: InProcessFleet) -> None:
    server = current_tool_server()
    assert server is fleet  # installed process-wide while the fleet runs
    first = get_function_tool("auto", "from the first object")
    await server.ensure_served(first)
    version = fleet.served("auto").version
    await server.ensure_served(first)  # the same object: nothing changes
    assert fleet.served("auto").version == version
    result = await fleet.client.run_turn(turn(("c1", "auto", {})))
    assert result.outputs[0].output == "from the first object"

    await server.ensure_served(get_function_tool("auto", "from the second object"))
    assert int(fleet.served("auto").version) == int(version) + 1
    result = await fleet.client.run_turn(turn(("c1", "auto", {})))
    assert result.outputs[0].output == "from the second object"


async def test_what_cannot_be_served_is_refused_with_what_to_do(fleet: InProcessFleet) -> None:
    with pytest.raises(ConfigurationError, match=r"serve an agents\.FunctionTool"):
        await fleet.serve(object())
    tools = ToolRegistry()

    @tools.tool(effect="read_only", pool="elsewhere")
    async def pinned() -> str:
        """Pinned to another pool."""
        return "never"

    with pytest.raises(ConfigurationError, match="pool='elsewhere'"):
        await fleet.serve(pinned)


def test_a_synchronous_test_drives_the_fleet_on_its_own_loop(fleet: InProcessFleet) -> None:
    tool = get_function_tool("from_sync", "served from a synchronous test")
    # Another event loop (asyncio.run's) cannot reach the fleet's services: refused, saying how.
    with pytest.raises(UsageError, match="another event loop"):
        asyncio.run(fleet.serve(tool))

    async def call() -> str | None:
        await fleet.serve(tool)
        result = await fleet.client.run_turn(turn(("c1", "from_sync", {})))
        return result.outputs[0].output

    # Between async tests the fleet's loop is idle: a synchronous caller can run on it.
    assert fleet.loop.run_until_complete(call()) == "served from a synchronous test"


@pytest.mark.agent_runtime
async def test_an_agents_sdk_agent_runs_on_fleet_runner_as_in_process(
    fleet: InProcessFleet, redis: Redis
) -> None:
    calls: list[str] = []

    @function_tool
    def weather(city: str) -> str:
        """Today's weather in a city."""
        calls.append(city)
        return f"{city}: 21C, clear"

    def agent(model: ScriptedModel) -> Agent[Any]:
        return Agent(name="forecaster", instructions="Answer with the weather.", model=model,
                     tools=[weather])  # fmt: skip

    def script() -> ScriptedModel:
        return ScriptedModel(
            [
                [function_call("weather", {"city": "Lisbon"}, call_id="w1")],
                [assistant_message("Sunny in Lisbon.")],
            ]
        )

    in_process_model, fleet_model = script(), script()
    expected = await Runner.run(agent(in_process_model), "Weather in Lisbon?")

    await fleet.serve(weather)
    runner = FleetRunner(fleet.client, tenant_id=TENANT)
    result = await runner.run(agent(fleet_model), "Weather in Lisbon?")

    assert result.final_output == expected.final_output == "Sunny in Lisbon."
    assert calls == ["Lisbon", "Lisbon"]  # once in-process, once on the fleet's worker
    outputs = [item.output for item in result.new_items if item.type == "tool_call_output_item"]
    assert outputs == ["Lisbon: 21C, clear"]
    entry = (await Ledger(redis, fleet.keys).read(TENANT, runner.run_id_of(result), ["w1"]))["w1"]
    assert entry.state == "committed" and (entry.worker_id or "").startswith("inproc-")


@pytest.mark.agent_runtime
async def test_fleet_runner_serves_the_tools_it_calls_itself(
    fleet: InProcessFleet, redis: Redis
) -> None:
    """No ``serve``: with ``auto_serve`` the runner has the fleet serve each tool before its
    call; the name is the previous test's, the body this test's."""

    @function_tool
    def weather(city: str) -> str:
        """Today's weather in a city (another body under the previous test's name)."""
        return f"{city}: snow"

    model = ScriptedModel(
        [
            [function_call("weather", {"city": "Tromso"}, call_id="w1")],
            [assistant_message("Snow in Tromso.")],
        ]
    )
    runner = FleetRunner(fleet.client, tenant_id=TENANT)
    result = await runner.run(Agent(name="forecaster", model=model, tools=[weather]), "Tromso?")

    outputs = [item.output for item in result.new_items if item.type == "tool_call_output_item"]
    assert outputs == ["Tromso: snow"]
    assert fleet.registry.find("weather") is fleet.served("weather")
    entry = (await Ledger(redis, fleet.keys).read(TENANT, runner.run_id_of(result), ["w1"]))["w1"]
    assert entry.state == "committed" and entry.tool_version == fleet.served("weather").version
