"""Differential, multi-agent: Agents SDK applications in-process vs on the fleet.

As tests/integration/test_sdk_differential.py, each scenario scripts the model once and runs
the same application twice — in-process with the SDK's ``Runner`` and on a real fleet (planner,
aggregator, two workers, real Kafka and Redis) with ``toolfleet.agents.FleetRunner`` — and
compares what every model call was given (instructions, tools, input), the interruptions, the
stream events, the hooks and the final output. What these add: handoffs with input filters, a
handoff beside function calls, agents as tools (in parallel, approvals inside), agent and run
guardrails, hooks, ``run_streamed``, sessions, a RunState resumed by another process, and the
tools of an MCP server served by the workers.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    AgentHooks,
    FunctionTool,
    GuardrailFunctionOutput,
    ModelSettings,
    RunConfig,
    RunContextWrapper,
    RunHooks,
    Runner,
    SQLiteSession,
    StopAtTools,
    ToolsToFinalOutputResult,
    function_tool,
    handoff,
    input_guardrail,
    output_guardrail,
)
from agents.extensions import handoff_filters
from agents.items import ToolApprovalItem
from agents.run_config import CallModelData, ModelInputData
from agents.run_state import RunState
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.tracing import set_tracing_disabled
from redis.asyncio import Redis

from kernel.settings import Settings
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger
from tests.integration import sdk_tools as t
from tests.integration.mcp_server import runs_key as mcp_runs_key
from tests.integration.sdk_diff import Script, normalised, runs
from toolfleet.agents import FleetRunner, FleetToolNotServed
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client

pytestmark = [pytest.mark.integration, pytest.mark.agent_runtime]

set_tracing_disabled(True)

TOOLS = "tests.integration.sdk_tools:tools"
TENANT = "sdk-agents"


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    os.environ.setdefault("REDIS_URL", settings.redis_address())  # in-process tools count too
    env = {"TOOLFLEET_CIRCUIT_MIN_CALLS": "1000000", **t.SIDE_ENV}
    with LocalFleet(settings, tools=TOOLS, workers=2, extra_env=env) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


@pytest.fixture
def runner(client: FleetClient) -> FleetRunner:
    return FleetRunner(client, tenant_id=TENANT, turn_timeout=30)


# --- what a run showed the model -------------------------------------------------------------
def views(model: ScriptedModel) -> list[dict[str, Any]]:
    """Per model call: the agent's instructions, the tools it offered, and the input."""
    return [
        {
            "instructions": call.system_instructions,
            "tools": sorted(getattr(tool, "name", type(tool).__name__) for tool in call.tools),
            "handoffs": sorted(h.tool_name for h in call.handoffs),
            "tool_choice": call.model_settings.tool_choice,
            "input": normalised(call.input),
        }
        for call in model.calls
    ]


def outcome(result: Any) -> dict[str, Any]:
    """What a finished run hands back, comparable across both runners."""
    return {
        "final_output": result.final_output,
        "last_agent": result.last_agent.name,
        "items": [
            ("approval", i.raw_item.call_id)
            if isinstance(i, ToolApprovalItem)
            else normalised(i.to_input_item())
            for i in result.new_items
        ],
    }


async def error_of(run: Awaitable[Any]) -> tuple[str, str] | None:
    try:
        await run
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return None


Build = Callable[[ScriptedModel], Agent[Any]]


async def both(
    runner: FleetRunner, script: Script, build: Build, **options: Any
) -> tuple[tuple[Any, list[dict[str, Any]]], tuple[Any, list[dict[str, Any]]]]:
    """Run the application ``build`` makes in-process, then on the fleet: (result, views)."""
    sdk_model, fleet_model = script.model(), script.model()
    sdk = await Runner.run(build(sdk_model), "go", **options)
    on_fleet = await runner.run(build(fleet_model), "go", **options)
    return (sdk, views(sdk_model)), (on_fleet, views(fleet_model))


