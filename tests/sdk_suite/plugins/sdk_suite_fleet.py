"""pytest plugin: the Agents SDK's own tests with the runner on a toolfleet fleet.

Loaded into the SDK's test session with ``-p sdk_suite_fleet`` (after ``-p sdk_suite_record``),
it routes ``agents.Runner.run / run_streamed / run_sync`` — what the tests call, and what the
SDK's own helpers (agents as tools, the REPL, the voice workflow) call — to a
``toolfleet.agents.FleetRunner``, passing the arguments exactly as the test gave them. The
runner is made anew for each test (as an application makes one), on one fleet for the whole
session: a ``toolfleet.testing.InProcessFleet`` with ``auto_serve=True``, so the function
tools a test defines (closures, factories, per-test bodies with reused names) are served when
the runner calls them.

The fleet lives on the session's event loop: the harness runs async tests on it
(``asyncio_default_test_loop_scope=session``, in-process too, so both runs differ only in the
runner). In a sync test that loop is idle, and ``FleetRunner.run_sync`` runs there.

A call made while a routed call is running (the SDK's nested runs of an agent tool, or
FleetRunner calling the SDK) goes to the SDK's original method.

Environment: ``SDK_SUITE_TURN_TIMEOUT`` (seconds FleetRunner waits for a turn, 15 by default),
``SDK_SUITE_WORKERS`` (the fleet's workers, 2 by default). Kafka and Redis are those of
``toolfleet infra up`` (started if needed) unless ``KAFKA_BOOTSTRAP_SERVERS`` / ``REDIS_URL``
name others.
"""

from __future__ import annotations

import contextvars
import functools
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio

_ROUTING: contextvars.ContextVar[bool] = contextvars.ContextVar("sdk_suite_routing", default=False)
_TURN_TIMEOUT = float(os.environ.get("SDK_SUITE_TURN_TIMEOUT", "15"))
_WORKERS = int(os.environ.get("SDK_SUITE_WORKERS", "2"))
_TENANT = "sdk-suite"


class _Session:
    """The fleet of this test session and the runner of the running test."""

    settings: Any = None
    """Where the fleet runs (Kafka, Redis, the session's topic prefix)."""
    fleet: Any = None
    """The InProcessFleet on the session's event loop."""
    runner: Any = None
    """The FleetRunner of the running test (made at its first runner call)."""


def _settings() -> Any:
    from kernel.settings import Settings

    base = Settings()
    run = uuid.uuid4().hex[:8]
    env = {}
    if not (os.environ.get("KAFKA_BOOTSTRAP_SERVERS") and os.environ.get("REDIS_URL")):
        from toolfleet.app import infra

        env = infra.up(base).env()
    return base.model_copy(
        update={
            "kafka_bootstrap_servers": env.get(
                "KAFKA_BOOTSTRAP_SERVERS", base.kafka_bootstrap_servers
            ),
            "redis_url": env.get("REDIS_URL", base.redis_url),
            "topic_prefix": f"sdk-suite-{run}.",
            # Decisions signed and verified, as toolfleet's own tests run them.
            "decision_auth": "hmac",
            "decision_keys": {"*": f"sdk-suite-{run}"},
        }
    )


def _runner() -> Any:
    from toolfleet.agents import FleetRunner

    if _Session.runner is None:
        if _Session.fleet is None:
            raise RuntimeError("the sdk-suite fleet is not running (its session fixture failed)")
        _Session.runner = FleetRunner(
            _Session.fleet.client, tenant_id=_TENANT, turn_timeout=_TURN_TIMEOUT
        )
    return _Session.runner


def _routed_run(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def run(cls: type, *args: Any, **kwargs: Any) -> Any:
        if _ROUTING.get():
            return await original(cls, *args, **kwargs)
        runner = _runner()
        token = _ROUTING.set(True)
        try:
            return await runner.run(*args, **kwargs)
        finally:
            _ROUTING.reset(token)

    return run


def _routed_run_streamed(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def run_streamed(cls: type, *args: Any, **kwargs: Any) -> Any:
        if _ROUTING.get():
            return original(cls, *args, **kwargs)
        runner = _runner()
        token = _ROUTING.set(True)
        try:
            # The streamed run's tasks are created here and copy this context.
            return runner.run_streamed(*args, **kwargs)
        finally:
            _ROUTING.reset(token)

    return run_streamed


def _routed_run_sync(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def run_sync(cls: type, *args: Any, **kwargs: Any) -> Any:
        if _ROUTING.get():
            return original(cls, *args, **kwargs)
        runner = _runner()
        token = _ROUTING.set(True)
        try:
            # In a sync test the session's loop is idle: FleetRunner.run_sync runs there, on
            # the fleet's loop (toolfleet.serving's ``loop``), as it does for any test fleet.
            return runner.run_sync(*args, **kwargs)
        finally:
            _ROUTING.reset(token)

    return run_sync


_ROUTES = {"run": _routed_run, "run_streamed": _routed_run_streamed, "run_sync": _routed_run_sync}


class _WorkerCounts:
    """Worker lifecycle hooks: how many tool bodies the fleet's workers started."""

    started = 0

    async def on_tool_start(self, ctx: Any, tool: Any) -> None:
        _WorkerCounts.started += 1

    async def on_tool_end(self, ctx: Any, tool: Any, output: str) -> None:
        return None


def pytest_configure(config: pytest.Config) -> None:
    from agents.run import Runner

    # toolfleet.agents routes the SDK's invocation point when imported: now, so that the
    # record plugin's counter wraps the route.
    import toolfleet.agents  # noqa: F401

    for name, route in _ROUTES.items():
        original = Runner.__dict__[name]
        function = original.__func__ if isinstance(original, classmethod) else original
        setattr(Runner, name, classmethod(route(function)))


@pytest_asyncio.fixture(scope="session", loop_scope="session", autouse=True)
async def _sdk_suite_fleet() -> AsyncIterator[Any]:
    """The session's fleet, serving every function tool a runner calls (auto_serve)."""
    from toolfleet.testing import InProcessFleet

    _Session.settings = _settings()
    async with InProcessFleet(
        _Session.settings, workers=_WORKERS, auto_serve=True, hooks=_hooks()
    ) as fleet:
        _Session.fleet = fleet
        yield fleet
    _Session.fleet = None


def _hooks() -> Any:
    from kernel.tools import CallHooks

    class Counting(_WorkerCounts, CallHooks):
        pass

    return Counting()


@pytest.fixture(autouse=True)
def _sdk_suite_runner() -> Iterator[None]:
    """A new FleetRunner for each test, made at its first runner call; the worker starts
    its calls caused go to the test's line of the record; after it, the fleet is checked.

    Each test also starts with the workers' failure log as a new worker has it: the log
    writes at most ten tracebacks per tool name per minute (kernel.tools._failures), and the
    SDK's tests reuse tool names (``fail``), so whether a test's tool failure is logged would
    otherwise depend on how many tests before it failed a tool of that name."""
    import sdk_suite_record

    from kernel.tools._failures import TOOL_FAILURES

    TOOL_FAILURES._windows.clear()
    _Session.runner = None
    before = _WorkerCounts.started
    yield
    sdk_suite_record.annotate(worker_starts=_WorkerCounts.started - before)
    _Session.runner = None
    if _Session.fleet is not None:
        # A service, or one of its background loops (a worker's capacity registration...),
        # that ended during this test fails it here, with the reason: not the tests after
        # it, by a timeout, with none.
        _Session.fleet.check()
