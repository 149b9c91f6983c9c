"""Agents SDK function tools served by toolfleet: one call, compared with the SDK in-process.

Each case defines an ``agents.FunctionTool`` once and runs one call of it twice: with the SDK
(``Runner.run`` driven by ``agents.testing.ScriptedModel``) and with toolfleet's runner on the
adapted tool, assembled into a TurnResult by the aggregator's pure turn assembly. The model-
visible output, the interruption and the run error must be the same.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from agents import Agent, FunctionTool, RunContextWrapper, Runner, function_tool, tool_namespace
from agents.exceptions import ToolTimeoutError as SdkToolTimeoutError
from agents.items import ToolCallOutputItem
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext as SdkToolContext
from agents.tool_guardrails import (
    ToolGuardrailFunctionOutput,
    ToolInputGuardrailData,
    ToolOutputGuardrailData,
    tool_input_guardrail,
    tool_output_guardrail,
)
from agents.tracing import set_tracing_disabled

from aggregator import TurnState, accept_outcome, build_result
from executors import ProbeResult, Tool, ToolContext, ToolRegistry, run_call
from kernel.errors import ConfigurationError
from kernel.tools import FunctionToolAdapter, is_function_tool
from schemas import ExecutionCommand, PlannedCall, TurnPlan

set_tracing_disabled(True)

DEFAULT_ERROR = "An error occurred while running the tool. Please try again."


# --- the tools, defined once ---------------------------------------------------------------
class Fatal(BaseException):
    """Not an Exception: fails the run in-process and on the fleet."""


@function_tool
async def add(a: int, b: int) -> int:
    """Adds two numbers."""
    return a + b


@function_tool
def sync_echo(text: str) -> str:
    """A sync tool: the SDK runs it in a thread."""
    return text.upper()


@function_tool
async def boom(message: str) -> str:
    raise ValueError(message)


def show_error(ctx: RunContextWrapper[Any], error: Exception) -> str:
    return f"failed: {error}"


@function_tool(failure_error_function=show_error)
async def boom_shown(message: str) -> str:
    raise ValueError(message)


@function_tool(failure_error_function=None)
async def boom_strict(message: str) -> str:
    raise ValueError(message)


@function_tool(failure_error_function=None)
async def typed_strict(n: int) -> int:
    return n


@function_tool(failure_error_function=show_error)
async def typed_shown(n: int) -> int:
    return n


@function_tool(timeout=0.05)
async def slow() -> str:
    await asyncio.sleep(5)  # wait-ok: the tool outlives its timeout on purpose
    return "never"


def late(ctx: RunContextWrapper[Any], error: Exception) -> str:
    assert isinstance(error, SdkToolTimeoutError)
    return f"late after {error.timeout_seconds:g}s"


@function_tool(timeout=0.05, timeout_error_function=late)
async def slow_custom() -> str:
    await asyncio.sleep(5)  # wait-ok: the tool outlives its timeout on purpose
    return "never"


@function_tool(timeout=0.05, timeout_behavior="raise_exception")
async def slow_strict() -> str:
    await asyncio.sleep(5)  # wait-ok: the tool outlives its timeout on purpose
    return "never"


@function_tool(timeout=5)
async def own_timeout() -> str:
    raise TimeoutError("upstream timed out")


@function_tool(timeout=5, failure_error_function=None)
async def own_timeout_strict() -> str:
    raise TimeoutError("upstream timed out")


@tool_input_guardrail
def no_secrets(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
    if "secret" in data.context.tool_arguments:
        return ToolGuardrailFunctionOutput.reject_content("no secrets, please")
    if "trip" in data.context.tool_arguments:
        return ToolGuardrailFunctionOutput.raise_exception()
    return ToolGuardrailFunctionOutput.allow()


@tool_output_guardrail
def no_leaks(data: ToolOutputGuardrailData) -> ToolGuardrailFunctionOutput:
    if "leak" in str(data.output):
        return ToolGuardrailFunctionOutput.reject_content("output withheld")
    if "trip" in str(data.output):
        return ToolGuardrailFunctionOutput.raise_exception()
    return ToolGuardrailFunctionOutput.allow()


@function_tool(tool_input_guardrails=[no_secrets], tool_output_guardrails=[no_leaks])
async def guarded(text: str) -> str:
    return text


async def big_amounts(ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
    return int(params.get("amount", 0)) > 100


@function_tool(needs_approval=True)
async def delete_repo(name: str) -> str:
    return f"deleted {name}"


@function_tool(needs_approval=big_amounts)
async def pay(amount: int) -> str:
    return f"paid {amount}"


async def _hand_built(ctx: SdkToolContext[Any], arguments: str) -> str:
    raise RuntimeError("hand-built failure")


hand_built = FunctionTool(
    name="hand_built",
    description="A FunctionTool built without @function_tool.",
    params_json_schema={"type": "object", "properties": {}, "additionalProperties": False},
    on_invoke_tool=_hand_built,
)


@function_tool
async def fatal() -> str:
    raise Fatal("fatal")


TOOLS = [
    add, sync_echo, boom, boom_shown, boom_strict, typed_strict, typed_shown, slow, slow_custom,
    slow_strict, own_timeout, own_timeout_strict, guarded, delete_repo, pay, hand_built,
]  # fmt: skip
REGISTRY = ToolRegistry.from_function_tools(TOOLS)


# --- running one call both ways ------------------------------------------------------------
Seen = tuple[str, str, str]
"""("output", text, "") | ("pending", tool, arguments) | ("error", type, message)."""


async def in_process(tool: FunctionTool, arguments: str) -> Seen:
    """What the SDK shows the model for one call, or the run error / the interruption."""
    model = ScriptedModel(
        [[function_call(tool.name, arguments, call_id="c1")], [assistant_message("done")]]
    )
    agent = Agent(name="a", model=model, tools=[tool])
    try:
        result = await Runner.run(agent, "go")
    except Exception as exc:
        return ("error", type(exc).__name__, str(exc))
    if result.interruptions:
        item = result.interruptions[0]
        return ("pending", item.tool_name or "", item.arguments or "")
    outputs = [i for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    return ("output", outputs[0].raw_item["output"], "")  # type: ignore[index]


def command(tool: Tool, arguments: str, **overrides: Any) -> ExecutionCommand:
    fields: dict[str, Any] = {
        "tenant_id": "t1", "run_id": "r1", "turn_id": 0, "call_id": "c1",
        "tool_name": tool.lookup_key, "arguments": arguments, "index": 0, "pool": "default",
        "attempt": 1, "fencing_token": 1, "idempotency_key": "idem-1", "fingerprint": "fp",
        "issued_at": time.time(),
    }  # fmt: skip
    return ExecutionCommand(**(fields | overrides))


async def on_fleet(tool: Tool, arguments: str) -> Seen:
    """The same call through toolfleet's runner and the aggregator's turn assembly."""
    outcome = await run_call(tool, command(tool, arguments), worker_id="w1")
    planned = PlannedCall(
        call_id="c1", tool_name=tool.lookup_key, index=0, arguments=arguments,
        disposition="dispatch", on_unknown=tool.on_unknown,
    )  # fmt: skip
    plan = TurnPlan(
        tenant_id="t1", run_id="r1", turn_id=0, response_id="resp", agent_name="a",
        calls=[planned], planned_at=time.time(),
    )  # fmt: skip
    state = TurnState(plan=plan)
    accept_outcome(state, outcome)
    result = build_result(state)
    if result.error is not None:
        return ("error", result.error.type, result.error.message)
    if result.interruptions:
        return ("pending", result.interruptions[0].tool_name, result.interruptions[0].arguments)
    return ("output", result.outputs[0].output, "")


def args(**values: Any) -> str:
    return json.dumps(values)


CASES = [  # (id, tool, arguments, what the SDK shows: spelled out, so a change is noticed)
    ("int_output_is_stringified", add, args(a=2, b=3), ("output", "5", "")),
    ("sync_tool_runs_in_a_thread", sync_echo, args(text="hi"), ("output", "HI", "")),
    ("tool_error_default_text", boom, args(message="secret"), ("output", DEFAULT_ERROR, "")),
    ("tool_error_custom_handler", boom_shown, args(message="x"), ("output", "failed: x", "")),
    ("tool_error_no_handler_fails_the_run", boom_strict, args(message="x"),
     ("error", "UserError", "Error running tool boom_strict: x")),
    ("invalid_json_default_text", add, "{oops", ("output", DEFAULT_ERROR, "")),
    ("invalid_json_no_handler", typed_strict, "{oops",
     ("error", "ModelBehaviorError", "Invalid JSON input for tool typed_strict")),
    ("invalid_arguments_default_text", add, args(a="x", b=1), ("output", DEFAULT_ERROR, "")),
    ("invalid_arguments_custom_handler", typed_shown, args(n="x"),
     ("output", "failed: Invalid JSON input for tool typed_shown", "")),
    ("invalid_arguments_no_handler", typed_strict, args(n="x"),
     ("error", "ModelBehaviorError", "Invalid JSON input for tool typed_strict")),
    ("timeout_default_text", slow, "{}",
     ("output", "Tool 'slow' timed out after 0.05 seconds.", "")),
    ("timeout_custom_text", slow_custom, "{}", ("output", "late after 0.05s", "")),
    ("timeout_raise_exception", slow_strict, "{}",
     ("error", "ToolTimeoutError", "Tool 'slow_strict' timed out after 0.05 seconds.")),
    ("own_timeout_error_is_a_tool_error", own_timeout, "{}", ("output", DEFAULT_ERROR, "")),
    ("own_timeout_error_no_handler", own_timeout_strict, "{}",
     ("error", "UserError", "Error running tool own_timeout_strict: upstream timed out")),
    ("input_guardrail_allow", guarded, args(text="ok"), ("output", "ok", "")),
    ("input_guardrail_reject_content", guarded, args(text="secret"),
     ("output", "no secrets, please", "")),
    ("input_guardrail_raise_exception", guarded, args(text="trip"),
     ("error", "ToolInputGuardrailTripwireTriggered",
      "Tool input guardrail ToolInputGuardrail triggered tripwire")),
    ("output_guardrail_reject_content", guarded, args(text="leak"),
     ("output", "output withheld", "")),
    ("needs_approval_true", delete_repo, args(name="r"),
     ("pending", "delete_repo", args(name="r"))),
    ("approval_policy_says_yes", pay, args(amount=500), ("pending", "pay", args(amount=500))),
    ("approval_policy_says_no", pay, args(amount=5), ("output", "paid 5", "")),
    ("approval_policy_transformed_arguments_fail_closed", pay, args(amount="5"),
     ("pending", "pay", args(amount="5"))),
    ("approval_policy_unparseable_arguments_fail_closed", pay, "{oops",
     ("pending", "pay", "{oops")),
    ("hand_built_tool_errors_fail_the_run", hand_built, "{}",
     ("error", "UserError", "Error running tool hand_built: hand-built failure")),
]  # fmt: skip


@pytest.mark.parametrize("case", [pytest.param(c, id=c[0]) for c in CASES])
async def test_one_call_shows_the_model_what_the_sdk_shows(case: tuple[Any, ...]) -> None:
    _, tool, arguments, expected = case
    sdk = await in_process(tool, arguments)
    assert sdk == expected  # the SDK's behaviour, pinned
    assert await on_fleet(REGISTRY.get(tool.name), arguments) == sdk


async def test_output_guardrail_tripwire_on_the_body_output() -> None:
    @tool_output_guardrail
    def trip_always(data: ToolOutputGuardrailData) -> ToolGuardrailFunctionOutput:
        return ToolGuardrailFunctionOutput.raise_exception()

    @function_tool(tool_output_guardrails=[trip_always])
    async def shout(text: str) -> str:
        return text

    sdk = await in_process(shout, args(text="x"))
    assert sdk == (
        "error",
        "ToolOutputGuardrailTripwireTriggered",
        "Tool output guardrail ToolOutputGuardrail triggered tripwire",
    )
    assert await on_fleet(ToolRegistry().add_function_tool(shout), args(text="x")) == sdk


async def test_a_base_exception_fails_the_turn_with_its_class() -> None:
    outcome = await on_fleet(ToolRegistry().add_function_tool(fatal), "{}")
    assert outcome == ("error", "Fatal", "fatal")
    with pytest.raises(Fatal):  # in-process, it propagates as it is
        await in_process(fatal, "{}")


# --- what the adapter publishes and what the tool sees --------------------------------------
def test_the_registry_entry_is_the_sdk_tools_own() -> None:
    spec = REGISTRY.get("add").spec("default")
    assert (spec.name, spec.description) == ("add", "Adds two numbers.")
    assert spec.parameters == add.params_json_schema
    assert spec.parameters["additionalProperties"] is False  # strict, as the model sees it
    assert (spec.effect_class, spec.on_unknown, spec.timeout_s) == (
        "non_idempotent", "report_now", None,
    )  # fmt: skip
    assert REGISTRY.get("slow").spec("default").timeout_s == 0.05
    assert REGISTRY.get("delete_repo").spec("default").needs_approval == "always"
    assert REGISTRY.get("pay").spec("default").needs_approval == "callable"
    assert REGISTRY.get("add").spec("default").needs_approval == "never"


def test_toolfleet_options_go_alongside() -> None:
    registry = ToolRegistry()
    tool = registry.add_function_tool(add, effect="idempotent", pool="math", version="2")

    @tool.probe
    async def _(ctx: ToolContext) -> ProbeResult:
        return ProbeResult.not_applied()

    spec = tool.spec("default")
    assert (spec.effect_class, spec.pool, spec.version, spec.has_probe) == (
        "idempotent", "math", "2", True,
    )  # fmt: skip
    assert spec.on_unknown == "report_now"  # SDK tools keep their texts
    other = ToolRegistry().add_function_tool(add, on_unknown="reconcile_then_report")
    assert other.spec("default").on_unknown == "reconcile_then_report"


def test_is_enabled_and_namespaces() -> None:
    @function_tool(is_enabled=False)
    async def off() -> str:
        return ""

    async def sometimes(ctx: RunContextWrapper[Any], agent: Any) -> bool:
        return False

    @function_tool(is_enabled=sometimes)
    async def dynamic() -> str:
        return ""

    registry = ToolRegistry.from_function_tools([off, dynamic])
    assert registry.get("off").spec("default").enabled is False
    # A callable depends on the run context: the agent side (FleetRunner) evaluates it.
    assert registry.get("dynamic").spec("default").enabled is True
    (namespaced,) = tool_namespace(name="crm", description="CRM tools", tools=[add])
    assert ToolRegistry().add_function_tool(namespaced).lookup_key == "crm.add"


async def test_the_sdk_context_carries_toolfleets_call_identity() -> None:
    seen: list[Any] = []

    @function_tool
    async def whoami(ctx: RunContextWrapper[Any]) -> str:
        seen.append(ctx)
        return "ok"

    tool = ToolRegistry().add_function_tool(whoami)
    outcome = await run_call(tool, command(tool, "{}", call_id="c9"), worker_id="w1")
    assert outcome.output == "ok"
    (ctx,) = seen
    assert isinstance(ctx, SdkToolContext)
    assert (ctx.tool_name, ctx.tool_call_id, ctx.tool_arguments) == ("whoami", "c9", "{}")
    assert isinstance(ctx.context, ToolContext)
    assert ctx.context.idempotency_key == "idem-1"


def test_only_function_tools_are_adapted() -> None:
    assert is_function_tool(add) and not is_function_tool(REGISTRY.get("add"))
    with pytest.raises(ConfigurationError, match=r"agents\.FunctionTool"):
        ToolRegistry().add_function_tool(lambda: None)  # type: ignore[arg-type]
    assert isinstance(REGISTRY.get("add"), FunctionToolAdapter)
    with pytest.raises(ConfigurationError, match="declared twice"):
        ToolRegistry.from_function_tools([add, add])


# --- the agent side's pure parts: run errors, what the runner refuses ------------------------
def test_turn_errors_become_the_sdk_exceptions() -> None:
    from agents import exceptions as sdk
    from openai.types.responses import ResponseFunctionToolCall

    from schemas import TurnError
    from toolfleet.agents import FleetTurnError, run_error

    calls = [
        ResponseFunctionToolCall(type="function_call", call_id=cid, name=name, arguments="{}")
        for cid, name in (("c1", "slow"), ("c2", "guarded"))
    ]
    tools = [slow, guarded]

    def raised(type_: str, message: str, call_id: str | None = None) -> Exception:
        return run_error(TurnError(type=type_, message=message, call_id=call_id), calls, tools)

    timeout = raised("ToolTimeoutError", "Tool 'slow' timed out after 0.05 seconds.", "c1")
    assert isinstance(timeout, sdk.ToolTimeoutError)
    assert (timeout.tool_name, timeout.timeout_seconds) == ("slow", 0.05)
    assert str(timeout) == "Tool 'slow' timed out after 0.05 seconds."
    trip = raised(
        "ToolInputGuardrailTripwireTriggered",
        "Tool input guardrail ToolInputGuardrail triggered tripwire",
        "c2",
    )
    assert isinstance(trip, sdk.ToolInputGuardrailTripwireTriggered)
    assert trip.guardrail is no_secrets  # the tool's only input guardrail
    out = raised("ToolOutputGuardrailTripwireTriggered", "Tool output guardrail x", "c2")
    assert isinstance(out, sdk.ToolOutputGuardrailTripwireTriggered)
    for type_ in ("ModelBehaviorError", "UserError"):
        error = raised(type_, "words")
        assert (type(error).__name__, str(error)) == (type_, "words")
    fatal_error = raised("Fatal", "fatal", "c1")
    assert isinstance(fatal_error, FleetTurnError)
    assert (fatal_error.type, str(fatal_error), fatal_error.call_id) == ("Fatal", "fatal", "c1")


async def test_outside_a_fleet_run_the_sdk_runs_tools_as_it_always_does() -> None:
    import toolfleet.agents  # noqa: F401  (routes the SDK's invocation point through FleetRunner)

    model = ScriptedModel(
        [[function_call("add", {"a": 2, "b": 3}, call_id="c1")], [assistant_message("five")]]
    )
    result = await Runner.run(Agent(name="plain", model=model, tools=[add]), "go")
    outputs = [i.output for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    assert (outputs, result.final_output) == ([5], "five")  # in-process: the tool's own int


async def test_a_run_state_carries_its_fleet_run_through_json() -> None:
    from agents.exceptions import UserError
    from agents.run_state import RunState

    from toolfleet.agents import FleetRunner
    from toolfleet.agents._calls import Binding
    from toolfleet.agents._sdk import remember

    agent = Agent(name="a", tools=[add])
    context: RunContextWrapper[Any] = RunContextWrapper(context={"seat": 3})
    binding = Binding(client=None, tenant_id="t1", run_id="run-7", turn_timeout=1.0,  # type: ignore[arg-type]
                      decided_by="me")  # fmt: skip
    remember(context, binding)
    state: RunState[Any, Any] = RunState(context=context, original_input="go", starting_agent=agent)
    data = state.to_json()
    assert data["toolfleet"] == {"tenant_id": "t1", "run_id": "run-7"}
    runner = FleetRunner(client=None, tenant_id="t1")  # type: ignore[arg-type]
    # Restored with the application's agent (as the SDK documents), from a dict or a string.
    for restored in (
        await RunState.from_json(agent, json.loads(json.dumps(data))),
        await RunState.from_string(agent, state.to_string()),
    ):
        assert runner.run_id_of(restored) == "run-7"
        assert restored._context is not None and restored._context.context == {"seat": 3}
        again = restored.to_json()  # and it keeps travelling, saved again
        assert again["toolfleet"] == data["toolfleet"]
    stranger = FleetRunner(client=None, tenant_id="t2")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="of tenant t1"):
        await stranger.run(agent, await RunState.from_json(agent, data))


def test_a_run_state_the_sdk_made_carries_no_fleet_run() -> None:
    from agents.run_state import RunState

    import toolfleet.agents  # noqa: F401

    agent = Agent(name="a")
    state: RunState[Any, Any] = RunState(
        context=RunContextWrapper(context=None), original_input="go", starting_agent=agent
    )
    assert "toolfleet" not in state.to_json()