# --- handoffs ----------------------------------------------------------------------------------
async def test_a_triage_agent_hands_over_to_specialists_with_input_filters(
    runner: FleetRunner, redis: Redis
) -> None:
    s = Script()
    s.turn(
        assistant_message("Routing you.", item_id="m1"),
        s.call("look", "sdk_echo_after", {"text": "order 42", "ms": 0}),
    )
    s.turn(s.call("h1", "transfer_to_billing", {}))
    s.turn(s.call("bill", "sdk_add", {"a": 40, "b": 2}))
    s.turn(s.call("h2", "transfer_to_support", {}))
    s.turn(s.call("shout", "sdk_shout", {"text": "refunded"}))
    s.answer("Refunded 42.")
    handed: Counter[str] = Counter()

    def build(model: ScriptedModel) -> Agent[Any]:
        support = Agent(name="support", instructions="Support.", model=model, tools=[t.sdk_shout])
        billing = Agent(name="billing", instructions="Billing.", model=model, tools=[t.sdk_add])

        def on_handoff(ctx: RunContextWrapper[Any]) -> None:
            handed[f"{id(model)}"] += 1

        billing.handoffs = [
            handoff(support, input_filter=handoff_filters.remove_all_tools, on_handoff=on_handoff)
        ]
        return Agent(
            name="triage",
            instructions="Triage.",
            model=model,
            tools=[t.sdk_echo_after],
            handoffs=[
                handoff(billing, input_filter=handoff_filters.remove_all_tools),
                handoff(support, on_handoff=on_handoff),
            ],
        )

    (sdk, sdk_views), (on_fleet, fleet_views) = await both(runner, s, build)
    assert sdk.final_output == "Refunded 42." and sdk.last_agent.name == "support"
    assert [v["instructions"] for v in sdk_views] == [
        "Triage.", "Triage.", "Billing.", "Billing.", "Support.", "Support."
    ]  # fmt: skip
    assert fleet_views == sdk_views  # every model input, after every filter
    assert outcome(on_fleet) == outcome(sdk)
    assert sorted(handed.values()) == [1, 1]  # once per side: billing -> support
    counts = [await runs(redis, where, s.id("look")) for where in ("sdk", "fleet")]
    assert counts == [1, 1]  # triage's tool ran on the fleet, once


async def test_a_handoff_in_a_response_with_function_calls(runner: FleetRunner) -> None:
    s = Script()
    s.turn(
        s.call("a", "sdk_add", {"a": 1, "b": 2}),
        s.call("h", "transfer_to_billing", {}),
        s.call("b", "sdk_shout", {"text": "also"}),
        s.call("h2", "transfer_to_support", {}),  # a second handoff: the SDK refuses it
    )
    s.turn(s.call("c", "sdk_add", {"a": 3, "b": 4}))
    s.answer("Billed.")

    def build(model: ScriptedModel) -> Agent[Any]:
        billing = Agent(name="billing", instructions="Billing.", model=model, tools=[t.sdk_add])
        support = Agent(name="support", model=model)
        return Agent(
            name="triage",
            model=model,
            tools=[t.sdk_add, t.sdk_shout],
            handoffs=[billing, support],
        )

    (sdk, sdk_views), (on_fleet, fleet_views) = await both(runner, s, build)
    assert sdk.last_agent.name == "billing"
    assert fleet_views == sdk_views
    assert outcome(on_fleet) == outcome(sdk)


# --- agents as tools ----------------------------------------------------------------------------
def _expert_step(prefix: str) -> ModelStep:
    """The nested agent's model: asks to delete what it was given, then reports it."""

    def respond(call: Any) -> Any:
        given = [i for i in call.input if isinstance(i, dict)]
        outputs = [i for i in given if i.get("type") == "function_call_output"]
        if outputs:
            return [assistant_message(f"expert: {outputs[-1]['output']}")]
        text = next(i["content"] for i in given if i.get("role") == "user")
        return [function_call("sdk_delete", {"name": text}, call_id=f"{prefix}-del-{text}")]

    return ModelStep.respond(respond)


async def test_an_agent_used_as_a_tool_twice_in_parallel_with_approvals_inside(
    runner: FleetRunner, redis: Redis
) -> None:
    s = Script()
    s.turn(
        s.call("x", "ask_expert", {"input": "alpha"}),
        s.call("y", "ask_expert", {"input": "beta"}),
    ).answer("Both deleted.")

    def build(model: ScriptedModel) -> Agent[Any]:
        expert_model = ScriptedModel([_expert_step(s.prefix) for _ in range(4)])
        build.expert_models.append(expert_model)  # type: ignore[attr-defined]
        expert = Agent(name="expert", model=expert_model, tools=[t.sdk_delete])
        return Agent(
            name="orchestrator",
            model=model,
            tools=[expert.as_tool(tool_name="ask_expert", tool_description="Ask the expert.")],
        )

    build.expert_models = []  # type: ignore[attr-defined]

    async def drive(start: Callable[[Any], Awaitable[Any]]) -> tuple[Any, list[Any]]:
        result = await start("go")
        asked = [(i.tool_name, i.raw_item.call_id) for i in result.interruptions]
        state = result.to_state()
        for item in result.interruptions:
            state.approve(item)
        return await start(state), asked

    sdk_model, fleet_model = s.model(), s.model()
    sdk_agent, fleet_agent = build(sdk_model), build(fleet_model)
    sdk, sdk_asked = await drive(lambda i: Runner.run(sdk_agent, i))
    on_fleet, fleet_asked = await drive(lambda i: runner.run(fleet_agent, i))
    alpha, beta = f"{s.prefix}-del-alpha", f"{s.prefix}-del-beta"
    # The nested approvals surface as the parent's interruptions, one per parallel call.
    assert sorted(sdk_asked) == [("sdk_delete", alpha), ("sdk_delete", beta)]
    assert sorted(fleet_asked) == sorted(sdk_asked)
    assert sdk.final_output == "Both deleted."
    assert views(fleet_model) == views(sdk_model)
    assert outcome(on_fleet) == outcome(sdk)
    sdk_nested, fleet_nested = build.expert_models  # type: ignore[attr-defined]
    assert sorted(map(str, views(fleet_nested))) == sorted(map(str, views(sdk_nested)))
    counts = {c: [await runs(redis, w, c) for w in ("sdk", "fleet")] for c in (alpha, beta)}
    assert counts == {alpha: [1, 1], beta: [1, 1]}  # each nested call ran once per side


