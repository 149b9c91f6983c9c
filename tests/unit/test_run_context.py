"""The run context's copy and its changes, as pure logic: the codec both sides use, the JSON
Patch a worker sends back, and how FleetRunner applies each call's patch to the
application's context object (member by member, in model order).

A "call" here is what a worker does with a copy: ``CarriedRunContext`` rebuilds it from the
``RunContextCopy`` the runner made, the test changes it as a tool would, and ``changes()`` is
what travels back; ``ContextSync.apply`` is what the runner does when that call is answered.
The integration tests (tests/integration/test_sdk_context.py) run the same through a fleet.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from agents import RunContextWrapper, function_tool
from pydantic import BaseModel, Field

from executors import Tool, ToolContext, ToolRegistry, current_tool_context, run_call
from kernel.tools.run_context import (
    CarriedRunContext,
    apply_json_changes,
    encode_run_context,
    json_changes,
    pointer_path,
    rebuild_run_context,
)
from schemas import ExecutionCommand, RunContextCopy
from toolfleet.agents._context import BatchContext, RunContextSync

LIMIT = 262_144


class Seat(BaseModel):
    row: int
    letter: str


class Booking(BaseModel):
    passenger: str | None = None
    seat: Seat | None = None
    flight: str = Field(default="FL-1", alias="flightNumber")
    notes: list[str] = Field(default_factory=list)


@dataclass
class Session:
    user: str
    counters: dict[str, int] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)


@dataclass
class SpecialSession(Session):
    level: int = 0


@dataclass(frozen=True)
class Frozen:
    value: int


@dataclass
class HoldsALock:
    lock: Any = field(default_factory=threading.Lock)


def worker_copy(copy: RunContextCopy, declared: Any = None) -> tuple[CarriedRunContext, Any]:
    """What a worker hands the tool: the carried context and the tool's copy."""
    carried = CarriedRunContext(copy)
    return carried, carried.copy(declared)


def batch_of(app: Any, *calls: str, limit: int = LIMIT, tool_input: Any = None) -> BatchContext:
    """The runner's side of one batch of ``calls`` (started in that order) on ``app``."""
    batch = RunContextSync(app, limit=limit).batch(agent="a", tool_input=tool_input)
    for index, call in enumerate(calls):
        batch.join(call, (0, index))
    return batch


# --- the codec --------------------------------------------------------------------------------
def test_a_dataclass_and_a_model_are_written_with_their_class() -> None:
    text, name = encode_run_context(Session("ann", {"a": 1})) or ("", None)
    assert json.loads(text) == {"user": "ann", "counters": {"a": 1}, "tags": []}
    assert name == f"{__name__}:Session"
    text, name = encode_run_context(Booking(passenger="bo")) or ("", None)
    assert json.loads(text)["flightNumber"] == "FL-1"  # by alias: it reads back as it was
    assert name == f"{__name__}:Booking"


@pytest.mark.parametrize("value", [None, "user-1", 7, 2.5, True, [1, "a"], {"user_id": "u"}])
def test_json_values_are_written_without_a_class(value: Any) -> None:
    text, name = encode_run_context(value) or ("", "unset")
    assert json.loads(text) == value
    assert name is None


@pytest.mark.parametrize("value", [HoldsALock(), {"lock": threading.Lock()}, object(), {1, 2}])
def test_what_json_cannot_hold_is_not_copied(value: Any) -> None:
    assert encode_run_context(value) is None


def test_the_copy_is_the_type_the_tool_declares_first() -> None:
    copy = RunContextCopy(value=json.dumps({"user": "ann"}), type=f"{__name__}:Session")
    assert rebuild_run_context(copy, dict[str, str]) == {"user": "ann"}
    rebuilt = rebuild_run_context(copy, Session)
    assert isinstance(rebuilt, Session)
    assert rebuilt == Session("ann")


def test_the_recorded_class_is_used_when_it_refines_the_declared_one() -> None:
    copy = RunContextCopy(
        value=json.dumps({"user": "ann", "level": 3}), type=f"{__name__}:SpecialSession"
    )
    assert rebuild_run_context(copy, Session) == SpecialSession("ann", level=3)
    assert rebuild_run_context(copy, None) == SpecialSession("ann", level=3)
    assert rebuild_run_context(copy, Any) == SpecialSession("ann", level=3)


