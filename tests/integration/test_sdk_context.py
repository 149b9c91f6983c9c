"""The run context on FleetRunner, compared with the Agents SDK in-process.

Each scenario scripts the model once and runs the same application twice — in-process with the
SDK's ``Runner`` and with ``toolfleet.agents.FleetRunner`` on a ``toolfleet.testing.
InProcessFleet`` (the real planner, aggregator and worker against the real Kafka and Redis) —
and compares what the tools saw of their run context and what the application's context object
holds afterwards. On the fleet a tool gets a copy (it runs on a worker): the copy's type and
values are the in-process ones, and what the tool changes comes back to the application's own
object when the call is answered. Where the two differ by design, the test says so: the copy is
never the application's object, two calls changing one member end in model order (in-process:
whichever wrote last), and a context JSON cannot hold stays with the runner.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from agents import Agent, RunContextWrapper, RunHooks, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tracing import set_tracing_disabled
from pydantic import BaseModel

from executors import ToolContext as WorkerToolContext
from executors import current_tool_context
from kernel.settings import Settings
from toolfleet.agents import FleetRunner
from toolfleet.testing import InProcessFleet

pytestmark = [pytest.mark.integration, pytest.mark.agent_runtime]

set_tracing_disabled(True)

TENANT = "sdk-context"


@dataclass
class Profile:
    """A dataclass run context, as an application keeps one per conversation."""

    user: str
    visits: int = 0
    tags: list[str] = field(default_factory=list)


class AirlineContext(BaseModel):
    """The pydantic run context of the SDK's customer_service example."""

    passenger_name: str | None = None
    confirmation_number: str | None = None
    seat_number: str | None = None
    flight_number: str | None = None


@dataclass
class WithAClient:
    """A context JSON cannot hold: a lock stands for a database client or a socket."""

    user: str
    lock: Any = field(default_factory=threading.Lock)


@pytest.fixture(scope="module")
async def fleet(settings: Settings) -> AsyncIterator[InProcessFleet]:
    async with InProcessFleet(settings, auto_serve=True) as running:
        yield running


@pytest.fixture
def runner(fleet: InProcessFleet) -> FleetRunner:
    return FleetRunner(fleet.client, tenant_id=TENANT, turn_timeout=30)


Steps = list[list[Any]]


async def both(
    runner: FleetRunner,
    build: Callable[[ScriptedModel], Agent[Any]],
    steps: Steps,
    make_context: Callable[[], Any],
    hooks: Callable[[], RunHooks[Any] | None] = lambda: None,
) -> tuple[tuple[Any, Any, ScriptedModel], tuple[Any, Any, ScriptedModel]]:
    """The application run in-process, then on the fleet, each with a fresh context:
    per runner (result, the context object it was given, the model)."""
    runs = []
    for run in (Runner.run, runner.run):
        model, context = ScriptedModel(steps), make_context()
        result = await run(build(model), "go", context=context, hooks=hooks())
        runs.append((result, context, model))
    return runs[0], runs[1]


def outputs(result: Any) -> list[str]:
    return [item.output for item in result.new_items if item.type == "tool_call_output_item"]