# --- guardrails and hooks -----------------------------------------------------------------------
@input_guardrail
def no_passwords(ctx: RunContextWrapper[Any], agent: Agent[Any], text: Any) -> Any:
    return GuardrailFunctionOutput(output_info=None, tripwire_triggered="password" in str(text))


@output_guardrail
def no_shouting(ctx: RunContextWrapper[Any], agent: Agent[Any], output: Any) -> Any:
    return GuardrailFunctionOutput(output_info=None, tripwire_triggered=str(output).isupper())


@pytest.mark.parametrize(
    ("question", "answer", "expected"),
    [
        ("my password is x", "fine", "InputGuardrailTripwireTriggered"),
        ("hello", "DONE", "OutputGuardrailTripwireTriggered"),
        ("hello", "done", None),
    ],
    ids=["agent-input", "run-output", "passes"],
)
async def test_agent_and_run_guardrails(
    runner: FleetRunner, question: str, answer: str, expected: str | None
) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_add", {"a": 1, "b": 1})).answer(answer)

    def build(model: ScriptedModel) -> Agent[Any]:
        return Agent(
            name="guarded", model=model, tools=[t.sdk_add], input_guardrails=[no_passwords]
        )

    config = RunConfig(output_guardrails=[no_shouting])
    sdk_model, fleet_model = s.model(), s.model()
    sdk_error = await error_of(Runner.run(build(sdk_model), question, run_config=config))
    fleet_error = await error_of(runner.run(build(fleet_model), question, run_config=config))
    assert (sdk_error[0] if sdk_error else None) == expected
    assert fleet_error == sdk_error
    assert views(fleet_model) == views(sdk_model)


class Counting(RunHooks[Any]):
    """Counts every run hook by (hook, agent or tool)."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    async def on_agent_start(self, context: Any, agent: Agent[Any]) -> None:
        self.seen[f"agent_start:{agent.name}"] += 1

    async def on_agent_end(self, context: Any, agent: Agent[Any], output: Any) -> None:
        self.seen[f"agent_end:{agent.name}"] += 1

    async def on_handoff(self, context: Any, from_agent: Any, to_agent: Any) -> None:
        self.seen[f"handoff:{from_agent.name}->{to_agent.name}"] += 1

    async def on_llm_start(self, context: Any, agent: Any, *args: Any) -> None:
        self.seen[f"llm_start:{agent.name}"] += 1

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        self.seen[f"llm_end:{agent.name}"] += 1

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        self.seen[f"tool_start:{tool.name}:{context.tool_call_id}"] += 1

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        self.seen[f"tool_end:{tool.name}:{context.tool_call_id}={result}"] += 1


class AgentCounting(AgentHooks[Any]):
    """Counts the agent hooks of one agent."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    async def on_start(self, context: Any, agent: Agent[Any]) -> None:
        self.seen["start"] += 1

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        self.seen[f"tool_start:{tool.name}"] += 1

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        self.seen[f"tool_end:{tool.name}"] += 1

    async def on_end(self, context: Any, agent: Agent[Any], output: Any) -> None:
        self.seen["end"] += 1


