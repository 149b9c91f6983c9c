"""Fixtures of the examples' differential tests: the SDK's sdist, a fleet, the example module.

The examples are the SDK's own (its sdist's ``examples/``), never copies: ``python -m
tests.sdk_suite examples`` (and ``run``, which ``make sdk-suite`` calls) fetches and checks the
sdist, unpacks it, and names its root in ``SDK_SUITE_EXAMPLES`` for this pytest session. A
pytest run that names none (``make test``'s run of the whole tree) does not collect these
tests: they need that sdist and belong to that target.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from agents.tracing import set_tracing_disabled

from kernel.settings import Settings
from kernel.tools import CallHooks, Tool, ToolContext
from toolfleet.testing import InProcessFleet

ROOT_VARIABLE = "SDK_SUITE_EXAMPLES"
"""The environment variable naming the unpacked sdist (the folder that holds ``examples/``)."""

collect_ignore_glob = [] if os.environ.get(ROOT_VARIABLE) else ["test_*.py"]

# Its assertions say what differs between two runs.
pytest.register_assert_rewrite("tests.sdk_suite.examples._differential")


class WorkerCalls(CallHooks):
    """The fleet's worker hooks: every tool body a worker started, as (tool, call id)."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str]] = []

    async def on_tool_start(self, ctx: ToolContext, tool: Tool) -> None:
        """A worker is about to run ``tool``'s body for the call ``ctx.call_id``."""
        self.started.append((tool.name, ctx.call_id))


@pytest.fixture(scope="session", autouse=True)
def _no_trace_export() -> Iterator[None]:
    """The examples open traces (customer_service); with no OpenAI key the SDK's exporter
    would only log that it cannot send them."""
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


@pytest.fixture(scope="session")
def sdk_root() -> Path:
    """The unpacked sdist whose ``examples/`` the tests load."""
    root = Path(os.environ[ROOT_VARIABLE])
    if not (root / "examples" / "__init__.py").is_file():
        raise RuntimeError(
            f"{ROOT_VARIABLE}={root} holds no examples/ package: run the tests with "
            "`python -m tests.sdk_suite examples`, which unpacks the SDK's sdist"
        )
    return root


@pytest.fixture(scope="session")
def worker_hooks() -> WorkerCalls:
    """The hooks of the session's fleet."""
    return WorkerCalls()


@pytest.fixture(scope="session")
async def fleet(settings: Settings, worker_hooks: WorkerCalls) -> AsyncIterator[InProcessFleet]:
    """One fleet for the session, serving each tool object a FleetRunner calls (auto_serve):
    the examples' own tools, served as the examples define them."""
    async with InProcessFleet(settings, workers=2, auto_serve=True, hooks=worker_hooks) as running:
        yield running


@pytest.fixture
def worker_calls(worker_hooks: WorkerCalls) -> list[tuple[str, str]]:
    """The tool bodies the fleet's workers start during this test, in start order."""
    worker_hooks.started.clear()
    return worker_hooks.started


@pytest.fixture
def example(sdk_root: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """``example("basic/tools.py")``: that example imported anew from the sdist, by path.

    The sdist's root goes first on ``sys.path`` for the test, so the example's own imports
    (``examples.auto_mode``) are the sdist's; the module is registered under its dotted name
    (``examples.basic.tools``) for the test only. Not interactive mode: the examples read
    ``input()``, which each test answers.
    """
    monkeypatch.syspath_prepend(str(sdk_root))
    for name in [n for n in sys.modules if n == "examples" or n.startswith("examples.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delenv("EXAMPLES_INTERACTIVE_MODE", raising=False)

    def load(relative: str) -> ModuleType:
        path = sdk_root / "examples" / relative
        name = "examples." + relative.removesuffix(".py").replace("/", ".")
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise RuntimeError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        return module

    return load
