"""pytest plugin loaded into the Agents SDK's own test session (``-p sdk_suite_record``).

It records, for every test, one JSON line in ``$SDK_SUITE_REPORT``: its outcome, the exception
that decided it (type, message, pytest's crash line) and how often it called the runner:

- ``runner``: calls of ``agents.Runner.run / run_streamed / run_sync`` (the public runner, the
  one the fleet run routes through FleetRunner);
- ``agent_runner``: calls of ``AgentRunner.run / run_streamed / run_sync`` made outside any
  ``Runner`` call (a test driving the SDK's agent runner directly; nested agent-tool runs
  happen inside a Runner call and are not counted);
- ``tool_invocations``: function tools (agents as tools aside) the runner invoked, counted at
  the SDK's one invocation point (on FleetRunner, what it sent to the fleet).

``$SDK_SUITE_SELECTION``, when set, names a file of node ids: only those tests run (the others
are deselected), so odd characters in parametrized ids never go through a command line.
``$SDK_SUITE_APPEND`` keeps the record's earlier lines (a session resumed after a crash).
Async tests are cancelled after ``$SDK_SUITE_TEST_LIMIT`` seconds (60 by default).

This module runs inside the SDK's test process, where ``tests`` is the SDK's package: it
imports nothing of toolfleet's test tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_IN_RUNNER: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "sdk_suite_in_runner", default=False
)
_counts: dict[str, int] = {"runner": 0, "agent_runner": 0, "tool_invocations": 0}
_results: dict[str, dict[str, Any]] = {}
_report_path = os.environ.get("SDK_SUITE_REPORT")
_TEST_LIMIT = float(os.environ.get("SDK_SUITE_TEST_LIMIT", "60"))
_RUNNER_METHODS = ("run", "run_streamed", "run_sync")


def _count(kind: str) -> None:
    # Counted before the call: a test whose run raises still called the runner.
    if kind == "runner" or not _IN_RUNNER.get():
        _counts[kind] += 1


def _counting(kind: str, method: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def counted_async(*args: Any, **kwargs: Any) -> Any:
            _count(kind)
            token = _IN_RUNNER.set(True)
            try:
                return await method(*args, **kwargs)
            finally:
                _IN_RUNNER.reset(token)

        counted_async.__sdk_suite_counted__ = True  # type: ignore[attr-defined]
        return counted_async

    @functools.wraps(method)
    def counted(*args: Any, **kwargs: Any) -> Any:
        _count(kind)
        token = _IN_RUNNER.set(True)
        try:
            # The tasks a streamed run creates copy this context, so nested runs they start
            # are seen as inside this call.
            return method(*args, **kwargs)
        finally:
            _IN_RUNNER.reset(token)

    counted.__sdk_suite_counted__ = True  # type: ignore[attr-defined]
    return counted


def _counting_invocations(invoke: Callable[..., Any]) -> Callable[..., Any]:
    from agents.tool import ToolOriginType

    @functools.wraps(invoke)
    async def counted(*args: Any, **kwargs: Any) -> Any:
        tool = kwargs.get("function_tool")
        origin = getattr(tool, "_tool_origin", None)
        agent_tool = getattr(origin, "type", None) == ToolOriginType.AGENT_AS_TOOL
        if not agent_tool and getattr(tool, "_agent_instance", None) is None:
            _counts["tool_invocations"] += 1
        return await invoke(*args, **kwargs)

    counted.__sdk_suite_counted__ = True  # type: ignore[attr-defined]
    return counted


def annotate(**fields: Any) -> None:
    """Add fields to the running test's line (the fleet plugin's own counts)."""
    for entry in _results.values():
        entry.update(fields)


def install_counters() -> None:
    """Wrap the runner entry points and the SDK's one invocation point of a function tool
    (once, after the fleet plugin routed ``Runner`` and toolfleet routed that point)."""
    from agents.run import AgentRunner, Runner
    from agents.run_internal import tool_execution

    invoke = tool_execution._invoke_function_tool_with_metadata
    if not getattr(invoke, "__sdk_suite_counted__", False):
        tool_execution._invoke_function_tool_with_metadata = _counting_invocations(invoke)

    for name in _RUNNER_METHODS:
        original = Runner.__dict__[name]
        function = original.__func__ if isinstance(original, classmethod) else original
        if not getattr(function, "__sdk_suite_counted__", False):
            setattr(Runner, name, classmethod(_counting("runner", function)))
        method = AgentRunner.__dict__[name]
        if not getattr(method, "__sdk_suite_counted__", False):
            setattr(AgentRunner, name, _counting("agent_runner", method))


@pytest.hookimpl(trylast=True)  # after the fleet plugin's routes: the counters wrap them
def pytest_configure(config: pytest.Config) -> None:
    install_counters()
    if _report_path and not os.environ.get("SDK_SUITE_APPEND"):
        Path(_report_path).write_text("")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    selection = os.environ.get("SDK_SUITE_SELECTION")
    if not selection:
        return
    wanted = {line.strip() for line in Path(selection).read_text().splitlines() if line.strip()}
    kept = [item for item in items if item.nodeid in wanted]
    dropped = [item for item in items if item.nodeid not in wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


class TestTimeLimit(Exception):
    """An async test ran past ``SDK_SUITE_TEST_LIMIT`` seconds and was cancelled."""


def _limited(test: Callable[..., Any]) -> Callable[..., Any]:
    """``test`` (a coroutine function) cancelled after ``_TEST_LIMIT`` seconds.

    pytest-timeout's signal interrupts whatever code runs when it fires: on an event loop
    that is often a task of its own (a fleet service's), not the test, which then never ends.
    Cancelling the test's own coroutine ends the test, and leaves the loop and its other tasks
    alone (pytest-timeout stays as a backstop for sync tests).
    """

    @functools.wraps(test)
    async def limited(*args: Any, **kwargs: Any) -> Any:
        async with asyncio.timeout(_TEST_LIMIT) as limit:
            try:
                return await test(*args, **kwargs)
            except TimeoutError:
                if limit.expired():
                    raise TestTimeLimit(
                        f"the test did not finish within {_TEST_LIMIT:.0f} s and was cancelled"
                    ) from None
                raise

    return limited


def pytest_runtest_setup(item: pytest.Item) -> None:
    test = getattr(item, "obj", None)
    if inspect.iscoroutinefunction(test) and not getattr(test, "__sdk_suite_limited__", False):
        limited = _limited(test)
        limited.__sdk_suite_limited__ = True  # type: ignore[attr-defined]
        item.obj = limited  # type: ignore[attr-defined]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _counts.update(runner=0, agent_runner=0, tool_invocations=0)
    started = time.monotonic()
    # A line first that says the test died with the session: the test's own line replaces it
    # (the last line of a node id counts), unless the session dies during the test.
    _write(
        {
            "nodeid": item.nodeid,
            "outcome": "crashed",
            "exc_type": "SessionCrash",
            "exc_message": "the pytest session died during this test (see the session's log)",
        }
    )
    _results[item.nodeid] = {"nodeid": item.nodeid, "outcome": "passed"}
    try:
        return (yield)
    finally:
        entry = _results.pop(item.nodeid)
        entry.update(_counts, seconds=round(time.monotonic() - started, 3))
        _write(entry)


def _write(entry: dict[str, Any]) -> None:
    if _report_path:
        with open(_report_path, "a") as out:
            out.write(json.dumps(entry) + "\n")


def _describe(value: BaseException) -> tuple[str, str]:
    kind = type(value)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
    try:
        message = str(value)
    except BaseException as exc:  # an exception whose str() raises (the SDK tests one)
        message = f"<str() raised {type(exc).__name__}>"
    return name, message[:500]


def _where(item: pytest.Item, report: pytest.TestReport) -> str:
    """The last line of the test's own files in the failure's traceback (path:line)."""
    entries = getattr(getattr(report.longrepr, "reprtraceback", None), "reprentries", [])
    for entry in reversed(entries):
        location = getattr(entry, "reprfileloc", None)
        if location is not None and str(location.path).startswith("tests"):
            return f"{location.path}:{location.lineno}"
    return ""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    entry = _results.get(item.nodeid)
    if entry is None:
        return report
    if report.skipped and call.when != "teardown":
        wasxfail = hasattr(report, "wasxfail")
        if entry["outcome"] == "passed":
            entry["outcome"] = "xfailed" if wasxfail else "skipped"
    elif report.failed:
        if entry["outcome"] in ("passed", "skipped", "xfailed"):
            entry["outcome"] = "failed" if call.when == "call" else "error"
            entry["when"] = call.when
            if call.excinfo is not None:
                entry["exc_type"], entry["exc_message"] = _describe(call.excinfo.value)
            crash = getattr(report.longrepr, "reprcrash", None)
            with contextlib.suppress(Exception):
                entry["crash"] = str(crash.message)[:500] if crash is not None else ""
                entry["crash_at"] = _where(item, report)
    elif call.when == "call" and hasattr(report, "wasxfail"):
        entry["outcome"] = "xpassed"
    return report
