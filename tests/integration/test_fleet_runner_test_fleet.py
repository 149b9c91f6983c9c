"""FleetRunner on a test fleet shared by many tests: defects the SDK's own suite found.

Each is reproduced here as the Agents SDK's tests (tests/sdk_suite) meet it: one
``InProcessFleet`` for the module, as a harness's session fixture starts one, a new
``FleetRunner`` per test, tools defined inside each test under names other tests reuse, so
what one test leaves on the fleet must not reach the next. Real Kafka, Redis and the fleet's
services.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents import (
    Agent,
    GuardrailFunctionOutput,
    ProgrammaticToolCallingTool,
    RunConfig,
    RunContextWrapper,
    Runner,
    UserError,
    function_tool,
    input_guardrail,
)
from agents.exceptions import _mark_error_data_redacted
from agents.items import ToolApprovalItem
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tracing import (
    Span,
    Trace,
    TracingProcessor,
    add_trace_processor,
    set_tracing_disabled,
)
from openai.types.responses import ResponseFunctionToolCall
from openai.types.responses.response_function_tool_call import CallerProgram
from openai.types.responses.response_output_item import Program

from kernel.settings import Settings
from toolfleet.agents import FleetRunner, FleetToolError
from toolfleet.testing import InProcessFleet

pytestmark = [pytest.mark.integration, pytest.mark.layout_free, pytest.mark.agent_runtime]

set_tracing_disabled(True)

TENANT = "test-fleet"


@pytest.fixture(scope="module")
async def fleet(settings: Settings) -> AsyncIterator[InProcessFleet]:
    """One fleet for the module, as a harness's conftest starts one per session."""
    async with InProcessFleet(settings, auto_serve=True) as running:
        yield running


def script(call_id: str) -> ScriptedModel:
    """A model that calls ``second_tool`` once, then answers."""
    return ScriptedModel(
        [[function_call("second_tool", {}, call_id=call_id)], [assistant_message("done")]]
    )


def outputs(result: Any) -> list[Any]:
    return [item.output for item in result.new_items if item.type == "tool_call_output_item"]


async def test_a_reused_name_is_gated_by_the_object_the_run_calls_not_an_earlier_one(
    fleet: InProcessFleet,
) -> None:
    # An earlier test's tool of the name asks a person for every call: the fleet serves it.
    @function_tool(name_override="second_tool", needs_approval=True)
    def earlier() -> str:
        """The earlier test's body."""
        return "earlier"

    runner = FleetRunner(fleet.client, tenant_id=TENANT)
    agent = Agent(name="a", model=script("c1"), tools=[earlier])
    held = await runner.run(agent, "go")
    assert [i.name for i in held.interruptions] == ["second_tool"] and outputs(held) == []
    state = held.to_state()
    state.approve(held.interruptions[0])
    approved = await runner.run(agent, state)  # the approved call runs on the fleet: served
    assert outputs(approved) == ["earlier"]
    assert fleet.served("second_tool").function_tool is earlier  # type: ignore[attr-defined]

    # This test's tool of the same name asks nobody: it runs, with no interruption, although
    # the fleet's registry still names the earlier object's gate when the run starts.
    ran: list[str] = []

    @function_tool(name_override="second_tool")
    def current() -> str:
        """This test's body."""
        ran.append("current")
        return "second tool result"

    runner = FleetRunner(fleet.client, tenant_id=TENANT)
    result = await runner.run(Agent(name="a", model=script("c1"), tools=[current]), "go")

    assert result.interruptions == [] and result.final_output == "done"
    assert outputs(result) == ["second tool result"] and ran == ["current"]
    assert fleet.served("second_tool").function_tool is current  # type: ignore[attr-defined]


async def test_the_release_gate_of_the_object_served_with_fleet_options_still_asks(
    fleet: InProcessFleet,
) -> None:
    """The other way round: an object the fleet gates (an irreversible effect, declared when
    serving it) under a name an earlier object ran unattended is asked about, the SDK's way."""
    ran: list[str] = []

    @function_tool(name_override="second_tool")
    def wire_money() -> str:
        """Sends money: irreversible."""
        ran.append("wired")
        return "sent"

    await fleet.serve(wire_money, effect="irreversible")
    runner = FleetRunner(fleet.client, tenant_id=TENANT)
    agent = Agent(name="a", model=script("c2"), tools=[wire_money])
    held = await runner.run(agent, "go")

    assert [i.name for i in held.interruptions] == ["second_tool"] and ran == []
    state = held.to_state()
    state.approve(held.interruptions[0])
    result = await runner.run(agent, state)
    assert outputs(result) == ["sent"] and ran == ["wired"]


