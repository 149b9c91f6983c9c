"""Differential: the OpenAI Agents SDK in-process vs the same agent on the fleet.

For each rule of docs/sdk-lifecycle.md, a scenario
scripts the model once (``agents.testing.ScriptedModel``), then runs the agent twice on the
tools of tests/integration/sdk_tools.py: in-process with ``Runner.run``, and on a real fleet
(planner, aggregator and two worker processes, real Kafka and Redis) with
``toolfleet.agents.FleetRunner``. What the model sees must be equal: the input of every model
call (so every tool output, in order), the interruptions, the run error (type and message) and
the final output. Where toolfleet deliberately differs, the test says so and asserts the
difference. Both runs use the same call ids, unique per scenario (the fleet's ledger is keyed
by them).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest
from agents import (
    Agent,
    FunctionTool,
    FunctionToolResult,
    RunConfig,
    RunHooks,
    Runner,
    ToolExecutionConfig,
    ToolsToFinalOutputResult,
)
from agents.run_config import ToolErrorFormatterArgs
from agents.testing import ScriptedModel, assistant_message
from agents.tracing import set_tracing_disabled
from redis.asyncio import Redis

from kernel.settings import Settings
from schemas import ModelResponseEvent
from tests.integration import sdk_tools as t
from tests.integration.sdk_diff import (
    Decide,
    Script,
    Seen,
    approve_all,
    assert_same,
    drive,
    reject_all,
    runs,
)
from toolfleet.agents import FleetRunner, fleet_turn_id
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client

pytestmark = [pytest.mark.integration, pytest.mark.agent_runtime]

set_tracing_disabled(True)

TOOLS = "tests.integration.sdk_tools:tools"
TENANT = "sdk-diff"
DEFAULT_ERROR = "An error occurred while running the tool. Please try again."
NOT_APPROVED = "Tool execution was not approved."


# --- fixtures --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    os.environ.setdefault("REDIS_URL", settings.redis_address())  # in-process tools count too
    # Several scenarios fail tools on purpose: keep the circuit breaker (a fleet-wide error
    # rate per tool version, shared through Redis) out of this module's way.
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


# --- one scenario, both ways -----------------------------------------------------------------
async def both(
    runner: FleetRunner,
    script: Script,
    tools: Sequence[FunctionTool],
    *,
    run_config: RunConfig | None = None,
    decisions: Sequence[Decide] = (),
    max_turns: int = 10,
    **agent_options: Any,
) -> tuple[Seen, Seen]:
    """Run the scripted agent in-process, then on the fleet; what each run showed the model."""

    def agent(model: ScriptedModel) -> Agent[Any]:
        return Agent(name="assistant", model=model, tools=list(tools), **agent_options)

    sdk_model, fleet_model = script.model(), script.model()
    sdk_agent, fleet_agent = agent(sdk_model), agent(fleet_model)

    async def sdk_start(state: Any) -> Any:
        return await Runner.run(
            sdk_agent, state if state is not None else "go", run_config=run_config,
            max_turns=max_turns,
        )  # fmt: skip

    async def fleet_start(state: Any) -> Any:
        return await runner.run(
            fleet_agent, state if state is not None else "go", run_config=run_config,
            max_turns=max_turns,
        )  # fmt: skip

    sdk = await drive(sdk_start, sdk_model, decisions)
    on_fleet = await drive(fleet_start, fleet_model, decisions)
    return sdk, on_fleet


# --- outputs in model order; concurrency ---------------------------------------------------
async def test_outputs_in_model_order_whatever_the_finish_order(runner: FleetRunner) -> None:
    s = Script()
    s.turn(
        s.call("a", "sdk_echo_after", {"text": "first", "ms": 400}),
        s.call("b", "sdk_echo_after", {"text": "second", "ms": 0}),
        s.call("c", "sdk_echo_after", {"text": "third", "ms": 200}),
    ).answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    assert sdk.outputs() == [(s.id("a"), "first"), (s.id("b"), "second"), (s.id("c"), "third")]
    assert_same(sdk, on_fleet)


@pytest.mark.parametrize("cap", [1, 2])
async def test_concurrency_cap_starts_calls_in_model_order(
    runner: FleetRunner, redis: Redis, cap: int
) -> None:
    s = Script()
    group = f"g-{s.prefix}"
    s.turn(*(s.call(f"c{i}", "sdk_busy", {"group": group, "ms": 300}) for i in range(4)))
    s.answer()
    config = RunConfig(tool_execution=ToolExecutionConfig(max_function_tool_concurrency=cap))
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS, run_config=config)
    assert_same(sdk, on_fleet)
    peaks = [int(await redis.get(t.peak_key(where, group)) or 0) for where in ("sdk", "fleet")]
    assert peaks == [cap, cap]  # reached, never exceeded, on both sides


# --- tool errors ------------------------------------------------------------------------------
async def test_tool_errors_with_the_default_and_a_custom_handler(runner: FleetRunner) -> None:
    s = Script()
    s.turn(
        s.call("a", "sdk_fail", {"message": "database password is hunter2"}),
        s.call("b", "sdk_fail_shown", {"message": "quota exceeded"}),
        s.call("c", "sdk_add", {"a": 2, "b": 3}),
    ).answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    assert sdk.outputs() == [
        (s.id("a"), DEFAULT_ERROR),  # the exception itself is never shown
        (s.id("b"), "sdk tool failed: ValueError: quota exceeded"),
        (s.id("c"), "5"),  # a failed sibling never discards an output
    ]
    assert_same(sdk, on_fleet)


async def test_tool_error_without_a_handler_fails_the_run(
    runner: FleetRunner, redis: Redis
) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_fail_strict", {"message": "boom"})).answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    assert sdk.error == ("UserError", "Error running tool sdk_fail_strict: boom")
    assert_same(sdk, on_fleet)


async def test_unparseable_and_invalid_arguments(runner: FleetRunner) -> None:
    s = Script()
    s.turn(
        s.call("a", "sdk_add", "{not json"),
        s.call("b", "sdk_add", {"a": "two", "b": 3}),
        s.call("c", "sdk_count_shown", {"n": "many"}),
        s.call("d", "sdk_add", {"a": 1, "b": 2, "dry_run": True}),
    ).answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    assert sdk.outputs()[:3] == [
        (s.id("a"), DEFAULT_ERROR),
        (s.id("b"), DEFAULT_ERROR),
        (s.id("c"), "sdk tool failed: ModelBehaviorError: Invalid JSON input for tool "
                    "sdk_count_shown"),
    ]  # fmt: skip
    assert_same(sdk, on_fleet)


@pytest.mark.parametrize("arguments", ["{not json", '{"n": "many"}'])
async def test_bad_arguments_without_a_handler_fail_the_run(
    runner: FleetRunner, arguments: str
) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_count_strict", arguments)).answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    assert sdk.error == ("ModelBehaviorError", "Invalid JSON input for tool sdk_count_strict")
    assert_same(sdk, on_fleet)


# --- timeouts ---------------------------------------------------------------------------------
async def test_timeouts_as_results_default_and_custom_text(runner: FleetRunner) -> None:
    s = Script()
    s.turn(
        s.call("a", "sdk_slow", {"ms": 3000}),
        s.call("b", "sdk_slow_custom", {"ms": 3000}),
        s.call("c", "sdk_slow", {"ms": 0}),
    ).answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    assert sdk.outputs() == [
        (s.id("a"), "Tool 'sdk_slow' timed out after 0.2 seconds."),
        (s.id("b"), "sdk_slow_custom gave up: Tool 'sdk_slow_custom' timed out after 0.2 seconds."),
        (s.id("c"), "in time"),
    ]
    assert_same(sdk, on_fleet)


async def test_timeout_raise_exception_fails_the_run(runner: FleetRunner) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_slow_strict", {"ms": 3000})).answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    assert sdk.error == ("ToolTimeoutError", "Tool 'sdk_slow_strict' timed out after 0.2 seconds.")
    assert_same(sdk, on_fleet)


async def test_a_tools_own_timeout_error_is_an_ordinary_tool_error(runner: FleetRunner) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_own_timeout", {"message": "upstream timed out"})).answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    assert sdk.outputs() == [(s.id("a"), DEFAULT_ERROR)]  # not the SDK's timeout text
    assert_same(sdk, on_fleet)
    strict = Script()
    strict.turn(strict.call("a", "sdk_own_timeout_strict", {"message": "upstream"})).answer()
    sdk, on_fleet = await both(runner, strict, t.SDK_TOOLS)
    assert sdk.error == ("UserError", "Error running tool sdk_own_timeout_strict: upstream")
    assert_same(sdk, on_fleet)


async def test_sync_tools(runner: FleetRunner) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_shout", {"text": "hi"}), s.call("b", "sdk_shout", {"text": "yo"}))
    s.answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    assert sdk.outputs() == [(s.id("a"), "HI"), (s.id("b"), "YO")]
    assert_same(sdk, on_fleet)


# --- guardrails -------------------------------------------------------------------------------
async def test_guardrails_allow_and_reject_content(runner: FleetRunner, redis: Redis) -> None:
    s = Script()
    s.turn(
        s.call("a", "sdk_screened", {"text": "hello"}),
        s.call("b", "sdk_screened", {"text": "my secret"}),
        s.call("c", "sdk_screened", {"text": "classified plans"}),
    ).answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    assert sdk.outputs() == [
        (s.id("a"), "hello"),
        (s.id("b"), "Refusing to handle secrets."),  # input guardrail: never ran
        (s.id("c"), "Output withheld."),  # output guardrail: ran, output replaced
    ]
    assert_same(sdk, on_fleet)
    counts = {n: [await runs(redis, w, s.id(n)) for w in ("sdk", "fleet")] for n in "abc"}
    assert counts == {"a": [1, 1], "b": [0, 0], "c": [1, 1]}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("trip", ("ToolInputGuardrailTripwireTriggered",
                  "Tool input guardrail ToolInputGuardrail triggered tripwire")),
        ("explode", ("ToolOutputGuardrailTripwireTriggered",
                     "Tool output guardrail ToolOutputGuardrail triggered tripwire")),
    ],
    ids=["input", "output"],
)  # fmt: skip
async def test_guardrail_tripwires_fail_the_run(
    runner: FleetRunner, text: str, expected: tuple[str, str]
) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_screened", {"text": text}), s.call("b", "sdk_add", {"a": 1, "b": 1}))
    s.answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    assert sdk.error == expected
    assert_same(sdk, on_fleet)


def _guardrail_results(result: Any) -> tuple[list[Any], list[Any]]:
    """(input, output) tool guardrail results: the guardrail object, verdict, output_info."""

    def seen(results: list[Any]) -> list[Any]:
        return sorted(
            (
                r.guardrail.get_name(),
                id(r.guardrail),
                r.output.behavior["type"],
                repr(r.output.output_info),
            )
            for r in results
        )

    return seen(result.tool_input_guardrail_results), seen(result.tool_output_guardrail_results)


async def test_tool_guardrail_results_are_reported_on_the_result(runner: FleetRunner) -> None:
    # The worker runs the guardrails; the runner reports what they said where the SDK does,
    # naming the application's own guardrail objects. (Across parallel calls the results
    # come in the order the calls settle, so they are compared as sets.)
    s = Script()
    s.turn(
        s.call("a", "sdk_screened", {"text": "hello"}),
        s.call("b", "sdk_screened", {"text": "my secret"}),
        s.call("c", "sdk_screened", {"text": "classified plans"}),
    ).answer()
    sdk_model, fleet_model = s.model(), s.model()
    sdk = await Runner.run(Agent(name="a", model=sdk_model, tools=[t.sdk_screened]), "go")
    on_fleet = await runner.run(Agent(name="a", model=fleet_model, tools=[t.sdk_screened]), "go")
    inputs, outputs = _guardrail_results(on_fleet)
    assert (inputs, outputs) == _guardrail_results(sdk)
    screen_in, screen_out = id(t.screen_input), id(t.screen_output)
    assert inputs == sorted(
        [
            ("screen_input", screen_in, "allow", "{'screened': 'input'}"),
            ("screen_input", screen_in, "allow", "{'screened': 'input'}"),
            ("screen_input", screen_in, "reject_content", "None"),
        ]
    )
    assert outputs == sorted(
        [
            ("screen_output", screen_out, "allow", "{'screened': 'output'}"),
            ("screen_output", screen_out, "reject_content", "None"),
        ]
    )


@pytest.mark.parametrize(
    ("text", "kind"), [("trip", "input"), ("explode", "output")], ids=["input", "output"]
)
async def test_a_tripwire_carries_its_guardrail_and_output_info(
    runner: FleetRunner, text: str, kind: str
) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_screened", {"text": text})).answer()
    raised = []
    for run, model in ((Runner.run, s.model()), (runner.run, s.model())):
        agent = Agent(name="a", model=model, tools=[t.sdk_screened])
        with pytest.raises(Exception) as caught:
            await run(agent, "go")
        raised.append(caught.value)
    sdk, on_fleet = raised
    guardrail = t.screen_input if kind == "input" else t.screen_output
    assert type(on_fleet) is type(sdk)
    assert on_fleet.guardrail is sdk.guardrail is guardrail  # type: ignore[attr-defined]
    assert on_fleet.output.output_info == sdk.output.output_info  # type: ignore[attr-defined]
    assert on_fleet.output.output_info == ("tripped" if kind == "input" else "exploded")  # type: ignore[attr-defined]


async def test_a_tools_returned_object_reaches_the_application_as_in_process(
    runner: FleetRunner,
) -> None:
    # The worker's tool returns an object; the model sees its text, while tool_use_behavior,
    # on_tool_end and the run's items get the object, rebuilt from its JSON (by the tool's
    # output type when it declares one, else by its function's return annotation). A tuple
    # no annotation names, which JSON cannot keep, stays the text the model saw.
    s = Script()
    s.turn(
        s.call("a", "sdk_ticket", {"title": "printer"}),
        s.call("b", "sdk_stock", {"sku": "A-1"}),
        s.call("c", "sdk_pair", {"a": 1}),
        s.call("d", "sdk_forecast", {"city": "Tokyo"}),
        s.call("e", "sdk_loose", {"a": 3}),
    ).answer()
    seen: dict[str, dict[str, list[Any]]] = {"sdk": {}, "fleet": {}}

    class Ends(RunHooks[Any]):
        def __init__(self, side: str) -> None:
            self.side = side

        async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
            seen[self.side].setdefault(tool.name, []).append(result)

    def agent(model: Any, side: str) -> Agent[Any]:
        def behavior(context: Any, results: list[FunctionToolResult]) -> ToolsToFinalOutputResult:
            for r in results:
                seen[side].setdefault(r.tool.name, []).append(r.output)
            return ToolsToFinalOutputResult(is_final_output=True, final_output="done")

        return Agent(name="a", model=model, tools=list(t.OBJECT_TOOLS), tool_use_behavior=behavior)

    sdk = await Runner.run(agent(s.model(), "sdk"), "go", hooks=Ends("sdk"))
    on_fleet = await runner.run(agent(s.model(), "fleet"), "go", hooks=Ends("fleet"))
    ticket = {"ticket": {"title": "printer", "status": "created"}}
    stock = t.Stock(sku="A-1", units=42)
    forecast = t.Forecast(city="Tokyo", sky="sunny")
    # on_tool_end, then tool_use_behavior, each with the returned object.
    assert seen["sdk"] == {
        "sdk_ticket": [ticket] * 2,
        "sdk_stock": [stock] * 2,
        "sdk_pair": [(1, 2)] * 2,
        "sdk_forecast": [forecast] * 2,
        "sdk_loose": [(3, 3)] * 2,
    }
    assert seen["fleet"] == {**seen["sdk"], "sdk_loose": ["(3, 3)"] * 2}
    for name, kind in (("sdk_stock", t.Stock), ("sdk_pair", tuple), ("sdk_forecast", t.Forecast)):
        assert all(type(output) is kind for output in seen["fleet"][name])

    def outputs(result: Any) -> list[Any]:
        items = [i for i in result.new_items if i.type == "tool_call_output_item"]
        return [(i.raw_item["call_id"], i.raw_item["output"], i.output) for i in items]

    # The model was given the same text both ways; the items hold the objects.
    assert [o[:2] for o in outputs(on_fleet)] == [o[:2] for o in outputs(sdk)]
    assert [o[2] for o in outputs(on_fleet)] == [ticket, stock, (1, 2), forecast, "(3, 3)"]


async def test_run_config_tool_error_formatter_words_a_tool_exception(runner: FleetRunner) -> None:
    # The SDK applies it in the runner to a failure its default text handled; so does
    # FleetRunner, with the worker's exception as a FleetToolError (class name and text). A
    # tool with its own failure_error_function is not formatted, as in-process.
    s = Script()
    s.turn(
        s.call("a", "sdk_fail", {"message": "ORD-7 is not an order id"}),
        s.call("b", "sdk_fail_shown", {"message": "shown as is"}),
        s.call("c", "sdk_add", {"a": 1, "b": 1}),
    ).answer()
    asked: dict[str, list[Any]] = {"sdk": [], "fleet": []}

    def formatter(side: str) -> Any:
        def format_error(args: ToolErrorFormatterArgs[Any]) -> str:
            error = args.error
            asked[side].append(
                (args.kind, args.tool_name, args.call_id, args.default_message, str(error))
            )
            return f"Rejected: {error}"

        return format_error

    sdk_config = RunConfig(tool_error_formatter=formatter("sdk"))
    fleet_config = RunConfig(tool_error_formatter=formatter("fleet"))
    sdk_model, fleet_model = s.model(), s.model()
    tools = [t.sdk_fail, t.sdk_fail_shown, t.sdk_add]
    await Runner.run(Agent(name="a", model=sdk_model, tools=tools), "go", run_config=sdk_config)
    on_fleet = await runner.run(
        Agent(name="a", model=fleet_model, tools=tools), "go", run_config=fleet_config
    )
    default = "An error occurred while running the tool. Please try again."
    assert asked["sdk"] == [
        ("tool_exception", "sdk_fail", s.id("a"), default, "ORD-7 is not an order id")
    ]
    assert asked["fleet"] == asked["sdk"]
    outputs = [i.output for i in on_fleet.new_items if i.type == "tool_call_output_item"]
    assert outputs[0] == "Rejected: ORD-7 is not an order id"
    assert fleet_model.calls[-1].input == sdk_model.calls[-1].input


async def test_a_tool_that_cancels_itself_unhandled_cancels_the_run_as_in_process(
    runner: FleetRunner,
) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_cancel_itself", {"reason": "the tool gave up"})).answer()
    raised = []
    for run, model in ((Runner.run, s.model()), (runner.run, s.model())):
        agent = Agent(name="a", model=model, tools=[t.sdk_cancel_itself])
        with pytest.raises(asyncio.CancelledError) as caught:
            await run(agent, "go")
        raised.append(caught.value)
    sdk, on_fleet = raised
    assert type(on_fleet) is type(sdk) is asyncio.CancelledError


async def test_pre_approval_input_guardrails(runner: FleetRunner, redis: Redis) -> None:
    s = Script()
    s.turn(
        s.call("a", "sdk_screened_delete", {"text": "a secret repo"}),
        s.call("b", "sdk_screened_delete", {"text": "old repo"}),
    ).answer()
    config = RunConfig(tool_execution=ToolExecutionConfig(pre_approval_tool_input_guardrails=True))
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS, run_config=config)
    # The rejected call is decided by the guardrail before anyone is asked; the other waits.
    assert [i[1] for i in sdk.interruptions] == [s.id("b")]
    assert [o for _, o in _outputs_of(sdk)] == ["Refusing to handle secrets."]
    assert_same(sdk, on_fleet)
    assert on_fleet.items == sdk.items


def _outputs_of(seen: Seen) -> list[tuple[str, str]]:
    return [
        (i["call_id"], i["output"])
        for i in seen.items
        if isinstance(i, dict) and i.get("type") == "function_call_output"
    ]


# --- approvals ----------------------------------------------------------------------------------
async def test_approval_pending(runner: FleetRunner, redis: Redis) -> None:
    s = Script()
    s.turn(
        s.call("a", "sdk_delete", {"name": "repo"}),
        s.call("b", "sdk_add", {"a": 1, "b": 2}),
        s.call("c", "sdk_pay", {"amount": 500}),
        s.call("d", "sdk_pay", {"amount": 5}),
    ).answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    assert [i[:2] for i in sdk.interruptions] == [
        ("sdk_delete", s.id("a")),
        ("sdk_pay", s.id("c")),
    ]
    assert _outputs_of(sdk) == [(s.id("b"), "3"), (s.id("d"), "paid 5")]
    assert_same(sdk, on_fleet)
    assert on_fleet.items == sdk.items
    for name in ("a", "c"):
        assert [await runs(redis, w, s.id(name)) for w in ("sdk", "fleet")] == [0, 0]


async def test_approved_calls_run_when_resumed(runner: FleetRunner, redis: Redis) -> None:
    s = Script()
    s.turn(
        s.call("a", "sdk_delete", {"name": "repo"}),
        s.call("b", "sdk_add", {"a": 1, "b": 2}),
        s.call("c", "sdk_pay", {"amount": 500}),
    ).answer("deleted and paid")
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS, decisions=[approve_all()])
    assert sdk.final_output == "deleted and paid"
    assert sdk.outputs() == [(s.id("b"), "3"), (s.id("a"), "deleted repo"), (s.id("c"), "paid 500")]
    assert_same(sdk, on_fleet)
    assert on_fleet.items == sdk.items
    for name in ("a", "c"):
        assert [await runs(redis, w, s.id(name)) for w in ("sdk", "fleet")] == [1, 1]


async def test_a_callable_policy_is_asked_as_in_process_after_argument_preparation(
    runner: FleetRunner, redis: Redis
) -> None:
    # sdk_pay's policy (large_amounts) wants a person above 100. The SDK prepares a call's
    # arguments first: "7" is not an int, so preparation would change it, and the SDK asks a
    # person without consulting the policy at all. The runner asks exactly as the SDK does,
    # and tells the fleet the outcome: the worker never evaluates the policy again.
    s = Script()
    s.turn(
        s.call("a", "sdk_pay", {"amount": 5}),
        s.call("b", "sdk_pay", {"amount": "7"}),
        s.call("c", "sdk_pay", {"amount": 500}),
    ).answer("paid")
    asked: list[Seen] = []

    def decide(state: Any, items: Sequence[Any]) -> None:
        asked.append(Seen(interruptions=[(i.tool_name, i.raw_item.call_id, "") for i in items]))
        approve_all()(state, items)

    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS, decisions=[decide])
    in_process, fleet_side = asked
    assert [i[1] for i in in_process.interruptions] == [s.id("b"), s.id("c")]
    assert fleet_side.interruptions == in_process.interruptions
    assert sdk.final_output == "paid"
    assert_same(sdk, on_fleet)
    policy = {
        n: [int(await redis.get(t.policy_key(w, s.id(n))) or 0) for w in ("sdk", "fleet")]
        for n in ("a", "b", "c")
    }
    # "sdk": asked in the test process (both runners); "fleet": asked on a worker. Once per
    # run for a and c, never for b, and never on a worker.
    assert policy == {"a": [2, 0], "b": [0, 0], "c": [2, 0]}
    for name in ("a", "b", "c"):
        assert [await runs(redis, w, s.id(name)) for w in ("sdk", "fleet")] == [1, 1]


@pytest.mark.parametrize("message", [None, "Not on a Friday."])
async def test_rejected_calls_get_the_rejection_text_and_never_run(
    runner: FleetRunner, redis: Redis, message: str | None
) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_delete", {"name": "repo"}), s.call("b", "sdk_add", {"a": 1, "b": 2}))
    s.answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS, decisions=[reject_all(message)])
    assert sdk.outputs() == [(s.id("b"), "3"), (s.id("a"), message or NOT_APPROVED)]
    assert_same(sdk, on_fleet)
    assert [await runs(redis, w, s.id("a")) for w in ("sdk", "fleet")] == [0, 0]


@pytest.mark.parametrize("approve", [True, False], ids=["always_approve", "always_reject"])
async def test_sticky_decisions_apply_to_later_calls_of_the_tool(
    runner: FleetRunner, redis: Redis, approve: bool
) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_delete", {"name": "one"}))
    s.turn(s.call("b", "sdk_delete", {"name": "two"}), s.call("c", "sdk_pay", {"amount": 900}))
    s.answer()
    decide = approve_all(always=True) if approve else reject_all("Never.", always=True)
    # One decision round: the later sdk_delete is decided by the sticky one, sdk_pay is not.
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS, decisions=[decide])
    assert [i[:2] for i in sdk.interruptions] == [("sdk_pay", s.id("c"))]
    assert _outputs_of(sdk) == [
        (s.id("a"), "deleted one" if approve else "Never."),
        (s.id("b"), "deleted two" if approve else "Never."),
    ]
    assert_same(sdk, on_fleet)
    assert on_fleet.items == sdk.items
    expected = [1, 1] if approve else [0, 0]
    assert [await runs(redis, w, s.id("b")) for w in ("sdk", "fleet")] == expected


# --- identity: duplicate and empty call ids -----------------------------------------------------
async def test_identical_duplicate_call_ids_run_once(runner: FleetRunner, redis: Redis) -> None:
    s = Script()
    s.turn(
        s.call("a", "sdk_echo_after", {"text": "once", "ms": 50}),
        s.call("a", "sdk_echo_after", {"text": "once", "ms": 50}),
        s.call("b", "sdk_add", {"a": 1, "b": 2}),
    ).answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    assert sdk.outputs() == [(s.id("a"), "once"), (s.id("b"), "3")]
    assert_same(sdk, on_fleet)
    assert on_fleet.items == sdk.items
    assert [await runs(redis, w, s.id("a")) for w in ("sdk", "fleet")] == [1, 1]


async def test_conflicting_duplicate_call_ids_fail_before_anything_runs(
    runner: FleetRunner, redis: Redis
) -> None:
    s = Script()
    s.turn(
        s.call("a", "sdk_echo_after", {"text": "side effect"}),
        s.call("b", "sdk_echo_after", {"text": "x"}),
        s.call("b", "sdk_echo_after", {"text": "y"}),
    ).answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    assert sdk.error == (
        "ModelBehaviorError",
        "Model reused a tool call ID for a different invocation in one response. "
        "Use a unique call ID for each tool invocation.",
    )
    assert_same(sdk, on_fleet)
    assert [await runs(redis, w, s.id("a")) for w in ("sdk", "fleet")] == [0, 0]


async def test_a_completed_call_id_reused_for_another_invocation(runner: FleetRunner) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_add", {"a": 1, "b": 2}))
    s.turn(s.call("a", "sdk_add", {"a": 5, "b": 5})).answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    assert sdk.error is not None and sdk.error[0] == "ModelBehaviorError"
    assert_same(sdk, on_fleet)


async def test_an_empty_call_id_fails_the_run(runner: FleetRunner) -> None:
    s = Script()
    s.turn(s.call("", "sdk_add", {"a": 1, "b": 2})).answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    assert sdk.error == (
        "ModelBehaviorError",
        "Tool invocations require a non-empty string call ID before execution.",
    )
    assert_same(sdk, on_fleet)


# --- unknown tools --------------------------------------------------------------------------------
async def test_unknown_tool_under_raise_error(runner: FleetRunner) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_add", {"a": 1, "b": 2}), s.call("b", "sdk_nowhere", {})).answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    assert sdk.error == ("ModelBehaviorError", "Tool sdk_nowhere not found in agent assistant")
    assert_same(sdk, on_fleet)


async def test_disabled_tool_is_not_found(runner: FleetRunner) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_disabled", {})).answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    assert sdk.error == ("ModelBehaviorError", "Tool sdk_disabled not found in agent assistant")
    assert_same(sdk, on_fleet)


async def test_unknown_tool_under_return_error_to_model(
    runner: FleetRunner, client: FleetClient
) -> None:
    s = Script()
    s.turn(
        s.call("a", "sdk_nowhere", {}),
        s.call("b", "sdk_add", {"a": 1, "b": 2}),
        s.call("c", "sdk_shout", {"text": "x"}),
    ).answer()
    config = RunConfig(tool_not_found_behavior="return_error_to_model")
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS, run_config=config)
    not_found = (s.id("a"), "Tool 'sdk_nowhere' not found.")
    # The SDK runner lists not-found outputs after the others, on the fleet too.
    assert sdk.outputs() == [(s.id("b"), "3"), (s.id("c"), "X"), not_found]
    assert_same(sdk, on_fleet)
    # The runner decides calls of tools the agent lacks; the planner, given such a call
    # directly, answers it too, in plain model order (lifecycle item 15).
    event = ModelResponseEvent.model_validate(
        {
            "tenant_id": TENANT, "run_id": f"direct-{s.prefix}", "turn_id": 0,
            "agent": {"name": "assistant"}, "response_id": "r",
            "items": [{"type": "function_call", "call_id": f"direct-{s.prefix}-{n}",
                       "name": tool, "arguments": args}
                      for n, tool, args in (("a", "sdk_nowhere", "{}"),
                                            ("b", "sdk_add", '{"a": 1, "b": 2}'))],
            "config": {"tool_not_found": "return_error_to_model"},
        }
    )  # fmt: skip
    result = await client.run_turn(event)
    assert [o.output for o in result.outputs] == ["Tool 'sdk_nowhere' not found.", "3"]


# --- several failures ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        # Severity: a BaseException-class failure beats an ordinary error at a lower index.
        (
            [("a", "sdk_fail_strict", "ordinary", 0), ("b", "sdk_fatal", "fatal", 400)],
            ("Fatal", "fatal"),
        ),
        # Ties (no failure handler: each fails the run): the lowest model index wins.
        (
            [("a", "sdk_fail_strict", "first", 400), ("b", "sdk_fail_strict", "second", 0)],
            ("UserError", "Error running tool sdk_fail_strict: first"),
        ),
    ],
    ids=["severity", "model-order-tie"],
)
async def test_failure_choice_between_simultaneous_failures(
    runner: FleetRunner, calls: list[tuple[str, str, str, int]], expected: tuple[str, str]
) -> None:
    # Both calls fail at once. In-process they complete together and the SDK chooses; on the
    # fleet the chosen one's outcome is made to arrive 0.4 s later (fleet_delay_ms), as load
    # can make it: the choice must not depend on arrival order.
    s = Script()
    s.turn(
        *(s.call(n, tool, {"message": m, "fleet_delay_ms": d}) for n, tool, m, d in calls)
    ).answer()
    try:
        sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
        sdk_error = sdk.error
    except t.Fatal as fatal:  # in-process, a BaseException leaves Runner.run as it is
        sdk_error = (type(fatal).__name__, str(fatal))
        on_fleet = await _fleet_only(runner, s)
    assert sdk_error == expected
    assert on_fleet.error == expected


async def test_failures_apart_in_time_sdk_reports_the_first_fleet_chooses_among_all(
    runner: FleetRunner, redis: Redis
) -> None:
    s = Script()
    s.turn(
        s.call("a", "sdk_fail_strict", {"message": "late", "ms": 600}),
        s.call("b", "sdk_fail_strict", {"message": "early"}),
        s.call("c", "sdk_fail", {"message": "handled"}),
    ).answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS)
    # Deliberate difference. The SDK fails the run with the first failure and cancels the
    # siblings still running, so call a never fails: its failure is not a candidate. The
    # fleet does not cancel running siblings; it waits for them and chooses among all the
    # turn's failures, by severity then model order (lifecycle item 11), whatever their timing.
    assert sdk.error == ("UserError", "Error running tool sdk_fail_strict: early")
    assert on_fleet.error == ("UserError", "Error running tool sdk_fail_strict: late")
    assert [await runs(redis, w, s.id("a")) for w in ("sdk", "fleet")] == [0, 1]
    assert on_fleet.model_inputs == sdk.model_inputs  # no tool output reached the model


async def _fleet_only(runner: FleetRunner, s: Script) -> Seen:
    model = s.model()
    agent = Agent(name="assistant", model=model, tools=list(t.SDK_TOOLS))

    async def start(state: Any) -> Any:
        return await runner.run(agent, "go")

    return await drive(start, model, [])


# --- several turns --------------------------------------------------------------------------------
async def test_a_scripted_multi_turn_agent(runner: FleetRunner) -> None:
    s = Script()
    s.turn(
        assistant_message("Let me look that up.", item_id="m1"),
        s.call("t1a", "sdk_add", {"a": 20, "b": 1}),
        s.call("t1b", "sdk_echo_after", {"text": "Lisbon", "ms": 100}),
    )
    s.turn(s.call("t2a", "sdk_shout", {"text": "twenty-one in lisbon"}))
    s.turn(
        s.call("t3a", "sdk_screened", {"text": "classified"}),
        s.call("t3b", "sdk_fail", {"message": "nope"}),
        s.call("t3c", "sdk_add", {"a": 1, "b": 1}),
    )
    s.answer("It is 21 degrees in Lisbon.")
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS, instructions="Be brief.")
    assert sdk.final_output == "It is 21 degrees in Lisbon."
    assert len(sdk.model_inputs) == 4
    assert_same(sdk, on_fleet)
    assert on_fleet.items == sdk.items


async def test_max_turns(runner: FleetRunner) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_add", {"a": 1, "b": 1}))
    s.turn(s.call("b", "sdk_add", {"a": 2, "b": 2})).answer()
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS, max_turns=2)
    assert sdk.error == ("MaxTurnsExceeded", "Max turns (2) exceeded")
    assert_same(sdk, on_fleet)


async def test_stop_on_first_tool(runner: FleetRunner) -> None:
    s = Script()
    s.turn(s.call("a", "sdk_shout", {"text": "stop"}), s.call("b", "sdk_add", {"a": 1, "b": 1}))
    sdk, on_fleet = await both(runner, s, t.SDK_TOOLS, tool_use_behavior="stop_on_first_tool")
    assert sdk.final_output == "STOP"
    assert_same(sdk, on_fleet)
    assert on_fleet.items == sdk.items
    typed = Script()
    typed.turn(typed.call("a", "sdk_add", {"a": 1, "b": 1}))
    sdk, on_fleet = await both(runner, typed, t.SDK_TOOLS, tool_use_behavior="stop_on_first_tool")
    assert sdk.final_output == "2"  # a text agent's final output is str() of the tool's result
    assert_same(sdk, on_fleet)


async def test_parent_cancellation_cancels_the_run_on_the_fleet(
    runner: FleetRunner, client: FleetClient, redis: Redis
) -> None:
    s = Script()
    s.turn(*(s.call(f"c{i}", "sdk_echo_after", {"text": "x", "ms": 3000}) for i in range(2)))
    s.answer()
    agent = Agent(name="assistant", model=s.model(), tools=list(t.SDK_TOOLS))
    run_id = f"cancel-{s.prefix}"
    run = asyncio.create_task(runner.run(agent, "go", run_id=run_id))

    async def started() -> bool:
        return await runs(redis, "fleet", s.id("c0")) > 0

    deadline = time.monotonic() + 30
    while not await started():
        assert time.monotonic() < deadline, "the call never started"
        await asyncio.sleep(0.02)  # wait-ok: polling interval of a deadline-bounded wait
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    # The runner told the fleet: the turn ends cancelled, without tool output.
    result = await client.result(run_id, fleet_turn_id(s.id("c0")), within=10)
    assert (result.status, result.outputs) == ("cancelled", [])