def test_a_class_never_imported_or_local_leaves_json_values() -> None:
    @dataclass
    class Local:
        user: str

    value = json.dumps({"user": "ann"})
    local = RunContextCopy(value=value, type=f"{__name__}:{Local.__qualname__}")
    assert rebuild_run_context(local) == {"user": "ann"}
    elsewhere = RunContextCopy(value=value, type="not.imported.anywhere:Session")
    assert rebuild_run_context(elsewhere) == {"user": "ann"}
    # A declared type the JSON does not fit is passed over, not an error.
    assert rebuild_run_context(RunContextCopy(value=value), Seat) == {"user": "ann"}


# --- the patch --------------------------------------------------------------------------------
CASES = [
    ({"a": 1, "b": {"c": [1, 2]}}, {"a": 1, "b": {"c": [1, 2, 3]}}),
    ({"a": 1, "b": 2}, {"a": 1}),
    ({"a": 1}, {"a": 1, "n/e~w": {"x": None}}),
    ({"a": 1}, {"a": 1.0}),
    ({"a": None}, {"a": {"deep": {"er": True}}}),
    ([1, 2], [2, 1]),
    ("same", "same"),
    ({"a": {"b": 1}}, "not an object any more"),
]


@pytest.mark.parametrize(("before", "after"), CASES)
def test_a_patch_makes_the_copy_sent_into_the_copy_returned(before: Any, after: Any) -> None:
    ops = json_changes(before, after)
    assert apply_json_changes(before, ops) == after
    same = json.dumps(before, sort_keys=True) == json.dumps(after, sort_keys=True)
    assert (ops == []) == same


def test_a_patch_names_members_and_replaces_lists_whole() -> None:
    ops = json_changes(
        {"keep": 1, "list": [1], "obj": {"x": 1, "gone": 2}},
        {"keep": 1, "list": [1, 2], "obj": {"x": 5, "new": 3}},
    )
    assert ops == [
        {"op": "replace", "path": "/list", "value": [1, 2]},
        {"op": "replace", "path": "/obj/x", "value": 5},
        {"op": "add", "path": "/obj/new", "value": 3},
        {"op": "remove", "path": "/obj/gone"},
    ]
    assert pointer_path("/a~1b/c~0d") == ("a/b", "c~d")
    assert pointer_path("") == ()


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "move", "from": "/a", "path": "/b"}],
        [{"op": "replace", "path": "a"}],
        [{"op": "replace", "path": "/missing/deeper", "value": 1}],
        [{"op": "remove", "path": ""}],
    ],
)
def test_a_patch_it_did_not_make_is_refused(ops: list[dict[str, Any]]) -> None:
    with pytest.raises(ValueError):
        apply_json_changes({"a": 1}, ops)


# --- the worker's copy ------------------------------------------------------------------------
def test_one_copy_per_attempt_and_only_its_changes_travel_back() -> None:
    batch = RunContextSync(Session("ann"), limit=LIMIT).batch(agent="triage", tool_input=None)
    carried, copy = worker_copy(batch.copy, Session)
    assert carried.copy(Session) is copy  # body, guardrails and formatters share it
    assert carried.agent == "triage"
    assert carried.changes() is None
    copy.counters["seen"] = 1
    assert json.loads(carried.changes() or "") == [
        {"op": "add", "path": "/counters/seen", "value": 1}
    ]


def test_a_copy_that_reads_back_differently_reports_only_what_the_tool_changed() -> None:
    # The tool declares a narrower type than the application's: its copy has no "level".
    # That is not a removal the tool made, and must not travel back as one.
    sent = RunContextCopy(value=json.dumps({"user": "ann", "level": 3}))
    carried, copy = worker_copy(sent, Session)
    assert copy == Session("ann")
    assert carried.changes() is None
    copy.user = "bo"
    assert json.loads(carried.changes() or "") == [
        {"op": "replace", "path": "/user", "value": "bo"}
    ]


def test_no_copy_or_bad_json_gives_the_default() -> None:
    marker = object()
    assert CarriedRunContext(None).copy(default=marker) is marker
    assert CarriedRunContext(RunContextCopy(value=None)).copy(default=marker) is marker
    bad = CarriedRunContext(RunContextCopy(value="{not json"))
    assert bad.copy(default=marker) is marker
    assert bad.changes() is None


