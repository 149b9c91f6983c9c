"""The public tool API: declaring tools, their schema and registry entry, how they are called,
and their probe and compensate actions."""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field

from executors import (
    GuardrailResult,
    ProbeResult,
    Tool,
    ToolContext,
    ToolRegistry,
    default_tool_error_function,
    guardrail_name,
    run_call,
    run_compensate,
    run_probe,
)
from kernel.errors import (
    ConfigurationError,
    InvalidMessageError,
    ModelBehaviorError,
    ToolNotFoundError,
)
from schemas import CallOutcome, ExecutionCommand, ToolSpec


class Address(BaseModel):
    """A nested argument type, to check that pydantic models work as parameters."""

    city: str
    zip_code: str


def _tool(func: Callable[..., Any], **options: Any) -> Tool:
    return ToolRegistry().tool(**options)(func)


def _unattended(func: Callable[..., Any], **options: Any) -> Tool:
    """A tool for tests of how calls run, not of the release gate."""
    return _tool(func, unattended="a unit test of how calls run", **options)


async def _noop() -> str:
    return ""


def _command(arguments: str = "{}", **overrides: Any) -> ExecutionCommand:
    fields: dict[str, Any] = {
        "tenant_id": "t1", "run_id": "r1", "turn_id": 2, "call_id": "call_1",
        "tool_name": "tool", "arguments": arguments, "index": 0, "pool": "default",
        "attempt": 2, "fencing_token": 7, "idempotency_key": "idem-1", "fingerprint": "fp",
        "issued_at": time.time(),
    }  # fmt: skip
    return ExecutionCommand(**(fields | overrides))


async def _run(tool: Tool, arguments: str = "{}") -> CallOutcome:
    return await run_call(tool, _command(arguments), worker_id="w1")


# --- declaring ------------------------------------------------------------------------------
def test_decorator_works_with_options_and_bare() -> None:
    tools = ToolRegistry()

    @tools.tool(effect="idempotent", timeout=5.0, needs_approval=True)
    async def create_ticket(ctx: ToolContext, title: str, priority: int = 3) -> str:
        return title

    @tools.tool
    async def lookup(city: str) -> str:
        """Find a city.

        The description is the docstring.
        """
        return city

    assert isinstance(create_ticket, Tool) and tools.get("create_ticket") is create_ticket
    assert (create_ticket.effect, create_ticket.timeout, create_ticket.needs_approval) == (
        "idempotent", 5.0, True,
    )  # fmt: skip
    assert (lookup.name, lookup.version, lookup.effect, lookup.timeout, lookup.pool) == (
        "lookup", "1", "non_idempotent", None, None,
    )  # fmt: skip
    assert (lookup.timeout_behavior, lookup.is_enabled) == ("error_as_result", True)
    assert lookup.failure_error_function is default_tool_error_function
    assert (create_ticket.takes_context, lookup.takes_context) == (True, False)
    assert (lookup.description, create_ticket.description) == (
        "Find a city.\n\nThe description is the docstring.", "",
    )  # fmt: skip
    assert _tool(lookup.func, description="custom").description == "custom"


def test_registry_looks_up_name_or_namespace_dot_name_and_refuses_duplicates() -> None:
    tools = ToolRegistry()
    plain = tools.tool(name="search")(_noop)
    scoped = tools.tool(name="search", namespace="crm")(_noop)
    assert (plain.lookup_key, scoped.lookup_key) == ("search", "crm.search")
    assert tools.get("crm.search") is scoped and "search" in tools and len(tools) == 2
    assert list(tools) == [plain, scoped]
    with pytest.raises(ConfigurationError, match="declared twice"):
        tools.tool(name="search")(_noop)
    with pytest.raises(ToolNotFoundError, match=r"^Tool 'missing' not found\.$"):
        tools.get("missing")
    assert tools.find("missing") is None