async def test_hooks_run_exactly_once_per_call_and_agent(runner: FleetRunner) -> None:
    s = Script()
    s.turn(
        s.call("a", "sdk_add", {"a": 1, "b": 2}),
        s.call("b", "sdk_echo_after", {"text": "slow", "ms": 200}),
    )
    s.turn(s.call("h", "transfer_to_billing", {}))
    s.turn(s.call("c", "sdk_add", {"a": 3, "b": 4})).answer()
    counted: list[tuple[Counting, AgentCounting]] = []

    def build(model: ScriptedModel) -> Agent[Any]:
        agent_hooks = AgentCounting()
        counted.append((Counting(), agent_hooks))
        billing = Agent(name="billing", model=model, tools=[t.sdk_add], hooks=agent_hooks)
        return Agent(
            name="triage", model=model, tools=[t.sdk_add, t.sdk_echo_after], handoffs=[billing]
        )

    sdk_model, fleet_model = s.model(), s.model()
    sdk_agent, fleet_agent = build(sdk_model), build(fleet_model)
    (sdk_hooks, sdk_agent_hooks), (fleet_hooks, fleet_agent_hooks) = counted
    await Runner.run(sdk_agent, "go", hooks=sdk_hooks)
    await runner.run(fleet_agent, "go", hooks=fleet_hooks)
    assert fleet_hooks.seen == sdk_hooks.seen
    assert fleet_agent_hooks.seen == sdk_agent_hooks.seen
    tool_hooks = {k: n for k, n in sdk_hooks.seen.items() if k.startswith("tool_")}
    assert len(tool_hooks) == 6 and set(tool_hooks.values()) == {1}  # 3 calls, once each
    assert sdk_hooks.seen[f"tool_end:sdk_add:{s.id('c')}=7"] == 1
    assert sdk_hooks.seen["llm_start:triage"] == 2 and sdk_hooks.seen["agent_start:billing"] == 1
    assert sdk_agent_hooks.seen == {
        "start": 1,
        "tool_start:sdk_add": 1,
        "tool_end:sdk_add": 1,
        "end": 1,
    }


# --- the rest of RunConfig and Agent ------------------------------------------------------------
def _finish_with_first(ctx: RunContextWrapper[Any], results: list[Any]) -> ToolsToFinalOutputResult:
    return ToolsToFinalOutputResult(is_final_output=True, final_output=f"{results[0].output}!")


def _last_two(data: CallModelData[Any]) -> ModelInputData:
    return ModelInputData(input=data.model_data.input[-2:], instructions="Filtered.")


@pytest.mark.parametrize(
    ("agent_options", "config"),
    [
        ({"tool_use_behavior": _finish_with_first}, None),
        ({"tool_use_behavior": StopAtTools(stop_at_tool_names=["sdk_shout"])}, None),
        ({"model_settings": ModelSettings(tool_choice="required")}, None),
        ({"model_settings": ModelSettings(tool_choice="required"), "reset_tool_choice": False},
         None),
        ({}, RunConfig(call_model_input_filter=_last_two)),
    ],
    ids=["callable-behavior", "stop-at-tools", "tool-choice-reset", "tool-choice-kept",
         "input-filter"],
)  # fmt: skip
async def test_run_config_and_agent_options(
    runner: FleetRunner, agent_options: dict[str, Any], config: RunConfig | None
) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_add", {"a": 1, "b": 2}))
    s.turn(s.call("b", "sdk_shout", {"text": "stop"}), s.call("c", "sdk_add", {"a": 3, "b": 4}))
    s.answer("done")

    def build(model: ScriptedModel) -> Agent[Any]:
        return Agent(name="opts", model=model, tools=[t.sdk_add, t.sdk_shout], **agent_options)

    (sdk, sdk_views), (on_fleet, fleet_views) = await both(runner, s, build, run_config=config)
    assert fleet_views == sdk_views
    assert outcome(on_fleet) == outcome(sdk)


async def test_tool_error_formatter_and_tool_choice_across_an_interruption(
    runner: FleetRunner,
) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_add", {"a": 1, "b": 2}), s.call("d", "sdk_delete", {"name": "x"}))
    s.answer("done")

    def formatter(args: Any) -> str:
        return f"{args.tool_name} refused ({args.kind})"

    config = RunConfig(tool_error_formatter=formatter)

    def build(model: ScriptedModel) -> Agent[Any]:
        return Agent(
            name="careful",
            model=model,
            tools=[t.sdk_add, t.sdk_delete],
            model_settings=ModelSettings(tool_choice="required"),
        )

    async def drive(start: Callable[[Any], Awaitable[Any]]) -> Any:
        result = await start("go")
        state = result.to_state()
        for item in result.interruptions:
            state.reject(item)
        return await start(state)

    sdk_model, fleet_model = s.model(), s.model()
    sdk_agent, fleet_agent = build(sdk_model), build(fleet_model)
    sdk = await drive(lambda i: Runner.run(sdk_agent, i, run_config=config))
    on_fleet = await drive(lambda i: runner.run(fleet_agent, i, run_config=config))
    assert "sdk_delete refused (approval_rejected)" in str(views(sdk_model)[-1]["input"])
    assert views(fleet_model) == views(sdk_model)  # tool_choice reset after the resumption too
    assert outcome(on_fleet) == outcome(sdk)


