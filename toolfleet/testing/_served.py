"""The tool objects an in-process fleet serves, one per lookup key, each under its own version.

A test serves objects made anywhere (closures, factories, a body per test under a reused
name). Each object served under a lookup key gets the next version of that key ("1", "2",
...), and becomes its only live version: the workers' shared registry, the registry in Redis
the planner reads, and the circuits (keyed by version) all follow the new object, so a body
that failed in one test never trips the circuit of the next test's body of the same name, and
a command still naming an earlier version is refused as not served instead of running the
new body.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from kernel.errors import ConfigurationError
from kernel.tools import (
    CompensateFunction,
    FleetOptions,
    FunctionToolAdapter,
    ProbeFunction,
    Tool,
    ToolRegistry,
    is_function_tool,
)


class ServeOptions(FleetOptions, total=False):
    """What ``InProcessFleet.serve`` takes for an SDK function tool: toolfleet's options, and
    its probe and compensate actions (as ``ToolRegistry.add_function_tool`` takes them)."""

    probe: ProbeFunction | None
    """Looks a call up upstream by ``ctx.idempotency_key`` (see ``Tool.probe``)."""
    compensate: CompensateFunction | None
    """Undoes an applied call, given its output (see ``Tool.compensate``)."""


@dataclass
class Served:
    """One object a fleet serves: what the test gave, and the Tool the workers run."""

    original: object
    """The application's object (an ``agents.FunctionTool`` or a ``kernel.tools.Tool``)."""
    tool: Tool
    """What the workers run: the SDK tool's adapter, or a copy of the Tool with its version."""
    options: dict[str, Any] = field(default_factory=dict)
    """The fleet options it was served with (an SDK function tool's effect class, probe...)."""


def lookup_key_of(obj: object) -> str:
    """The name a model calls ``obj`` by (``namespace.name`` or ``name``), without building
    anything; ConfigurationError when ``obj`` is no tool a fleet can serve."""
    if isinstance(obj, Tool):
        return obj.lookup_key
    if is_function_tool(obj):
        name = str(getattr(obj, "name", ""))
        namespace = getattr(obj, "_tool_namespace", None)
        return f"{namespace}.{name}" if namespace else name
    raise ConfigurationError(
        f"cannot serve a {type(obj).__name__}: serve an agents.FunctionTool (@function_tool), "
        "a toolfleet Tool (@tools.tool) or a ToolRegistry"
    )


def expand(objects: tuple[object, ...]) -> list[object]:
    """The tools to serve: a ToolRegistry stands for every tool it declares."""
    found: list[object] = []
    for obj in objects:
        if isinstance(obj, ToolRegistry):
            found.extend(obj)
        else:
            lookup_key_of(obj)  # refuses anything else at once, before anything is served
            found.append(obj)
    return found


def build(obj: object, version: str, pool: str, options: dict[str, Any]) -> Tool:
    """The Tool the workers run for ``obj``, as ``version``; ConfigurationError when it
    cannot be served (SDK options on a toolfleet Tool, a tool pinned to another pool)."""
    if "version" in options:
        raise ConfigurationError(
            "an in-process fleet numbers the versions of a name itself (each object served "
            "under it is the next one); leave version= out"
        )
    if isinstance(obj, Tool):
        if options:
            raise ConfigurationError(
                f"tool {obj.lookup_key!r} is a toolfleet Tool: declare {', '.join(options)} "
                "on it (@tools.tool(...)), not when serving it"
            )
        tool = copy.copy(obj)  # the application's object keeps its own version
        tool.version = version
    else:
        tool = FunctionToolAdapter(obj, **options, version=version)  # type: ignore[arg-type]
    if tool.pool is not None and tool.pool != pool:
        raise ConfigurationError(
            f"tool {tool.lookup_key!r} is pinned to pool {tool.pool!r}, and this fleet's "
            f"workers serve pool {pool!r}: start the fleet with pool={tool.pool!r}, or serve "
            "the tool without its pool"
        )
    return tool