# --- applying a call's changes to the application's object ------------------------------------
def test_a_change_applies_member_by_member_and_keeps_what_no_call_changed() -> None:
    app = Booking(passenger="ann", seat=Seat(row=3, letter="C"), notes=["x"])
    seat, notes = app.seat, app.notes
    assert seat is not None
    batch = batch_of(app, "c1")
    carried, copy = worker_copy(batch.copy, Booking)
    assert copy == app and copy is not app and copy.seat is not None
    copy.seat.letter = "D"
    batch.apply("c1", carried.changes())
    assert app.seat is seat  # the application's own nested object, changed in place
    assert seat.letter == "D"
    assert app.notes is notes
    assert app.passenger == "ann"


def test_two_calls_changing_different_members_both_apply_in_either_answer_order() -> None:
    for answered in (["c1", "c2"], ["c2", "c1"]):
        app = Session("ann")
        batch = batch_of(app, "c1", "c2")
        calls = {call: worker_copy(batch.copy, Session) for call in ("c1", "c2")}
        calls["c1"][1].counters["first"] = 1
        calls["c2"][1].tags.append("second")
        for call in answered:
            batch.apply(call, calls[call][0].changes())
        assert app == Session("ann", {"first": 1}, ["second"])


def test_the_same_member_ends_as_in_model_order_whichever_call_answers_first() -> None:
    for answered in (["c1", "c2"], ["c2", "c1"]):
        app = Session("ann")
        batch = batch_of(app, "c1", "c2")
        calls = {call: worker_copy(batch.copy, Session) for call in ("c1", "c2")}
        calls["c1"][1].user = "first"
        calls["c2"][1].user = "second"
        for call in answered:
            batch.apply(call, calls[call][0].changes())
        assert app.user == "second", answered


def test_model_order_holds_across_the_batches_one_response_travelled_in() -> None:
    app = Session("ann")
    sync = RunContextSync(app, limit=LIMIT)
    first, second = (sync.batch(agent="a", tool_input=None) for _ in range(2))
    first.join("c1", (0, 0))
    second.join("c2", (0, 1))
    one, one_copy = worker_copy(first.copy, Session)
    two, two_copy = worker_copy(second.copy, Session)
    one_copy.user, two_copy.user = "first", "second"
    second.apply("c2", two.changes())
    second.settled()
    first.apply("c1", one.changes())
    assert app.user == "second"


def test_an_earlier_call_replacing_a_whole_member_does_not_undo_a_later_ones_change() -> None:
    app = Booking(seat=Seat(row=1, letter="A"))
    batch = batch_of(app, "c1", "c2")
    (first, first_copy), (second, second_copy) = (worker_copy(batch.copy) for _ in range(2))
    assert isinstance(first_copy, Booking)  # the recorded class: this module is imported
    first_copy.seat = Seat(row=9, letter="F")
    second_copy.seat.letter = "B"
    batch.apply("c2", second.changes())
    batch.apply("c1", first.changes())
    assert app.seat == Seat(row=9, letter="B")  # call 1's seat, then call 2's letter


def test_what_a_settled_run_no_longer_needs_is_forgotten() -> None:
    app = Session("ann")
    sync = RunContextSync(app, limit=LIMIT)
    batch = sync.batch(agent="a", tool_input=None)
    batch.join("c1", (0, 0))
    carried, copy = worker_copy(batch.copy, Session)
    copy.user = "bo"
    batch.apply("c1", carried.changes())
    assert sync._applied
    batch.settled()
    assert not sync._applied
    later = sync.batch(agent="a", tool_input=None)  # the next response sees the change
    assert json.loads(later.copy.value or "")["user"] == "bo"


def test_a_dict_context_gets_keys_added_changed_and_removed() -> None:
    app: dict[Any, Any] = {"user": "ann", "gone": 1, 7: "seven"}
    batch = batch_of(app, "c1")
    carried, copy = worker_copy(batch.copy)
    copy["user"] = "bo"
    copy["new"] = [1]
    copy["7"] = "SEVEN"
    del copy["gone"]
    batch.apply("c1", carried.changes())
    assert app == {"user": "bo", "new": [1], 7: "SEVEN"}