async def test_the_fleets_release_gate_is_asked_as_an_sdk_approval(
    runner: FleetRunner, redis: Redis
) -> None:
    s = Script()
    s.turn(s.call("t", "sdk_transfer", {"amount": 5})).answer("Sent.")
    model = s.model()
    agent = Agent(name="payer", model=model, tools=[t.sdk_transfer])
    # Deliberate difference: in-process nothing asks (the SDK tool declares no approval); the
    # fleet serves it as non_idempotent without a probe, so every call waits for a human,
    # and the runner asks that question the SDK's way.
    result = await runner.run(agent, "go")
    assert [i.raw_item.call_id for i in result.interruptions] == [s.id("t")]
    assert await runs(redis, "fleet", s.id("t")) == 0
    state = result.to_state()
    state.approve(result.interruptions[0])
    result = await runner.run(agent, state)
    assert result.final_output == "Sent."
    assert await runs(redis, "fleet", s.id("t")) == 1


# --- streaming, sync, sessions ------------------------------------------------------------------
def _event(event: Any) -> Any:
    if event.type == "run_item_stream_event":
        item = normalised(event.item.to_input_item())
        return ("item", event.name, item)
    if event.type == "agent_updated_stream_event":
        return ("agent", event.new_agent.name)
    return ("raw", event.data.type)


async def test_run_streamed_yields_the_sdks_events_in_the_sdks_order(runner: FleetRunner) -> None:
    s = Script()
    s.turn(
        assistant_message("Working.", item_id="m1"),
        s.call("a", "sdk_echo_after", {"text": "late", "ms": 300}),
        s.call("b", "sdk_echo_after", {"text": "early", "ms": 0}),
    )
    s.turn(s.call("h", "transfer_to_billing", {}))
    s.answer("Streamed.")

    def build(model: ScriptedModel) -> Agent[Any]:
        billing = Agent(name="billing", model=model)
        return Agent(name="triage", model=model, tools=[t.sdk_echo_after], handoffs=[billing])

    sdk_model, fleet_model = s.model(), s.model()
    sdk = Runner.run_streamed(build(sdk_model), "go")
    sdk_events = [_event(e) async for e in sdk.stream_events()]
    on_fleet = runner.run_streamed(build(fleet_model), "go")
    fleet_events = [_event(e) async for e in on_fleet.stream_events()]
    assert ("item", "tool_output", normalised(
        {"call_id": s.id("b"), "output": "early", "type": "function_call_output"}
    )) in sdk_events  # fmt: skip
    assert fleet_events == sdk_events
    assert on_fleet.final_output == sdk.final_output == "Streamed."
    assert views(fleet_model) == views(sdk_model)


async def test_run_streamed_takes_the_sdks_positional_arguments(runner: FleetRunner) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_add", {"a": 1, "b": 2})).answer("Three.")
    context = {"user": "ana"}

    def build(model: ScriptedModel) -> Agent[Any]:
        return Agent(name="adder", model=model, tools=[t.sdk_add])

    sdk_model, fleet_model = s.model(), s.model()
    config = RunConfig(workflow_name="positional")
    # Runner.run_streamed(agent, input, context, max_turns, hooks, run_config, ...)
    sdk = Runner.run_streamed(build(sdk_model), "go", context, 3, None, config)
    [e async for e in sdk.stream_events()]
    on_fleet = runner.run_streamed(build(fleet_model), "go", context, 3, None, config)
    [e async for e in on_fleet.stream_events()]
    assert on_fleet.final_output == sdk.final_output == "Three."
    assert on_fleet.context_wrapper.context is context
    assert on_fleet.max_turns == sdk.max_turns == 3
    assert views(fleet_model) == views(sdk_model)


async def test_a_session_continues_across_two_runs(runner: FleetRunner, tmp_path: Path) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_add", {"a": 2, "b": 2})).answer("Four.")
    s.turn(s.call("b", "sdk_shout", {"text": "again"})).answer("AGAIN.")

    def build(model: ScriptedModel) -> Agent[Any]:
        return Agent(name="memory", model=model, tools=[t.sdk_add, t.sdk_shout])

    sdk_model, fleet_model = s.model(), s.model()
    sdk_session = SQLiteSession("sdk", tmp_path / "sdk.db")
    fleet_session = SQLiteSession("fleet", tmp_path / "fleet.db")
    for question in ("what is 2+2?", "say it again"):
        await Runner.run(build(sdk_model), question, session=sdk_session)
        await runner.run(build(fleet_model), question, session=fleet_session)
    assert views(fleet_model) == views(sdk_model)
    assert len(views(sdk_model)[-1]["input"]) > 4  # the second run saw the first one
    assert await fleet_session.get_items() == await sdk_session.get_items()


def test_run_sync(runner: FleetRunner) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_add", {"a": 5, "b": 6})).answer("Eleven.")
    model = s.model()
    agent = Agent(name="sync", model=model, tools=[t.sdk_add])
    # A synchronous caller: no event loop of its own; run_sync brings a client of its own.
    result = runner.run_sync(agent, "go")
    assert result.final_output == "Eleven."
    outputs = [i for i in views(model)[-1]["input"] if i.get("type") == "function_call_output"]
    assert [o["output"] for o in outputs] == ["11"]