NAME_RULE = "must be 1-64 characters of letters, digits, '_' or '-'"
INVALID_OPTIONS = [
    ({"name": ""}, NAME_RULE), ({"name": "has space"}, NAME_RULE),
    ({"name": "dotted.name"}, NAME_RULE), ({"name": "x" * 65}, NAME_RULE),
    ({"namespace": "a.b"}, NAME_RULE), ({"version": ""}, "version must be a non-empty string"),
    ({"timeout": 0}, "greater than 0"), ({"timeout": -1.0}, "greater than 0"),
    ({"timeout": math.inf}, "finite"), ({"timeout": math.nan}, "finite"),
    ({"timeout": True}, "positive number in seconds"), ({"timeout": "5"}, "positive number"),
    ({"effect": "sometimes"}, "effect must be one of"),
    ({"timeout_behavior": "ignore"}, "timeout_behavior must be one of"),
    ({"timeout_error_function": "text"}, "timeout_error_function must be callable"),
    ({"failure_error_function": 42}, "failure_error_function must be callable"),
    ({"needs_approval": "yes"}, "needs_approval must be a bool or a callable"),
    ({"input_guardrails": [1]}, "input_guardrails must be a list"),
    ({"on_unknown": "later"}, "on_unknown must be one of"), ({"pool": ""}, "pool must be"),
]  # fmt: skip


@pytest.mark.parametrize(("options", "message"), INVALID_OPTIONS)
def test_invalid_options_are_configuration_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        _tool(_noop, **options)


def test_defaults_that_depend_on_the_effect_class() -> None:
    # on_unknown: report_now only for read_only.
    assert (_tool(_noop, effect="read_only").on_unknown, _tool(_noop).on_unknown) == (
        "report_now", "reconcile_then_report",
    )  # fmt: skip
    assert _tool(_noop, timeout=2).timeout == 2.0  # seconds, as a float


def test_the_release_gate_asks_a_human_unless_the_effect_can_be_established() -> None:
    # irreversible: always asks, probe or not; only an explicit needs_approval=False opts out.
    assert _tool(_noop, effect="irreversible").needs_approval is True
    assert _tool(_noop, effect="irreversible", unattended="why").needs_approval is True
    assert _tool(_noop, effect="irreversible", needs_approval=False).needs_approval is False
    # non_idempotent (also the default): asks until a probe is declared (after the decorator).
    gated = _tool(_noop)
    assert (gated.needs_approval, gated.spec("p").needs_approval) == (True, "always")
    gated.probe(_probe_applied)
    assert (gated.needs_approval, gated.spec("p").needs_approval) == (False, "never")
    # An opt-out records why; it is published with the spec.
    opted = _tool(_noop, unattended="notifications are harmless to repeat")
    assert opted.needs_approval is False
    assert opted.spec("p").unattended_reason == "notifications are harmless to repeat"
    with pytest.raises(ConfigurationError, match="unattended must say why"):
        _tool(_noop, unattended=" ")
    # Replay-safe classes never ask by default.
    assert _tool(_noop, effect="read_only").needs_approval is False
    assert _tool(_noop, effect="idempotent").needs_approval is False


def test_context_is_the_first_parameter_by_annotation_or_by_name() -> None:
    async def annotated(context: ToolContext, x: int) -> int:
        return x

    async def named(ctx, x: int) -> int:  # type: ignore[no-untyped-def]
        return x

    async def with_extras(c: Annotated[ToolContext, "meta"], x: int) -> int:
        return x

    async def late(x: int, ctx: ToolContext) -> int:
        return x

    async def star(*values: int) -> int:
        return sum(values)

    with pytest.raises(ConfigurationError, match="ToolContext must be the first parameter"):
        _tool(late)
    with pytest.raises(ConfigurationError, match=r"\*args and \*\*kwargs"):
        _tool(star)
    for func in (annotated, named, with_extras):
        tool = _tool(func)
        assert tool.takes_context and list(tool.parameters_schema["properties"]) == ["x"]


# --- arguments and the published schema -----------------------------------------------------
async def _book(
    ctx: ToolContext,
    address: Address,
    nights: Annotated[int, Field(ge=1, description="How many nights.")] = 1,
    note: str | None = None,
) -> str:
    return ""


def test_parameters_publish_a_json_schema_from_the_signature() -> None:
    schema = _tool(_book).parameters_schema
    assert (schema["type"], schema["required"], schema["additionalProperties"]) == (
        "object", ["address"], False,
    )  # fmt: skip
    assert schema["properties"]["nights"]["minimum"] == 1
    assert schema["properties"]["nights"]["description"] == "How many nights."
    assert "Address" in schema["$defs"]


