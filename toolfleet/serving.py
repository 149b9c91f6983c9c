"""Who serves the tool objects a runner is about to call, when something does.

In production a fleet's workers serve tools importable from a module (``toolfleet worker
--tools module:attribute``): a runner only sends calls. A test fleet
(``toolfleet.testing.InProcessFleet``) can instead serve the very objects an application's
test builds — closures, factories, per-test bodies under reused names — if it learns of each
one before a call of it is submitted. This module is that meeting point: the fleet installs
itself as the *tool server*, and a runner asks it to serve each tool before sending a call.

The contract, for a runner (``toolfleet.agents.FleetRunner``):

- ``server = current_tool_server()``; when it is None, do nothing (production).
- Otherwise ``await server.ensure_served(tool)`` for every function tool of a batch, **before**
  the ModelResponseEvent carrying its calls is submitted, where ``tool`` is the application's
  own ``agents.FunctionTool`` (or a ``kernel.tools.Tool``): never a runner-made copy whose
  ``on_invoke_tool`` sends the call to the fleet, which the worker would send again.
- When it returns, calls of the tool's lookup key (``namespace.name`` or ``name``) submitted
  from then on are planned with that object's spec (its approval policy under the release
  gate, its effect class) and run that object's body, until another object is served under
  the same key. An object already served returns at once (an identity check, no I/O).
- It raises a ``ToolfleetError`` (ConfigurationError: the object cannot be served, and why;
  UsageError: the fleet is not running) and never returns without the tool served.
- One object per lookup key at a time: two different objects under one name in the same batch
  (or in concurrent runs on one fleet) run the one served last.
- A server whose fleet runs on an event loop may say which (``loop``, an optional attribute):
  calls must be made on it, and a synchronous entry point (``run_sync``) can run its
  coroutine there with ``loop.run_until_complete`` while that loop is idle.
- A server may say whether the fleet holds every call of a tool it serves for a person (its
  release gate: ``gated(tool)``, an optional method, see ``GatingToolServer``). A runner asks
  it right after ``ensure_served(tool)``, when the SDK evaluates the call's approval: the gate
  is then the one of the very object that will run the call, never one read earlier (a name
  an earlier test served with another policy), and the runner reads no registry for it.

This module imports nothing of toolfleet, so the runner (``toolfleet.agents``) and the testing
helpers (``toolfleet.testing``), which the import contracts keep independent of each other,
both depend on it instead of on each other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Protocol, runtime_checkable


@runtime_checkable
class ToolServer(Protocol):
    """Serves tool objects on a fleet at run time (see the module's contract)."""

    async def ensure_served(self, tool: object) -> None:
        """Return once calls of ``tool``'s lookup key run this object on the fleet."""


@runtime_checkable
class GatingToolServer(ToolServer, Protocol):
    """A tool server that also says which of the tools it serves the release gate holds."""

    def gated(self, tool: object) -> bool:
        """Whether the fleet holds every call of ``tool``'s lookup key for a person, as the
        object served under it now is specified (call ``ensure_served(tool)`` first)."""


_CURRENT: ContextVar[ToolServer | None] = ContextVar("toolfleet_tool_server", default=None)
_INSTALLED: list[ToolServer] = []
"""Process-wide servers, newest last: what ``current_tool_server`` falls back to."""


def current_tool_server() -> ToolServer | None:
    """The tool server of this context (``serving``), else the newest installed in the
    process (``install``), else None: nothing serves tools at run time."""
    server = _CURRENT.get()
    if server is not None:
        return server
    return _INSTALLED[-1] if _INSTALLED else None


@contextlib.contextmanager
def serving(server: ToolServer) -> Iterator[ToolServer]:
    """Make ``server`` the tool server of the code (and the tasks it creates) inside the
    block, ahead of any installed one."""
    token = _CURRENT.set(server)
    try:
        yield server
    finally:
        _CURRENT.reset(token)


def install(server: ToolServer) -> None:
    """Make ``server`` the tool server of every context in this process that has none of
    its own (a session-wide test fleet: pytest runs fixtures and tests in different
    contexts); ``uninstall`` undoes it."""
    _INSTALLED.append(server)


def uninstall(server: ToolServer) -> None:
    """Undo ``install(server)`` (nothing when it is not installed)."""
    with contextlib.suppress(ValueError):
        _INSTALLED.remove(server)


__all__ = [
    "GatingToolServer",
    "ToolServer",
    "current_tool_server",
    "install",
    "serving",
    "uninstall",
]