# --- a RunState across a process restart --------------------------------------------------------
RESTART_SCRIPT = """
import asyncio, json, os, sys
from agents import Agent
from agents.testing import ScriptedModel, function_call
from agents.tracing import set_tracing_disabled
from kernel.settings import Settings
from tests.integration import sdk_tools as t
from toolfleet.agents import FleetRunner
from toolfleet.client import FleetClient

set_tracing_disabled(True)
prefix, out = sys.argv[1], sys.argv[2]

async def main():
    model = ScriptedModel([[
        function_call("sdk_add", {"a": 1, "b": 2}, call_id=prefix + "-a"),
        function_call("sdk_delete", {"name": "old repo"}, call_id=prefix + "-d"),
    ]])
    agent = Agent(name="assistant", model=model, tools=[t.sdk_add, t.sdk_delete])
    async with FleetClient(Settings()) as client:
        runner = FleetRunner(client, tenant_id=sys.argv[3], turn_timeout=30)
        result = await runner.run(agent, "go")
        assert [i.raw_item.call_id for i in result.interruptions] == [prefix + "-d"]
        with open(out, "w") as f:
            saved = {"state": result.to_state().to_string(), "run_id": runner.run_id_of(result)}
            json.dump(saved, f)

asyncio.run(main())
"""


async def test_an_interruption_resumed_by_another_process(
    runner: FleetRunner, redis: Redis, fleet: LocalFleet, tmp_path: Path
) -> None:
    s = Script()
    s.turn(
        s.call("a", "sdk_add", {"a": 1, "b": 2}), s.call("d", "sdk_delete", {"name": "old repo"})
    )
    s.answer("Deleted.")
    rest = ScriptedModel(s.turns[1:])

    def agent(model: ScriptedModel) -> Agent[Any]:
        return Agent(name="assistant", model=model, tools=[t.sdk_add, t.sdk_delete])

    # In-process: interrupted, serialised to JSON, restored, approved, resumed.
    sdk_first = await Runner.run(agent(s.model()), "go")
    sdk_rest = ScriptedModel(s.turns[1:])
    sdk_state = await RunState.from_string(agent(sdk_rest), sdk_first.to_state().to_string())
    sdk_state.approve(sdk_state.get_interruptions()[0])
    sdk = await Runner.run(agent(sdk_rest), sdk_state)

    # On the fleet: another process runs until the interruption, saves the state and exits.
    out = tmp_path / "state.json"
    env = fleet.env()  # the same Kafka, Redis and topics as this fleet
    done = await asyncio.create_subprocess_exec(
        sys.executable, "-c", RESTART_SCRIPT, s.prefix, str(out), TENANT, env=env
    )
    assert await asyncio.wait_for(done.wait(), 120) == 0
    saved = json.loads(out.read_text())
    # Restored as the SDK documents it, with the application's own agent; the fleet run's
    # identity travels inside the state.
    state = await RunState.from_string(agent(rest), saved["state"])
    state.approve(state.get_interruptions()[0])
    on_fleet = await runner.run(agent(rest), state)

    assert runner.run_id_of(on_fleet) == saved["run_id"]
    assert on_fleet.final_output == sdk.final_output == "Deleted."
    assert views(rest) == views(sdk_rest)  # the resumed model call saw the same conversation
    counts = {n: [await runs(redis, w, s.id(n)) for w in ("sdk", "fleet")] for n in ("d",)}
    assert counts == {"d": [1, 1]}  # approved once, ran once


# --- the application's own agents: tools added during a run, a RunState in another process --------
class AddsATool(RunHooks[Any]):
    """Gives the running agent a tool it did not have once its first call has ended (the SDK's
    own tests do this: a hook that appends to ``agent.tools``)."""

    def __init__(self, tool: FunctionTool) -> None:
        self.tool = tool

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        if self.tool not in agent.tools:
            agent.tools.append(self.tool)


async def test_a_tool_added_by_a_hook_during_a_run_runs_on_a_worker_once(
    runner: FleetRunner, redis: Redis, keys: Keys
) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_add", {"a": 1, "b": 2}))
    s.turn(s.call("late", "sdk_echo_after", {"text": "added", "ms": 0})).answer("Done.")

    def build(model: ScriptedModel) -> Agent[Any]:
        return Agent(name="growing", model=model, tools=[t.sdk_add])

    sdk_model, fleet_model = s.model(), s.model()
    sdk = await Runner.run(build(sdk_model), "go", hooks=AddsATool(t.sdk_echo_after))
    agent = build(fleet_model)
    on_fleet = await runner.run(agent, "go", hooks=AddsATool(t.sdk_echo_after))
    assert sdk.final_output == on_fleet.final_output == "Done."
    assert views(fleet_model) == views(sdk_model)
    # The hook changed the application's own agent, and that agent is the one that ran.
    assert agent.tools == [t.sdk_add, t.sdk_echo_after] and on_fleet.last_agent is agent
    late = s.id("late")
    # Once in-process (the SDK's run), once on a worker: never in this process by FleetRunner.
    assert [await runs(redis, w, late) for w in ("sdk", "fleet")] == [1, 1]
    entry = (await Ledger(redis, keys).read(TENANT, runner.run_id_of(on_fleet), [late]))[late]
    assert (entry.tool_name, entry.attempts) == ("sdk_echo_after", 1)
    assert entry.state in ("finished", "committed")
    assert entry.outcome is not None and entry.outcome.output == "added"