def test_a_list_context_is_changed_in_place() -> None:
    app = ["a"]
    batch = batch_of(app, "c1")
    carried, copy = worker_copy(batch.copy)
    copy.append("b")
    batch.apply("c1", carried.changes())
    assert app == ["a", "b"]


def test_what_cannot_be_copied_or_applied_never_fails() -> None:
    locked = batch_of(HoldsALock(), "c1")
    assert locked.copy.value is None
    assert locked.copy.agent == "a"
    locked.apply("c1", json.dumps([{"op": "replace", "path": "/lock", "value": 1}]))
    assert batch_of({"x": "y" * 2_000}, limit=1_024).copy.value is None
    frozen = Frozen(1)
    batch = batch_of(frozen, "c1")
    batch.apply("c1", json.dumps([{"op": "replace", "path": "/value", "value": 2}]))
    assert frozen.value == 1  # in-process the tool could not change it either
    session = Session("ann")
    batch = batch_of(session, "c1", "c2", "c3")
    batch.apply("c1", "not json")
    batch.apply("c2", json.dumps([{"op": "replace", "path": "/user", "value": 5}]))  # not a str
    batch.apply("unknown", json.dumps([{"op": "replace", "path": "/user", "value": "x"}]))
    assert session == Session("ann")


def test_the_tool_input_travels_beside_the_context() -> None:
    batch = batch_of(None, "c1", tool_input={"input": "hi"})
    carried, copy = worker_copy(batch.copy)
    assert copy is None
    assert carried.available
    assert carried.tool_input() == {"input": "hi"}


# --- the worker: an SDK function tool run by toolfleet's runner -------------------------------
def command_for_tool(tool: Tool, arguments: str, **overrides: Any) -> ExecutionCommand:
    fields: dict[str, Any] = {
        "tenant_id": "t1", "run_id": "r1", "turn_id": 0, "call_id": "c1",
        "tool_name": tool.lookup_key, "arguments": arguments, "index": 0, "pool": "default",
        "attempt": 1, "fencing_token": 1, "idempotency_key": "idem-1", "fingerprint": "fp",
        "issued_at": time.time(),
    }  # fmt: skip
    return ExecutionCommand(**(fields | overrides))


async def test_an_sdk_tool_on_a_worker_gets_the_copy_and_sends_back_its_change() -> None:
    seen: list[Any] = []

    @function_tool
    async def book(ctx: RunContextWrapper[Booking], row: int) -> str:
        """Book a seat."""
        seen.append((ctx.context, ctx.agent, ctx.tool_call, current_tool_context()))  # type: ignore[attr-defined]
        ctx.context.seat = Seat(row=row, letter="A")
        return "booked"

    app = Booking(passenger="ann")
    batch = batch_of(app, "c1")
    tool = ToolRegistry().add_function_tool(book)
    item = {"id": "fc_1", "status": "completed", "agent": {"agent_name": "/root/x"}}
    outcome = await run_call(
        tool,
        command_for_tool(tool, '{"row": 7}', run_context=batch.copy, tool_call=item),
        worker_id="w1",
    )
    ((copy, agent, call, fleet_ctx),) = seen
    booked = Booking(passenger="ann", seat=Seat(row=7, letter="A"))
    assert isinstance(copy, Booking) and copy == booked
    assert agent.name == "a"
    assert (call.id, call.status, call.agent) == ("fc_1", "completed", {"agent_name": "/root/x"})
    assert isinstance(fleet_ctx, ToolContext) and fleet_ctx.idempotency_key == "idem-1"
    assert current_tool_context() is None  # only while the call runs
    batch.apply("c1", outcome.run_context)
    assert app == booked


async def test_without_a_copy_an_sdk_tool_sees_the_workers_tool_context() -> None:
    seen: list[Any] = []

    @function_tool
    async def who(ctx: RunContextWrapper[Any]) -> str:
        """Who runs."""
        seen.append((ctx.context, ctx.agent.name))  # type: ignore[attr-defined]
        return "ok"

    tool = ToolRegistry().add_function_tool(who)
    outcome = await run_call(tool, command_for_tool(tool, "{}"), worker_id="w1")
    ((context, agent),) = seen
    assert isinstance(context, ToolContext) and context.idempotency_key == "idem-1"
    assert agent == "toolfleet"
    assert outcome.run_context is None