def test_parse_arguments_validates_with_pydantic_lax_defaults() -> None:
    tool = _tool(_book)
    args = tool.parse_arguments('{"address": {"city": "Oslo", "zip_code": "0150"}, "nights": "2"}')
    assert args == {"address": Address(city="Oslo", zip_code="0150"), "nights": 2, "note": None}
    assert _tool(_noop).parse_arguments("") == {}  # empty arguments mean no arguments


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{oops", r"^Invalid JSON input for tool _book: \{oops$"),
        ("[1]", "^Invalid JSON input for tool _book: expected a JSON object$"),
        ('{"address": 1}', "^Invalid JSON input for tool _book: 1 validation error for _book_args"),
        ('{"address": {"city": "A", "zip_code": "1"}, "dry_run": 1}', "Extra inputs"),
    ],
)
def test_parse_arguments_errors_are_worded_as_the_sdk_words_them(raw: str, message: str) -> None:
    with pytest.raises(ModelBehaviorError, match=message):
        _tool(_book).parse_arguments(raw)


@pytest.mark.parametrize("raw", ["", "  ", "{bad", "[]", '{"n": NaN}', '{"n": "x"}'])
def test_approval_parsing_refuses_anything_uncertain(raw: str) -> None:
    async def count(n: float) -> float:
        return n

    assert _tool(count).parse_arguments_for_approval(raw) is None
    assert _tool(count).parse_arguments_for_approval('{"n": 3}') == {"n": 3.0}


# --- registry entries -----------------------------------------------------------------------
def test_spec_describes_the_tool_for_the_registry_of_a_pool() -> None:
    def policy(ctx: ToolContext, args: dict[str, Any]) -> bool:
        return True

    tools = ToolRegistry()

    @tools.tool(namespace="crm", version="2", effect="idempotent", timeout=1.5, needs_approval=True)
    async def upsert(ctx: ToolContext, key: str) -> str:
        """Upsert a record."""
        return key

    upsert.probe(_probe_applied)
    assert upsert.spec("default") == ToolSpec(
        name="upsert", namespace="crm", version="2", pool="default", description="Upsert a record.",
        parameters=upsert.parameters_schema, effect_class="idempotent", needs_approval="always",
        on_unknown="reconcile_then_report", timeout_s=1.5, enabled=True, has_probe=True,
        has_compensate=False,
    )  # fmt: skip
    assert _unattended(_noop).spec("p").needs_approval == "never"
    assert _tool(_noop, needs_approval=policy).spec("p").needs_approval == "callable"
    # A tool pinned to a pool publishes that pool, and only workers of that pool serve it.
    tools.tool(name="gpu_only", pool="gpu")(_noop)
    assert [(s.name, s.pool) for s in tools.specs("gpu")] == [
        ("upsert", "gpu"),
        ("gpu_only", "gpu"),
    ]
    assert [s.name for s in tools.specs("default")] == ["upsert"]


# --- how a declared tool is called ----------------------------------------------------------
async def test_tool_context_carries_the_call_identity_and_validated_args() -> None:
    seen: list[ToolContext] = []

    async def spy(ctx: ToolContext, n: int) -> str:
        seen.append(ctx)
        return "ok"

    await _run(_unattended(spy, name="tool"), '{"n": "5"}')
    assert seen == [
        ToolContext("t1", "r1", 2, "call_1", "tool", '{"n": "5"}', "idem-1", 2, 7, {"n": 5}, "w1")
    ]


async def test_sync_tool_runs_in_a_worker_thread_without_context() -> None:
    def where(a: int) -> str:
        return f"{a}:{threading.get_ident()}"

    out = await _run(_unattended(where), '{"a": 1}')
    assert out.output is not None and out.output.startswith("1:")
    assert out.output != f"1:{threading.get_ident()}"
    assert _tool(where)(2).startswith("2:")  # calling the Tool calls the function itself


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, GeneratorExit])
async def test_base_exception_in_a_sync_tool_thread_is_captured(exc: type[BaseException]) -> None:
    def sync_body() -> str:
        raise exc("stop")

    out = await _run(_unattended(sync_body))
    assert out.fails_turn and out.error is not None and out.error.severity == "base_exception"


async def test_timed_out_tool_has_unwound_before_run_call_returns() -> None:
    cleaned = asyncio.Event()

    async def stuck() -> str:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()
        return ""

    await _run(_unattended(stuck, timeout=0.05))
    assert cleaned.is_set()