async def test_a_tool_the_fleet_does_not_serve_is_refused_and_never_runs_here(
    runner: FleetRunner,
) -> None:
    ran: list[str] = []

    async def local_only(text: str) -> str:
        ran.append(text)
        return text

    name = f"unserved_{uuid.uuid4().hex[:8]}"  # no worker serves it
    unserved = function_tool(local_only, name_override=name)
    s = Script()
    s.turn(s.call("a", "sdk_add", {"a": 1, "b": 2}))
    s.turn(s.call("x", name, {"text": "here?"})).answer("Done.")
    agent = Agent(name="growing", model=s.model(), tools=[t.sdk_add])
    with pytest.raises(FleetToolNotServed, match=f"tool {name} is not served by the fleet"):
        await runner.run(agent, "go", hooks=AddsATool(unserved))
    assert ran == []


async def test_changes_to_an_agent_between_runs_apply(runner: FleetRunner) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_add", {"a": 1, "b": 2})).answer("Three.")
    s.turn(s.call("b", "sdk_shout", {"text": "again"})).answer("AGAIN.")
    model = s.model()
    agent = Agent(name="edited", instructions="First.", model=model, tools=[t.sdk_add])
    assert (await runner.run(agent, "go")).final_output == "Three."
    agent.instructions, agent.tools = "Second.", [t.sdk_shout]
    second = await runner.run(agent, "again")
    assert second.final_output == "AGAIN."
    seen = views(model)
    assert [(v["instructions"], v["tools"]) for v in (seen[0], seen[2])] == [
        ("First.", ["sdk_add"]),
        ("Second.", ["sdk_shout"]),
    ]
    [turn] = runner.turn_results(second)  # the new tool's call ran on the fleet
    assert [(c.call_id, c.tool_name, c.status) for c in turn.calls] == [
        (s.id("b"), "sdk_shout", "succeeded")
    ]


RESUME_SCRIPT = """
import asyncio, json, sys
from agents import Agent
from agents.run_state import RunState
from agents.testing import ScriptedModel, assistant_message
from agents.tracing import set_tracing_disabled
from kernel.settings import Settings
from tests.integration import sdk_tools as t
from toolfleet.agents import FleetRunner
from toolfleet.client import FleetClient

set_tracing_disabled(True)
saved, out, tenant = sys.argv[1], sys.argv[2], sys.argv[3]

async def main():
    model = ScriptedModel([[assistant_message("Deleted.")]])
    agent = Agent(name="assistant", model=model, tools=[t.sdk_delete, t.sdk_echo_after])
    with open(saved) as f:
        state = await RunState.from_json(agent, json.load(f))
    for item in state.get_interruptions():
        state.approve(item)
    async with FleetClient(Settings()) as client:
        runner = FleetRunner(client, tenant_id=tenant, turn_timeout=30)
        result = await runner.run(agent, state)
        turns = [[(c.call_id, c.status) for c in r.calls] for r in runner.turn_results(result)]
    with open(out, "w") as f:
        json.dump({"final": result.final_output, "run_id": runner.run_id_of(result),
                   "turns": turns}, f)

asyncio.run(main())
"""


async def test_a_run_state_restored_with_from_json_in_another_process_keeps_its_identity(
    runner: FleetRunner, redis: Redis, keys: Keys, fleet: LocalFleet, tmp_path: Path
) -> None:
    s = Script()
    s.turn(
        s.call("a", "sdk_echo_after", {"text": "first", "ms": 0}),
        s.call("d", "sdk_delete", {"name": "old repo"}),
    )
    agent = Agent(name="assistant", model=s.model(), tools=[t.sdk_delete, t.sdk_echo_after])
    first = await runner.run(agent, "go")
    assert [i.raw_item.call_id for i in first.interruptions] == [s.id("d")]
    run_id = runner.run_id_of(first)
    saved = tmp_path / "state.json"
    saved.write_text(json.dumps(first.to_state().to_json()))
    out = tmp_path / "resumed.json"
    done = await asyncio.create_subprocess_exec(
        sys.executable, "-c", RESUME_SCRIPT, str(saved), str(out), TENANT, env=fleet.env()
    )
    assert await asyncio.wait_for(done.wait(), 120) == 0
    resumed = json.loads(out.read_text())
    assert resumed["final"] == "Deleted."
    assert resumed["run_id"] == run_id  # the other process resumed the same fleet run
    assert resumed["turns"] == [[[s.id("d"), "succeeded"]]]  # only the approved call was sent
    entries = await Ledger(redis, keys).read(TENANT, run_id, [s.id("a"), s.id("d")])
    assert {c: (e.run_id, e.attempts) for c, e in entries.items()} == {
        s.id("a"): (run_id, 1),
        s.id("d"): (run_id, 1),
    }
    assert [await runs(redis, "fleet", s.id(n)) for n in ("a", "d")] == [1, 1]