async def test_an_approval_the_sdk_scopes_to_the_agent_runs_the_call(
    fleet: InProcessFleet,
) -> None:
    """The context holds another agent's approval of a same-named tool: the SDK asks again
    for this agent's tool, and the person's approval of it (scoped to this agent, which a
    lookup by tool name alone cannot tell apart) lets the call run on the fleet."""
    executed: list[str] = []

    @function_tool(name_override="operate", needs_approval=True)
    def low_privilege() -> str:
        """Another agent's capability."""
        return "public data"

    @function_tool(name_override="operate", needs_approval=True)
    def privileged() -> str:
        """This agent's capability."""
        executed.append("privileged")
        return "private data"

    source = Agent(name="owner", tools=[low_privilege])
    context: RunContextWrapper[dict[str, str]] = RunContextWrapper(context={"tenant": "t"})
    call = ResponseFunctionToolCall(
        type="function_call", call_id="approved", name="operate", arguments="{}"
    )
    context.approve_tool(ToolApprovalItem(agent=source, raw_item=call))
    model = ScriptedModel([[function_call("operate", {}, call_id="approved")],
                           [assistant_message("done")]])  # fmt: skip
    configured = Agent(name="owner", tools=[privileged], model=model)
    runner = FleetRunner(fleet.client, tenant_id=TENANT)

    held = await runner.run(configured, "start", context=context)
    assert executed == [] and [i.agent for i in held.interruptions] == [configured]
    state = held.to_state()
    state.approve(held.interruptions[0])
    resumed = await runner.run(configured, state)

    assert resumed.final_output == "done" and executed == ["privileged"]
    assert outputs(resumed) == ["private data"]


async def test_a_deferred_top_level_tool_called_under_its_own_namespace_runs_on_the_fleet(
    fleet: InProcessFleet,
) -> None:
    """The model names a deferred top-level tool ``lookup`` with the namespace ``lookup``;
    the SDK dispatches it as ``lookup``, and so must the fleet (not ``lookup.lookup``)."""

    @function_tool(defer_loading=True)
    async def lookup() -> str:
        """Looks something up (loaded on demand)."""
        return "found"

    model = ScriptedModel(
        [
            [function_call("lookup", {}, call_id="d1", namespace="lookup")],
            [assistant_message("done")],
        ]
    )
    runner = FleetRunner(fleet.client, tenant_id=TENANT)
    result = await runner.run(Agent(name="a", model=model, tools=[lookup]), "start")

    assert outputs(result) == ["found"] and result.final_output == "done"
    assert fleet.served("lookup").function_tool is lookup  # type: ignore[attr-defined]


class Rejected(Exception):
    """An application's own exception class."""


@pytest.mark.parametrize(
    ("raised", "cause"),
    [(ValueError("no such order"), ValueError), (Rejected("no such order"), FleetToolError)],
)
async def test_a_tool_exception_that_fails_the_run_is_the_user_errors_cause(
    fleet: InProcessFleet, raised: Exception, cause: type[Exception]
) -> None:
    """A tool without a failure handler fails the run with UserError("Error running tool
    ..."); its ``__cause__`` is the tool's exception, as in-process: rebuilt when its class is
    a built-in one, else a FleetToolError naming the class (the object stayed on the worker)."""

    @function_tool(failure_error_function=None)
    async def find_order() -> str:
        """Finds an order."""
        raise raised

    model = ScriptedModel([[function_call("find_order", {}, call_id="f1")]])
    runner = FleetRunner(fleet.client, tenant_id=TENANT)
    with pytest.raises(UserError, match="no such order") as failed:
        await runner.run(Agent(name="a", model=model, tools=[find_order]), "find it")

    error = failed.value.__cause__
    assert type(error) is cause and str(error) == "no such order"
    assert getattr(error, "type", "ValueError") == type(raised).__name__
    assert str(failed.value) == "Error running tool find_order: no such order"