@pytest.mark.parametrize("is_async", [False, True])
async def test_failure_and_timeout_formatters_may_be_sync_or_async(is_async: bool) -> None:
    def words(ctx: ToolContext, exc: Exception) -> str:
        return f"{ctx.call_id} {type(exc).__name__}: {exc}"

    async def async_words(ctx: ToolContext, exc: Exception) -> str:
        return words(ctx, exc)

    async def fails(sleep: bool = False) -> str:
        if sleep:
            await asyncio.sleep(30)  # wait-ok: outlives its timeout on purpose
        raise ValueError("detail")

    fmt = async_words if is_async else words
    tool = _unattended(fails, timeout=0.05, failure_error_function=fmt, timeout_error_function=fmt)
    assert (await _run(tool)).output == "call_1 ValueError: detail"
    timed_out = await _run(tool, '{"sleep": true}')
    assert timed_out.output == "call_1 ToolTimeoutError: Tool 'fails' timed out after 0.05 seconds."


# --- probe and compensate -------------------------------------------------------------------
async def _probe_applied(ctx: ToolContext) -> ProbeResult:
    return ProbeResult.applied(f"ticket for {ctx.idempotency_key}")


def test_probe_and_compensate_register_once_and_keep_the_function() -> None:
    tool = _tool(_noop)

    async def compensate(ctx: ToolContext, original_output: str) -> str:
        return "undone"

    assert tool.probe(_probe_applied) is _probe_applied and tool.probe_function is _probe_applied
    assert tool.compensate(compensate) is compensate and tool.compensate_function is compensate
    with pytest.raises(ConfigurationError, match="already declares a probe"):
        tool.probe(_probe_applied)
    with pytest.raises(ConfigurationError, match="already declares a compensate"):
        tool.compensate(compensate)


async def _probe_sleeps(ctx: ToolContext) -> ProbeResult:
    await asyncio.sleep(30)  # wait-ok: outlives its timeout on purpose
    return ProbeResult.not_applied()


@pytest.mark.parametrize(
    ("probe", "expected"),
    [
        (_probe_applied, ProbeResult.applied("ticket for idem-1")),  # async, by idempotency key
        (lambda ctx: ProbeResult.not_applied(), ProbeResult.not_applied()),  # sync, in a thread
        (None, "declares no probe"),
        (lambda ctx: 1 / 0, "probe raised ZeroDivisionError: division by zero"),
        (_probe_sleeps, "probe timed out after 0.05 seconds"),
        (lambda ctx: "yes", "probe returned str"),
    ],
)
async def test_probe_answers_and_its_failures_answer_unknown(probe: Any, expected: Any) -> None:
    tool = _tool(_noop, timeout=0.05)
    if probe is not None:
        tool.probe(probe)
    result = await run_probe(tool, _command())
    if isinstance(expected, ProbeResult):
        assert result == expected
    else:  # what went wrong, for the audit chain
        assert result.state == "unknown" and expected in (result.detail or "")


async def test_compensate_gets_the_original_output() -> None:
    tool = _tool(_noop)

    @tool.compensate
    async def _(ctx: ToolContext, original_output: str) -> str:
        return f"cancelled {original_output} ({ctx.idempotency_key})"

    out = await run_compensate(tool, _command(kind="compensate", original_output="T-1"))
    assert out == "cancelled T-1 (idem-1)"
    with pytest.raises(InvalidMessageError, match="without original_output"):
        await run_compensate(tool, _command(kind="compensate"))
    with pytest.raises(ConfigurationError, match="declares no compensate"):
        await run_compensate(_tool(_noop), _command(kind="compensate", original_output="T-1"))


def test_result_helpers_and_guardrail_names() -> None:
    assert ProbeResult.applied("T-1") == ProbeResult(state="applied", output="T-1")
    assert ProbeResult.not_applied().state == "not_applied"
    assert ProbeResult.unknown("down") == ProbeResult(state="unknown", detail="down")
    assert GuardrailResult.allow().behavior == "allow"
    assert GuardrailResult.reject_content("no", output_info=7) == GuardrailResult(
        behavior="reject_content", message="no", output_info=7
    )
    assert GuardrailResult.raise_exception().behavior == "raise_exception"

    class Named:
        name = "pii_filter"

    # A tripwire names the guardrail: its name attribute, else __name__, else its class.
    assert (guardrail_name(Named()), guardrail_name(_noop), guardrail_name(object())) == (
        "pii_filter", "_noop", "object",
    )  # fmt: skip
