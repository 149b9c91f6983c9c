"""run_call and friends: one call in the SDK's order, mapped onto a CallOutcome.

The default texts are compared with the real OpenAI Agents SDK 0.24 running the same tools.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import pytest
from agents import Agent, FunctionTool, Runner, ToolCallOutputItem, function_tool
from agents import _debug as sdk_debug
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_guardrails import ToolGuardrailFunctionOutput, tool_input_guardrail
from agents.tracing import set_tracing_disabled

from executors import (
    CallHooks,
    GuardrailResult,
    NotExecuted,
    Tool,
    ToolContext,
    ToolRegistry,
    run_call,
)
from kernel.errors import ConfigurationError
from schemas import CallOutcome, ExecutionCommand

DEFAULT_ERROR = "An error occurred while running the tool. Please try again."
TIMEOUT_TEXT = "Tool 'tool' timed out after 0.05 seconds."


def command(arguments: str = "{}", **overrides: Any) -> ExecutionCommand:
    fields: dict[str, Any] = {
        "tenant_id": "t1", "run_id": "r1", "turn_id": 2, "call_id": "call_1",
        "tool_name": "tool", "arguments": arguments, "index": 3, "pool": "default",
        "attempt": 1, "fencing_token": 7, "idempotency_key": "idem-1", "fingerprint": "fp",
        "issued_at": time.time(),
    }  # fmt: skip
    return ExecutionCommand(**(fields | overrides))


def make(func: Any, **options: Any) -> Tool:
    # The runner's mechanics, not the release gate (tested on its own): run unattended.
    options.setdefault("unattended", "a unit test of the runner's mechanics")
    return ToolRegistry().tool(name="tool", **options)(func)


def do(action: str) -> str:
    return json.dumps({"action": action})


class Custom(BaseException):
    """A BaseException that is neither an Exception nor a cancellation."""


async def body(ctx: ToolContext, action: str = "ok") -> Any:
    """One tool for the outcome table: the argument picks what it does."""
    raises: dict[str, BaseException] = {
        "raise": ValueError("secret detail"), "own_timeout": TimeoutError("upstream"),
        "cancel": asyncio.CancelledError(), "interrupt": KeyboardInterrupt("stop"),
        "exit": SystemExit(3), "custom": Custom("stop"),
        "refused": ConnectionRefusedError("refused"), "declined": NotExecuted("card declined"),
    }  # fmt: skip
    if action in raises:
        raise raises[action]
    if action == "sleep":
        await asyncio.sleep(30)  # wait-ok: outlives its timeout on purpose
    return {"a": 1} if action == "dict" else "done"


class Log(CallHooks):
    """Records, in order, what ran: the ledger gate, hooks, guardrails and tool bodies."""

    def __init__(self) -> None:
        self.events: list[str] = []

    async def on_started(self) -> None:
        self.events.append("started")

    async def on_tool_start(self, ctx: ToolContext, tool: Tool) -> None:
        self.events.append("on_tool_start")

    async def on_tool_end(self, ctx: ToolContext, tool: Tool, output: str) -> None:
        self.events.append(f"on_tool_end:{output}")

    def guardrail(
        self, name: str, result: GuardrailResult | None = None, raises: Exception | None = None
    ) -> Any:
        """A guardrail (or, named "policy", an approval policy: n > 5) that logs its call."""

        async def check(ctx: ToolContext, args: dict[str, Any], *output: Any) -> Any:
            self.events.append(f"{name}:{args}:{output[0]}" if output else f"{name}:{args}")
            if raises is not None:
                raise raises
            return args.get("n", 0) > 5 if name == "policy" else result or GuardrailResult.allow()

        check.__name__ = name
        return check

    async def tool(self, ctx: ToolContext, n: int = 0) -> str:
        self.events.append("body")
        return f"n={n}" if n >= 0 else str(1 / 0)  # a negative n fails


async def run(tool: Tool, arguments: str = "{}", log: Log | None = None, **kw: Any) -> CallOutcome:
    log = log or Log()
    return await run_call(
        tool, command(arguments, **kw), worker_id="w1", hooks=log, on_started=log.on_started
    )


# --- the outcome table ----------------------------------------------------------------------
NOT_RUN, NO_HANDLER = "not_executed", {"failure_error_function": None}
SUCCEEDED = ("succeeded", "applied", "done", False)  # status, effect, output, fails_turn
HANDLED, FAILS = ("failed", NOT_RUN, DEFAULT_ERROR, False), ("failed", NOT_RUN, None, True)
# An exception after started is a transport signal: the effect is unknown unless it proves
# otherwise (kernel.rules.effects); the model-visible text is the runner's, the worker rewords it.
MAYBE, MAYBE_FAILS = ("failed", "unknown", DEFAULT_ERROR, False), ("failed", "unknown", None, True)
DIES, PENDING = ("failed", "unknown", None, True), ("pending_approval", NOT_RUN, None, False)
TIMED_OUT = ("timed_out", "unknown", TIMEOUT_TEXT, False)
TIMEOUT_ERROR = ("ToolTimeoutError", TIMEOUT_TEXT, "error")  # type, message, severity
RUNNING_ERROR = ("ValueError", "Error running tool tool: secret detail", "error")
CANCELLED = ("CancelledError", "Tool execution cancelled.", "cancellation")
BAD = "Invalid JSON input for tool tool: "
RAISE_TIMEOUT = {"timeout": 0.05, "timeout_behavior": "raise_exception"}


OUTCOMES = [  # rule: tool options, arguments, command overrides -> outcome, error
    ("success_is_succeeded_and_applied", {}, do("ok"), {}, SUCCEEDED, None),
    ("non_str_output_is_stringified_like_the_sdk", {}, do("dict"), {},
     ("succeeded", "applied", "{'a': 1}", False), None),
    ("tool_exception_gives_the_default_text_and_an_unknown_effect", {}, do("raise"), {}, MAYBE,
     ("ValueError", "secret detail", "error")),
    ("read_only_tool_exception_is_not_executed", {"effect": "read_only"}, do("raise"), {},
     HANDLED, ("ValueError", "secret detail", "error")),
    ("not_executed_raised_by_the_tool_is_not_executed", {}, do("declined"), {}, HANDLED,
     ("NotExecuted", "card declined", "error")),
    ("a_refused_connection_is_not_executed", {}, do("refused"), {}, HANDLED,
     ("ConnectionRefusedError", "refused", "error")),
    ("a_declared_definite_error_is_not_executed", {"definite_errors": [ValueError]},
     do("raise"), {}, HANDLED, ("ValueError", "secret detail", "error")),
    ("no_failure_handler_fails_the_turn", NO_HANDLER, do("raise"), {}, MAYBE_FAILS,
     RUNNING_ERROR),
    ("fail_turn_policy_overrides_the_handler", {}, do("raise"), {"failure_policy": "fail_turn"},
     MAYBE_FAILS, RUNNING_ERROR),
    ("tools_own_timeout_error_is_a_lost_response", {"timeout": 10}, do("own_timeout"), {},
     MAYBE, ("TimeoutError", "upstream", "error")),
    ("timeout_gives_the_sdk_text_and_unknown", {"timeout": 0.05}, do("sleep"), {}, TIMED_OUT,
     TIMEOUT_ERROR),
    # Issue 4: transport signals map to unknown for every tool that is not read_only.
    ("read_only_timeout_is_not_executed", {"timeout": 0.05, "effect": "read_only"}, do("sleep"),
     {}, ("timed_out", "not_executed", TIMEOUT_TEXT, False), TIMEOUT_ERROR),
    ("timeout_raise_exception_fails_the_turn", RAISE_TIMEOUT, do("sleep"), {},
     ("timed_out", "unknown", None, True), TIMEOUT_ERROR),
    ("tool_local_cancellation_follows_the_failure_policy", {}, do("cancel"), {},
     ("cancelled", "unknown", DEFAULT_ERROR, False), CANCELLED),
    ("tool_local_cancellation_without_handler_fails_the_turn", NO_HANDLER, do("cancel"), {},
     ("cancelled", "unknown", None, True), CANCELLED),
    ("keyboard_interrupt_fails_the_turn", {}, do("interrupt"), {}, DIES,
     ("KeyboardInterrupt", "stop", "base_exception")),
    ("system_exit_fails_the_turn", {}, do("exit"), {}, DIES, ("SystemExit", "3", "base_exception")),
    ("custom_base_exception_fails_the_turn", {}, do("custom"), {}, DIES,
     ("Custom", "stop", "base_exception")),
    ("invalid_json_is_a_tool_error", {}, "{oops", {}, HANDLED,
     ("ModelBehaviorError", BAD + "{oops", "error")),
    ("invalid_json_without_handler_fails_the_turn", NO_HANDLER, "{oops", {}, FAILS,
     ("ModelBehaviorError", BAD + "{oops", "error")),
    ("non_object_json_is_a_tool_error", {}, "[1]", {}, HANDLED,
     ("ModelBehaviorError", BAD + "expected a JSON object", "error")),
    ("invalid_argument_is_a_tool_error", {}, '{"action": 1}', {}, HANDLED,
     ("ModelBehaviorError", None, "error")),
    ("unknown_argument_is_a_tool_error", {}, '{"dry_run": true}', {}, HANDLED,
     ("ModelBehaviorError", None, "error")),
    ("empty_arguments_mean_no_arguments", {}, "", {}, SUCCEEDED, None),
    ("disabled_tool_fails_the_turn_without_running", {"is_enabled": False}, do("ok"), {}, FAILS,
     ("ModelBehaviorError", "Tool tool is currently disabled.", "error")),
]  # fmt: skip


@pytest.mark.parametrize("case", [pytest.param(case, id=case[0]) for case in OUTCOMES])
async def test_outcome_table(case: tuple[Any, ...]) -> None:
    _, options, arguments, overrides, expected, error = case
    out = await run(make(body, **options), arguments, **overrides)
    assert (out.status, out.effect, out.output, out.fails_turn) == expected
    assert out.resolved == (out.effect != "unknown")
    identity = (out.run_id, out.turn_id, out.call_id, out.index, out.tool_name, out.attempt)
    assert identity == ("r1", 2, "call_1", 3, "tool", 1)
    assert (out.fencing_token, out.worker_id, out.source) == (7, "w1", "executor")
    assert out.finished_at is not None and (out.started_at or 0) <= out.finished_at
    if error is None:
        assert out.error is None
    else:
        assert out.error is not None and (out.error.type, out.error.severity) == error[::2]
        assert error[1] is None or out.error.message == error[1]


# --- parent cancellation --------------------------------------------------------------------
async def _cancel_when(tool: Tool, reached: asyncio.Event, log: Log) -> None:
    task = asyncio.create_task(run(tool, log=log))
    await reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=5)  # a guard against hanging, not a wait for state


async def test_parent_cancellation_propagates_at_once_and_is_never_an_outcome() -> None:
    running, release, cleaned = asyncio.Event(), asyncio.Event(), asyncio.Event()
    log, handled = Log(), []

    async def lingering() -> str:
        running.set()
        try:
            await asyncio.Event().wait()
        finally:
            await release.wait()  # cleanup that outlives the cancelled call
            cleaned.set()
        return ""

    def handler(ctx: ToolContext, exc: Exception) -> str:
        handled.append(exc)
        return "never"

    tool = make(lingering, failure_error_function=handler, output_guardrails=[log.guardrail("out")])
    await _cancel_when(tool, running, log)
    # No failure handler, output guardrail or on_tool_end; and no waiting for the tool's cleanup.
    assert (log.events, handled, cleaned.is_set()) == (["started", "on_tool_start"], [], False)
    release.set()
    await cleaned.wait()


async def test_parent_cancellation_swallowed_by_user_code_still_propagates() -> None:
    waiting, log = asyncio.Event(), Log()

    async def stubborn(ctx: ToolContext, args: dict[str, Any]) -> GuardrailResult:
        waiting.set()
        with contextlib.suppress(asyncio.CancelledError):  # swallowed on purpose
            await asyncio.Event().wait()
        return GuardrailResult.allow()

    await _cancel_when(make(log.tool, input_guardrails=[stubborn]), waiting, log)
    assert log.events == ["started"]


async def test_tool_local_cancellation_follows_the_failure_policy() -> None:
    running = asyncio.Event()

    async def waits() -> str:
        running.set()
        await asyncio.Event().wait()
        return "never"

    for policy, fails_turn, output in (("error_as_output", False, DEFAULT_ERROR),
                                       ("fail_turn", True, None)):  # fmt: skip
        running.clear()
        cancel: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(
            run_call(make(waits), command(failure_policy=policy), worker_id="w", cancel_call=cancel)
        )
        await running.wait()
        cancel.set_result(None)
        outcome = await task
        assert (outcome.status, outcome.effect, outcome.output, outcome.fails_turn) == (
            "cancelled", "unknown", output, fails_turn,
        )  # fmt: skip
        assert outcome.error is not None and outcome.error.severity == "cancellation"


# --- approvals, guardrails and hooks: what runs, in which order, with which outcome ---------
REJECT, TRIP = GuardrailResult.reject_content("no"), GuardrailResult.raise_exception()
IN_TRIP = "Tool input guardrail in triggered tripwire"
OUT_TRIP = "Tool output guardrail out triggered tripwire"
RAN = ["started", "in:{'n': 1}", "on_tool_start", "body"]
ORDER = [  # rule: options(log), arguments, command overrides -> events, outcome, error message
    ("guardrails_and_hooks_run_once_in_the_sdk_order",
     lambda g: {"input_guardrails": [g("in")], "output_guardrails": [g("out")]}, '{"n": 1}', {},
     [*RAN, "out:{'n': 1}:n=1", "on_tool_end:n=1"], ("succeeded", "applied", "n=1", False), None),
    ("input_rejection_skips_the_body_after_started",
     lambda g: {"input_guardrails": [g("in", REJECT)]}, '{"n": 1}', {},
     ["started", "in:{'n': 1}"], ("rejected", NOT_RUN, "no", False), None),
    ("input_tripwire_fails_the_turn", lambda g: {"input_guardrails": [g("in", TRIP)]},
     '{"n": 1}', {}, ["started", "in:{'n': 1}"], ("rejected", NOT_RUN, None, True), IN_TRIP),
    ("first_input_rejection_wins",
     lambda g: {"input_guardrails": [g("a"), g("b", REJECT), g("c", TRIP)]}, "{}", {},
     ["started", "a:{'n': 0}", "b:{'n': 0}"], ("rejected", NOT_RUN, "no", False), None),
    ("output_rejection_keeps_the_applied_effect",
     lambda g: {"output_guardrails": [g("out", REJECT), g("later", TRIP)]}, "{}", {},
     ["started", "on_tool_start", "body", "out:{'n': 0}:n=0", "on_tool_end:no"],
     ("rejected", "applied", "no", False), None),
    ("output_tripwire_fails_the_turn_after_the_body",
     lambda g: {"output_guardrails": [g("out", TRIP)]}, "{}", {},
     ["started", "on_tool_start", "body", "out:{'n': 0}:n=0"],
     ("rejected", "applied", None, True), OUT_TRIP),
    ("handled_failures_pass_output_guardrails_and_on_tool_end_as_in_the_sdk",
     lambda g: {"output_guardrails": [g("out")]}, '{"n": -1}', {},
     ["started", "on_tool_start", "body", f"out:{{'n': -1}}:{DEFAULT_ERROR}",
      f"on_tool_end:{DEFAULT_ERROR}"], MAYBE, None),
    ("guardrail_exception_fails_the_turn",
     lambda g: {"input_guardrails": [g("in", raises=RuntimeError("bug"))]}, "{}", {},
     ["started", "in:{'n': 0}"], FAILS, "Error running tool tool: bug"),
    ("guardrail_returning_no_result_fails_the_turn",
     lambda g: {"output_guardrails": [lambda ctx, args, out: True]}, "{}", {},
     ["started", "on_tool_start", "body"], ("failed", "applied", None, True), None),
    ("needs_approval_returns_pending_and_runs_nothing",
     lambda g: {"needs_approval": True, "input_guardrails": [g("in")]}, "{}", {}, [], PENDING,
     None),
    ("irreversible_tools_wait_for_approval_by_default", lambda g: {"effect": "irreversible"},
     "{}", {}, [], PENDING, None),
    ("approved_call_never_asks_again", lambda g: {"needs_approval": g("policy")}, '{"n": 9}',
     {"approved": True}, ["started", "on_tool_start", "body", "on_tool_end:n=9"],
     ("succeeded", "applied", "n=9", False), None),
    ("approval_policy_sees_validated_arguments", lambda g: {"needs_approval": g("policy")},
     '{"n": "9"}', {}, ["policy:{'n': 9}"], PENDING, None),
    ("approval_policy_saying_no_runs_the_tool", lambda g: {"needs_approval": g("policy")},
     '{"n": 1}', {}, ["policy:{'n': 1}", "started", "on_tool_start", "body", "on_tool_end:n=1"],
     ("succeeded", "applied", "n=1", False), None),
    ("unparseable_arguments_fail_closed", lambda g: {"needs_approval": g("policy")}, "{oops", {},
     [], PENDING, None),
    ("unparseable_arguments_after_approval_are_a_tool_error",
     lambda g: {"needs_approval": g("policy")}, "{oops", {"approved": True}, [], HANDLED, None),
    ("pre_approval_guardrails_need_the_flag",
     lambda g: {"needs_approval": True, "input_guardrails": [g("in", REJECT)]}, "{}", {}, [],
     PENDING, None),
    ("pre_approval_allow_leaves_the_call_pending",
     lambda g: {"needs_approval": True, "input_guardrails": [g("in")]}, "{}",
     {"pre_approval_guardrails": True}, ["in:{'n': 0}"], PENDING, None),
    ("pre_approval_rejection_decides_the_call",
     lambda g: {"needs_approval": True, "input_guardrails": [g("in", REJECT)]}, "{}",
     {"pre_approval_guardrails": True}, ["in:{'n': 0}"], ("rejected", NOT_RUN, "no", False), None),
    ("pre_approval_tripwire_fails_the_turn",
     lambda g: {"needs_approval": True, "input_guardrails": [g("in", TRIP)]}, "{}",
     {"pre_approval_guardrails": True}, ["in:{'n': 0}"], ("rejected", NOT_RUN, None, True),
     IN_TRIP),
]  # fmt: skip


@pytest.mark.parametrize("case", [pytest.param(case, id=case[0]) for case in ORDER])
async def test_order_table(case: tuple[Any, ...]) -> None:
    _, options, arguments, overrides, events, expected, message = case
    log = Log()
    out = await run(make(log.tool, **options(log.guardrail)), arguments, log, **overrides)
    assert log.events == events
    assert (out.status, out.effect, out.output, out.fails_turn) == expected
    assert message is None or (out.error is not None and out.error.message == message)
    assert (out.started_at is not None) == ("started" in events)


async def test_hook_exception_fails_the_turn_with_the_effect_so_far() -> None:
    class Broken(Log):
        async def on_tool_end(self, ctx: ToolContext, tool: Tool, output: str) -> None:
            raise RuntimeError("hook bug")

    out = await run(make(body), log=Broken())
    assert (out.status, out.effect, out.output, out.fails_turn) == ("failed", "applied", None, True)
    assert out.error is not None and out.error.message == "Error running tool tool: hook bug"


async def test_on_started_failure_propagates_and_nothing_runs() -> None:
    log = Log()

    async def refuse() -> None:
        raise ConfigurationError("ledger says no")

    with pytest.raises(ConfigurationError):
        await run_call(make(log.tool), command(), worker_id="w1", hooks=log, on_started=refuse)
    assert log.events == []


# --- the same texts as the OpenAI Agents SDK 0.24, by running it ----------------------------
set_tracing_disabled(True)


async def plain_body(action: str = "ok") -> Any:
    """The outcome-table tool without a context parameter, to wrap as an SDK function tool."""
    return await body(None, action)  # type: ignore[arg-type]


def sdk_tool(**options: Any) -> FunctionTool:
    return function_tool(plain_body, name_override="tool", **options)


async def sdk_output(tool: FunctionTool, arguments: str) -> Any:
    """What the SDK sends the model for one call, or the exception that failed its run."""
    calls = [[function_call("tool", arguments, call_id="c1")], [assistant_message("done")]]
    agent = Agent(name="a", model=ScriptedModel(calls), tools=[tool])
    try:
        result = await Runner.run(agent, "go")
    except Exception as exc:
        return exc
    items = [item for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    return items[0].raw_item["output"]  # type: ignore[index]


@pytest.mark.parametrize(
    "arguments",
    [do("ok"), do("dict"), do("raise"), do("cancel"), do("own_timeout"), do("sleep"), "{oops",
     "[1]", '{"action": 1}'],
)  # fmt: skip
async def test_model_visible_texts_match_the_sdk(arguments: str) -> None:
    ours = await run(make(body, timeout=0.05), arguments)
    assert ours.output == await sdk_output(sdk_tool(timeout=0.05), arguments)


@pytest.mark.parametrize(
    ("arguments", "options"),
    [(do("raise"), NO_HANDLER), ("{oops", NO_HANDLER), ('{"action": 1}', NO_HANDLER),
     ("[1]", NO_HANDLER), (do("sleep"), {"timeout": 0.05, "timeout_behavior": "raise_exception"})],
)  # fmt: skip
async def test_turn_failure_messages_match_the_sdk(
    arguments: str, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK leaves the raw input out of "Invalid JSON input" unless tool data may be logged;
    # toolfleet always keeps it (the arguments are on the command topic already).
    monkeypatch.setattr(sdk_debug, "DONT_LOG_TOOL_DATA", False)
    error = await sdk_output(sdk_tool(**options), arguments)
    assert isinstance(error, Exception)
    ours = await run(make(body, **options), arguments)
    assert ours.fails_turn and ours.error is not None
    assert ours.error.message == str(error)
    if not arguments.startswith(do("raise")):  # the SDK wraps a tool's own error in UserError
        assert ours.error.type == type(error).__name__


async def test_tripwire_messages_follow_the_sdk_template() -> None:
    @tool_input_guardrail
    def block(data: Any) -> ToolGuardrailFunctionOutput:
        return ToolGuardrailFunctionOutput.raise_exception()

    error = await sdk_output(sdk_tool(tool_input_guardrails=[block]), do("ok"))
    # The SDK names the guardrail's class, always ToolInputGuardrail; toolfleet its name.
    assert str(error) == "Tool input guardrail ToolInputGuardrail triggered tripwire"
    assert type(error).__name__ == "ToolInputGuardrailTripwireTriggered"
    log = Log()
    ours = await run(make(body, input_guardrails=[log.guardrail("block", TRIP)]), do("ok"), log)
    assert ours.error is not None
    assert ours.error.message == "Tool input guardrail block triggered tripwire"
    assert ours.error.type == type(error).__name__


def test_sync_tool_timeouts_are_refused_as_in_the_sdk() -> None:
    with pytest.raises(ValueError, match="only supported for async"):
        function_tool(do, timeout=1.0)
    with pytest.raises(ConfigurationError, match="only supported for async"):
        make(do, timeout=1.0)


async def test_an_output_guardrail_that_finds_the_effect_wrong_hands_it_to_the_reconciler() -> None:
    def check(ctx: ToolContext, args: dict[str, Any], output: Any) -> GuardrailResult:
        return GuardrailResult.wrong_effect("The booking went to the wrong date.")

    out = await run(make(body, output_guardrails=[check]), do("ok"))
    assert (out.status, out.effect, out.output) == (
        "rejected", "wrong_effect", "The booking went to the wrong date.",
    )  # fmt: skip
    assert not out.resolved  # the reconciler asks for the compensation's approval

    def confused(ctx: ToolContext, args: dict[str, Any]) -> GuardrailResult:
        return GuardrailResult.wrong_effect("nothing ran yet")

    failed = await run(make(body, input_guardrails=[confused]), do("ok"))
    assert failed.fails_turn and "only output guardrails" in (
        failed.error.message if failed.error else ""
    )


async def test_the_outcome_reports_every_guardrail_verdict_with_its_output_info() -> None:
    class Opaque:
        def __str__(self) -> str:
            return "opaque detail"

    def first(ctx: ToolContext, args: dict[str, Any]) -> GuardrailResult:
        return GuardrailResult.allow({"checked": ["a", 1]})

    def second(ctx: ToolContext, args: dict[str, Any]) -> GuardrailResult:
        return GuardrailResult.allow(Opaque())

    def screen(ctx: ToolContext, args: dict[str, Any], output: Any) -> GuardrailResult:
        return GuardrailResult.reject_content("withheld", output_info=7)

    out = await run(
        make(body, input_guardrails=[first, second], output_guardrails=[screen]), do("ok")
    )
    assert [
        (v.kind, v.index, v.name, v.behavior, v.message, v.output_info) for v in out.guardrails
    ] == [
        ("input", 0, "first", "allow", None, {"checked": ["a", 1]}),
        ("input", 1, "second", "allow", None, "opaque detail"),  # the wire is JSON
        ("output", 0, "screen", "reject_content", "withheld", 7),
    ]
    assert CallOutcome.decode(out.encode()).guardrails == out.guardrails

    def trip(ctx: ToolContext, args: dict[str, Any]) -> GuardrailResult:
        return GuardrailResult.raise_exception("why it tripped")

    tripped = await run(make(body, input_guardrails=[first, trip]), do("ok"))
    assert tripped.fails_turn
    assert [(v.name, v.behavior, v.output_info) for v in tripped.guardrails] == [
        ("first", "allow", {"checked": ["a", 1]}),
        ("trip", "raise_exception", "why it tripped"),
    ]


async def test_the_outcome_carries_a_returned_object_as_json_beside_its_text() -> None:
    class Opaque:
        def __str__(self) -> str:
            return "opaque"

    returns: dict[str, Any] = {
        "mapping": {"ticket": {"status": "created"}},
        "text": "plain",
        "opaque": Opaque(),
    }

    async def give(ctx: ToolContext, kind: str) -> Any:
        return returns[kind]

    def screen(ctx: ToolContext, args: dict[str, Any], output: Any) -> GuardrailResult:
        return GuardrailResult.reject_content("withheld")

    mapping = await run(make(give), json.dumps({"kind": "mapping"}))
    assert mapping.output == "{'ticket': {'status': 'created'}}"  # what the model sees
    assert json.loads(mapping.value or "") == {"ticket": {"status": "created"}}
    assert (await run(make(give), json.dumps({"kind": "text"}))).value is None
    assert (await run(make(give), json.dumps({"kind": "opaque"}))).value is None
    # A rejection replaced the output: nothing of the object goes to the application.
    rejected = await run(make(give, output_guardrails=[screen]), json.dumps({"kind": "mapping"}))
    assert (rejected.output, rejected.value) == ("withheld", None)


async def test_an_exception_whose_text_cannot_be_made_still_becomes_an_outcome() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise AssertionError("the exception's text must not be needed")

    async def fails(ctx: ToolContext) -> str:
        raise Unprintable

    handled = await run(make(fails, failure_error_function=lambda ctx, exc: "It failed."), "{}")
    assert (handled.status, handled.output) == ("failed", "It failed.")
    assert handled.error is not None and handled.error.type == "Unprintable"
    unhandled = await run(make(fails, failure_error_function=None), "{}")
    assert unhandled.fails_turn and unhandled.error is not None
    assert unhandled.error.message == ("Error running tool tool: <Unprintable: str() failed>")