async def test_a_programs_call_of_a_tool_with_an_output_schema_fails_on_its_exception(
    fleet: InProcessFleet,
) -> None:
    """The SDK gives a program's call of a tool with an output schema no default failure text
    (the worker, which does not see the caller, gives it one): the run fails, as in-process."""
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }

    @function_tool(allowed_callers=["direct", "programmatic"], output_json_schema=schema)
    async def check() -> str:
        """Checks something."""
        raise ValueError("check failed")

    call = ResponseFunctionToolCall(
        type="function_call", call_id="p1", name="check", arguments="{}",
        caller=CallerProgram(type="program", caller_id="program-1"),
    )  # fmt: skip
    program = Program(
        id="program-item", call_id="program-1", code="check()", fingerprint="f", type="program"
    )
    model = ScriptedModel([[program, call], [assistant_message("done")]])
    agent = Agent(name="a", model=model, tools=[check, ProgrammaticToolCallingTool()])
    runner = FleetRunner(fleet.client, tenant_id=TENANT)
    with pytest.raises(UserError, match="check failed") as failed:
        await runner.run(agent, "start")
    assert isinstance(failed.value.__cause__, ValueError)


class _Spans(TracingProcessor):
    """Counts the spans started and ended while ``on`` (a processor stays registered)."""

    on = False
    started = 0
    ended = 0

    def on_trace_start(self, trace: Trace) -> None:
        return None

    def on_trace_end(self, trace: Trace) -> None:
        return None

    def on_span_start(self, span: Span[Any]) -> None:
        if _Spans.on:
            _Spans.started += 1

    def on_span_end(self, span: Span[Any]) -> None:
        if _Spans.on:
            _Spans.ended += 1

    def shutdown(self) -> None:
        return None

    def force_flush(self) -> None:
        return None


async def test_a_call_the_runner_cancels_ends_at_once_and_the_fleet_still_hears_of_it(
    fleet: InProcessFleet,
) -> None:
    """A streamed run cancelled while a call runs: as in-process, the call's task (and its
    function span) has ended when the stream does; the fleet cancels the body afterwards."""
    started, stopped = asyncio.Event(), asyncio.Event()

    @function_tool
    async def slow_tool() -> str:
        """Never finishes by itself."""
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        return "unreachable"

    add_trace_processor(_Spans())
    set_tracing_disabled(False)
    _Spans.on, _Spans.started, _Spans.ended = True, 0, 0
    try:
        model = ScriptedModel([[function_call("slow_tool", {}, call_id="s1")]])
        runner = FleetRunner(fleet.client, tenant_id=TENANT)
        result = runner.run_streamed(Agent(name="a", model=model, tools=[slow_tool]), "go")

        async def consume() -> None:
            async for _ in result.stream_events():
                pass

        consumer = asyncio.create_task(consume())
        await asyncio.wait_for(started.wait(), 10)
        result.cancel()
        await asyncio.wait_for(consumer, 10)
        assert _Spans.started == _Spans.ended > 0
    finally:
        _Spans.on = False
        set_tracing_disabled(True)
    # The cancellation reached the worker, which cancelled the body.
    await asyncio.wait_for(stopped.wait(), 30)


def test_run_sync_raises_an_error_the_sdk_redacted_detached_from_the_callers(
    fleet: InProcessFleet,
) -> None:
    """As ``Runner.run_sync``: an error the SDK marked as data-redacted leaves ``run_sync``
    without the exception the caller was handling as its context."""

    @input_guardrail
    async def protected(context: Any, agent: Any, input: Any) -> GuardrailFunctionOutput:
        error = RuntimeError("protected configuration")
        _mark_error_data_redacted(error)
        raise error

    def agent() -> Agent[Any]:
        return Agent(name="a", model=ScriptedModel([]), input_guardrails=[protected])

    config = RunConfig(tracing_disabled=True)
    runner = FleetRunner(fleet.client, tenant_id=TENANT)
    for run_sync in (Runner.run_sync, runner.run_sync):
        caller_error = ValueError("the caller's own")
        try:
            raise caller_error
        except ValueError:
            with pytest.raises(RuntimeError, match="protected configuration") as raised:
                run_sync(agent(), "hello", run_config=config)
        assert raised.value.__context__ is None and raised.value.__cause__ is None