async def test_a_dataclass_context_reaches_the_tool_as_in_process(runner: FleetRunner) -> None:
    """The tool declares no context type (``RunContextWrapper[Any]``): its copy is rebuilt as
    the application's class, which the worker has imported. Its SDK tool context names the
    tool, the call (the item as the model wrote it) and the agent as in-process; the fleet's
    view of the call is ``current_tool_context()``."""
    seen: list[dict[str, Any]] = []
    keys: list[str | None] = []

    @function_tool
    def visit(ctx: RunContextWrapper[Any], page: str) -> str:
        """Record a visit."""
        seen.append(
            {
                "type": type(ctx.context),
                "context": dataclasses.asdict(ctx.context),
                "agent": ctx.agent.name,  # type: ignore[attr-defined]
                "tool": (ctx.tool_name, ctx.tool_call_id, ctx.tool_arguments),  # type: ignore[attr-defined]
                "call": ctx.tool_call.model_dump(exclude_unset=True),  # type: ignore[attr-defined]
            }
        )
        fleet_call = current_tool_context()  # the fleet's view of the call: on a worker only
        keys.append(fleet_call.idempotency_key if fleet_call is not None else None)
        ctx.context.visits += 1
        ctx.context.tags.append(page)
        return f"{ctx.context.user} saw {page}"

    steps: Steps = [
        [function_call("visit", {"page": "home"}, call_id="v1")],
        [assistant_message("done")],
    ]
    (sdk, sdk_context, _), (fleet, fleet_context, _) = await both(
        runner,
        lambda model: Agent(name="guide", model=model, tools=[visit]),
        steps,
        lambda: Profile("ann", visits=2, tags=["start"]),
    )

    expected = {
        "type": Profile,
        "context": {"user": "ann", "visits": 2, "tags": ["start"]},
        "agent": "guide",
        "tool": ("visit", "v1", '{"page":"home"}'),
    }
    assert {k: v for k, v in seen[0].items() if k != "call"} == expected
    assert seen[0] == seen[1]  # the call item too: its id and status as the model wrote them
    assert keys[0] is None and keys[1] is not None and keys[1].startswith("tf-")
    assert outputs(sdk) == outputs(fleet) == ["ann saw home"]
    assert sdk_context == fleet_context == Profile("ann", visits=3, tags=["start", "home"])
    assert fleet.context_wrapper.context is fleet_context  # the application's own object


async def test_a_pydantic_context_changed_by_a_tool_comes_back_and_travels_on(
    runner: FleetRunner,
) -> None:
    """customer_service/main.py's tools: one writes the seat into the context, a later turn's
    tool reads it from its copy: the change came back to the application's object, and the
    next call carried it to the worker."""

    @function_tool
    async def update_seat(
        context: RunContextWrapper[AirlineContext], confirmation_number: str, new_seat: str
    ) -> str:
        """Update the seat for a given confirmation number."""
        context.context.confirmation_number = confirmation_number
        context.context.seat_number = new_seat
        assert context.context.flight_number is not None, "Flight number is required"
        return f"Updated seat to {new_seat} for confirmation number {confirmation_number}"

    @function_tool
    async def read_seat(context: RunContextWrapper[AirlineContext]) -> str:
        """The passenger's seat."""
        return f"{context.context.passenger_name}: {context.context.seat_number}"

    seat = {"confirmation_number": "K7", "new_seat": "23A"}
    steps: Steps = [
        [function_call("update_seat", seat, call_id="u1")],
        [function_call("read_seat", {}, call_id="r1")],
        [assistant_message("Your seat is 23A.")],
    ]
    (sdk, sdk_context, sdk_model), (fleet, fleet_context, fleet_model) = await both(
        runner,
        lambda model: Agent(name="Seat Booking Agent", model=model, tools=[update_seat, read_seat]),
        steps,
        lambda: AirlineContext(passenger_name="Ann", flight_number="FLT-123"),
    )

    said = ["Updated seat to 23A for confirmation number K7", "Ann: 23A"]
    assert outputs(sdk) == outputs(fleet) == said
    booked = AirlineContext(
        passenger_name="Ann", confirmation_number="K7", seat_number="23A", flight_number="FLT-123"
    )
    assert sdk_context == fleet_context == booked
    assert [c.input for c in sdk_model.calls] == [c.input for c in fleet_model.calls]


class _EndOf(RunHooks[Any]):
    """Sets ``ended`` once the call named ``call_id`` has ended in the runner (its output, and
    on the fleet its context changes, are the runner's)."""

    def __init__(self, call_id: str) -> None:
        self.call_id = call_id
        self.ended = asyncio.Event()

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        if getattr(context, "tool_call_id", None) == self.call_id:
            self.ended.set()