class EndsWatching(RunHooks[Any]):
    """Records the order calls end in, and, when the fast one ends, where the slow one is."""

    def __init__(self, slow: str, where: Callable[[], Awaitable[str]] | None) -> None:
        self.slow, self.where = slow, where
        self.ended: list[str] = []
        self.slow_was: str | None = None

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        self.ended.append(context.tool_call_id)
        if context.tool_call_id != self.slow and self.where is not None:
            self.slow_was = await self.where()


async def test_each_call_is_answered_when_it_settles_not_with_its_slowest_sibling(
    runner: FleetRunner, redis: Redis, keys: Keys
) -> None:
    s = Script()
    s.turn(
        s.call("slow", "sdk_echo_after", {"text": "slow", "ms": 3000}),
        s.call("fast", "sdk_echo_after", {"text": "fast", "ms": 0}),
    ).answer("Both.")
    slow = s.id("slow")

    def build(model: ScriptedModel) -> Agent[Any]:
        return Agent(name="pair", model=model, tools=[t.sdk_echo_after])

    run_id = f"settle-{s.prefix}"
    ledger = Ledger(redis, keys)

    async def slow_state() -> str:
        return (await ledger.read(TENANT, run_id, [slow]))[slow].state

    sdk_hooks, fleet_hooks = EndsWatching(slow, None), EndsWatching(slow, slow_state)
    sdk_model, fleet_model = s.model(), s.model()
    sdk = await Runner.run(build(sdk_model), "go", hooks=sdk_hooks)
    on_fleet = await runner.run(build(fleet_model), "go", hooks=fleet_hooks, run_id=run_id)
    assert sdk_hooks.ended == fleet_hooks.ended == [s.id("fast"), slow]  # the SDK's order
    # The fast call's on_tool_end ran while the slow call had not finished on its worker.
    assert fleet_hooks.slow_was in ("dispatched", "started")
    assert on_fleet.final_output == sdk.final_output == "Both."
    assert views(fleet_model) == views(sdk_model)
    # On the fleet the two calls are still one turn, with one TurnResult, in model order.
    [turn] = runner.turn_results(on_fleet)
    assert [(c.call_id, c.status) for c in turn.calls] == [
        (slow, "succeeded"),
        (s.id("fast"), "succeeded"),
    ]


# --- MCP -----------------------------------------------------------------------------------------
async def test_the_tools_of_an_mcp_server_run_on_the_workers(
    runner: FleetRunner, redis: Redis
) -> None:
    s = Script()
    city = f"lisbon-{s.prefix}"
    s.turn(
        s.call("w", "mcp_weather", {"city": city}),
        s.call("b", "mcp_book", {"city": city}),
    ).answer("Booked.")
    sdk_server, runner_server = t.mcp_server("sdk"), t.mcp_server("runner")
    async with sdk_server, runner_server:

        def build(server: Any) -> Callable[[ScriptedModel], Agent[Any]]:
            return lambda model: Agent(name="travel", model=model, mcp_servers=[server])

        sdk_model, fleet_model = s.model(), s.model()
        sdk = await Runner.run(build(sdk_server)(sdk_model), "go")
        on_fleet = await runner.run(build(runner_server)(fleet_model), "go")
    assert sdk.final_output == "Booked."
    # The model gets an MCP tool's text content as content items both ways: the worker sends
    # the content's JSON beside its text, and the runner gives the SDK the content objects.
    assert views(fleet_model) == views(sdk_model)
    assert outcome(on_fleet)["final_output"] == outcome(sdk)["final_output"]

    def outputs(result: Any) -> list[Any]:
        return [i.output for i in result.new_items if i.type == "tool_call_output_item"]

    # What the application gets of an MCP tool's output: the SDK's mappings, both ways.
    assert outputs(on_fleet) == outputs(sdk)
    booked = {side: int(await redis.get(mcp_runs_key(side, city)) or 0) for side in
              ("sdk", "runner", "fleet")}  # fmt: skip
    # In-process the test's server ran it; on the fleet a worker's, never the runner's.
    assert booked == {"sdk": 1, "runner": 0, "fleet": 1}
