"""A tool's exception: logged once per call with its traceback (rate-limited per tool, the
call's argument values redacted), and handed to the worker to keep with the call."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest

from executors import NotExecuted, Tool, ToolFailure, ToolRegistry, run_call
from kernel.tools._failures import TRACEBACK_MAX_BYTES, FailureLog
from schemas import ExecutionCommand


def command(arguments: dict[str, Any], **overrides: Any) -> ExecutionCommand:
    fields: dict[str, Any] = {
        "tenant_id": "t1", "run_id": "r1", "turn_id": 0, "call_id": "call_1",
        "tool_name": "lookup", "arguments": json.dumps(arguments), "index": 0,
        "pool": "default", "attempt": 2, "fencing_token": 1, "idempotency_key": "idem",
        "fingerprint": "fp", "issued_at": time.time(),
    }  # fmt: skip
    return ExecutionCommand(**(fields | overrides))


def make(func: Any, **options: Any) -> Tool:
    options.setdefault("unattended", "a unit test of the runner's failure records")
    return ToolRegistry().tool(name="lookup", effect="read_only", **options)(func)


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_the_failure_record_keeps_type_message_and_traceback_without_argument_values() -> None:
    arguments = {"city": "Lisbon-7731", "who": {"email": "ana@example.org"}, "n": 12345}
    exc = _raised(ValueError("no weather for Lisbon-7731 (asked by 'ana@example.org')"))
    failure = ToolFailure.of(exc, arguments)
    assert failure.type == "ValueError"
    assert failure.message == "no weather for <argument> (asked by '<argument>')"
    assert failure.traceback.startswith("Traceback (most recent call last):")
    assert "ValueError: no weather for <argument>" in failure.traceback
    assert "Lisbon-7731" not in failure.traceback and "ana@example.org" not in failure.traceback
    assert "line " in failure.traceback  # numbers are left alone (line numbers stay readable)


def test_a_long_traceback_is_cut_to_its_head_and_its_tail() -> None:
    error: BaseException | None = None
    for step in range(200):  # a chain of 200 exceptions, each raised handling the one before
        try:
            raise RuntimeError("at the bottom" if step == 199 else f"step {step}") from error
        except RuntimeError as raised:
            error = raised
    assert error is not None
    failure = ToolFailure.of(error)
    assert len(failure.traceback.encode()) <= TRACEBACK_MAX_BYTES
    assert failure.traceback.startswith("Traceback (most recent call last):")
    assert failure.traceback.rstrip().endswith("RuntimeError: at the bottom")
    assert "bytes cut ..." in failure.traceback


def test_a_tool_failing_on_many_calls_logs_a_few_tracebacks_then_how_many_more(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [1000.0]
    failures = FailureLog(logging.getLogger("test.tool_failures"), limit=3, window_s=60.0,
                          clock=lambda: now[0])  # fmt: skip
    caplog.set_level(logging.INFO, logger="test.tool_failures")
    for i in range(59):
        exc = _raised(ValueError(f"bad input {i}"))
        failures.report("lookup", ToolFailure.of(exc), exc)
        now[0] += 0.5  # 59 calls within 30 s: one window
    failures.report("other", ToolFailure.of(_raised(KeyError("k"))), KeyError("k"))
    lines = [r for r in caplog.records if r.name == "test.tool_failures"]
    tracebacks = [r for r in lines if r.exc_text]
    assert [r.getMessage() for r in tracebacks] == [
        "tool lookup raised ValueError: bad input 0",
        "tool lookup raised ValueError: bad input 1",
        "tool lookup raised ValueError: bad input 2",
        "tool other raised KeyError: 'k'",  # each tool has its own allowance
    ]
    assert all((r.exc_text or "").startswith("Traceback (most recent call last)") for r in lines)
    now[0] += 60  # the window is over: the next failure opens a new one, after the summary
    exc = _raised(ValueError("later"))
    failures.report("lookup", ToolFailure.of(exc), exc)
    summary, later = [r.getMessage() for r in caplog.records if r.name == "test.tool_failures"][4:]
    assert summary.startswith("tool lookup raised 56 more times within 60 s (ValueError x56)")
    assert later == "tool lookup raised ValueError: later"


def test_not_executed_is_logged_as_a_warning_the_rest_as_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures = FailureLog(logging.getLogger("test.levels"))
    caplog.set_level(logging.INFO, logger="test.levels")
    for exc in (_raised(NotExecuted("upstream busy", retryable=True)), _raised(OSError("x"))):
        failures.report("lookup", ToolFailure.of(exc), exc)
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.ERROR]


async def test_run_call_logs_what_the_body_raised_and_hands_it_to_the_worker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def lookup(city: str) -> str:
        raise ValueError(f"unknown city {city}")

    kept: list[ToolFailure] = []
    caplog.set_level(logging.INFO, logger="kernel.tools")
    outcome = await run_call(
        make(lookup), command({"city": "Atlantis-42"}), worker_id="w", on_failure=kept.append
    )
    assert (outcome.status, outcome.error and outcome.error.type) == ("failed", "ValueError")
    (failure,) = kept
    assert (failure.type, failure.message) == ("ValueError", "unknown city <argument>")
    (line,) = [r for r in caplog.records if r.name == "kernel.tools"]
    assert line.getMessage() == "tool lookup raised ValueError: unknown city <argument>"
    assert line.exc_text == failure.traceback and "in lookup" in failure.traceback
    assert "Atlantis-42" not in caplog.text


async def test_a_failing_guardrail_is_user_code_too(caplog: pytest.LogCaptureFixture) -> None:
    def screen(ctx: Any, args: Any) -> Any:
        raise RuntimeError("guardrail bug")

    kept: list[ToolFailure] = []
    caplog.set_level(logging.INFO, logger="kernel.tools")
    outcome = await run_call(
        make(lambda city: city, input_guardrails=[screen]),
        command({"city": "Porto"}),
        worker_id="w",
        on_failure=kept.append,
    )
    assert outcome.fails_turn
    assert [f.type for f in kept] == ["RuntimeError"]
    assert "guardrail bug" in caplog.text


async def test_a_call_that_succeeds_reports_nothing(caplog: pytest.LogCaptureFixture) -> None:
    kept: list[ToolFailure] = []
    caplog.set_level(logging.INFO, logger="kernel.tools")
    outcome = await run_call(
        make(lambda city: city), command({"city": "Faro"}), worker_id="w", on_failure=kept.append
    )
    assert outcome.status == "succeeded" and kept == [] and not caplog.records