async def test_two_parallel_calls_changing_different_fields_both_apply(
    runner: FleetRunner,
) -> None:
    """The first call answers last, its copy holding the tags as they were sent: only what it
    changed (the user) applies, so the second call's tag stays."""
    current: list[_EndOf] = []

    @function_tool
    async def rename(ctx: RunContextWrapper[Profile], user: str) -> str:
        """Rename the user, once the tagging call has ended."""
        await asyncio.wait_for(current[-1].ended.wait(), 20)
        ctx.context.user = user
        return user

    @function_tool
    async def tag(ctx: RunContextWrapper[Profile], label: str) -> str:
        """Tag the user."""
        ctx.context.tags.append(label)
        return label

    def hooks() -> _EndOf:
        current.append(_EndOf("t1"))
        return current[-1]

    steps: Steps = [
        [
            function_call("rename", {"user": "bo"}, call_id="n1"),
            function_call("tag", {"label": "vip"}, call_id="t1"),
        ],
        [assistant_message("done")],
    ]
    (sdk, sdk_context, _), (fleet, fleet_context, _) = await both(
        runner,
        lambda model: Agent(name="crm", model=model, tools=[rename, tag]),
        steps,
        lambda: Profile("ann"),
        hooks,
    )

    assert outputs(sdk) == outputs(fleet) == ["bo", "vip"]
    assert sdk_context == fleet_context == Profile("bo", tags=["vip"])


async def test_two_calls_changing_one_field_end_in_model_order(runner: FleetRunner) -> None:
    """Both calls set the user; the first in model order writes last. In-process the last
    writer wins; on the fleet the result is model order's, whichever call answers first: the
    second call's value (deliberate: concurrent tools on different workers have no write
    order the runner could observe)."""
    current: list[_EndOf] = []

    @function_tool
    async def set_user(ctx: RunContextWrapper[Profile], user: str, last: bool) -> str:
        """Set the user (``last``: once the other call has ended)."""
        if last:
            await asyncio.wait_for(current[-1].ended.wait(), 20)
        ctx.context.user = user
        return user

    def hooks() -> _EndOf:
        current.append(_EndOf("s2"))
        return current[-1]

    steps: Steps = [
        [
            function_call("set_user", {"user": "first", "last": True}, call_id="s1"),
            function_call("set_user", {"user": "second", "last": False}, call_id="s2"),
        ],
        [assistant_message("done")],
    ]
    (sdk, sdk_context, _), (fleet, fleet_context, _) = await both(
        runner,
        lambda model: Agent(name="crm", model=model, tools=[set_user]),
        steps,
        lambda: Profile("ann", visits=1),
        hooks,
    )

    assert outputs(sdk) == outputs(fleet) == ["first", "second"]
    assert sdk_context == Profile("first", visits=1)  # in-process: the last writer
    assert fleet_context == Profile("second", visits=1)  # the fleet: model order


async def test_a_failing_tools_change_comes_back_as_in_process(runner: FleetRunner) -> None:
    """A tool that changes the context and then raises: the model sees the SDK's failure
    text, and the change stays, as in-process."""

    @function_tool
    def charge(ctx: RunContextWrapper[dict[str, Any]], amount: int) -> str:
        """Charge the customer."""
        ctx.context["attempts"] = ctx.context.get("attempts", 0) + 1
        raise RuntimeError("card declined")

    steps: Steps = [
        [function_call("charge", {"amount": 5}, call_id="c1")],
        [assistant_message("declined")],
    ]
    (sdk, sdk_context, _), (fleet, fleet_context, _) = await both(
        runner,
        lambda model: Agent(name="billing", model=model, tools=[charge]),
        steps,
        lambda: {"user_id": "user-123"},
    )

    assert outputs(sdk) == outputs(fleet)
    assert sdk_context == fleet_context == {"user_id": "user-123", "attempts": 1}


async def test_a_context_json_cannot_hold_stays_with_the_runner(runner: FleetRunner) -> None:
    """Documented: the tool sees the worker's own ToolContext as its run context, nothing
    comes back, and the run goes on (the tool's failure is the model's, as any failure)."""

    @function_tool
    def who(ctx: RunContextWrapper[Any]) -> str:
        """Who the context is for."""
        if isinstance(ctx.context, WorkerToolContext):
            return f"worker context of {ctx.context.tool_name} in run {ctx.context.run_id}"
        return f"user {ctx.context.user}"

    steps: Steps = [[function_call("who", {}, call_id="w1")], [assistant_message("done")]]
    (sdk, _, _), (fleet, fleet_context, _) = await both(
        runner,
        lambda model: Agent(name="who", model=model, tools=[who]),
        steps,
        lambda: WithAClient("ann"),
    )

    assert outputs(sdk) == ["user ann"]
    run_id = runner.run_id_of(fleet)
    assert outputs(fleet) == [f"worker context of who in run {run_id}"]
    assert fleet.final_output == "done"
    assert fleet.context_wrapper.context is fleet_context
