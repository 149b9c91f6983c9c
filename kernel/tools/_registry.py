"""The set of tools a worker serves, declared with the ``@tools.tool`` decorator."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Unpack, overload

from kernel.errors import ConfigurationError, ToolNotFoundError
from kernel.rules.effects import mcp_effect_class, retries_blindly
from kernel.rules.texts import TOOL_NOT_FOUND
from kernel.rules.versions import newest_version, version_order
from kernel.tools._runner import CallHooks
from kernel.tools._tool import (
    Tool,
)
from schemas import ToolSpec

if TYPE_CHECKING:
    from agents import FunctionTool
    from agents.mcp import MCPServer

    from kernel.tools._tool import CompensateFunction, FleetOptions, ProbeFunction, ToolOptions
    from schemas import EffectClass

log = logging.getLogger("kernel.tools")


class ToolRegistry:
    """Tools by lookup key (``name`` or ``namespace.name``) and version; ``toolfleet worker``
    serves one. Several versions of one tool may be served side by side (declare each with
    its own ``version=``): a command names the version it wants, else it gets the newest."""

    def __init__(self, *, hooks: CallHooks | None = None) -> None:
        self._tools: dict[str, dict[str, Tool]] = {}
        self._declared: list[Tool] = []
        self._mcp: list[_McpSource] = []
        self.hooks = hooks
        """Lifecycle hooks (on_tool_start / on_tool_end) the worker runs once per call."""

    @overload
    def tool(self, func: Callable[..., Any], /) -> Tool: ...

    @overload
    def tool(
        self, func: None = None, /, **options: Unpack[ToolOptions]
    ) -> Callable[[Callable[..., Any]], Tool]: ...

    def tool(
        self, func: Callable[..., Any] | None = None, /, **options: Unpack[ToolOptions]
    ) -> Tool | Callable[[Callable[..., Any]], Tool]:
        """Declare a tool: ``@tools.tool`` or ``@tools.tool(effect=..., timeout=...)``.

        The options and their defaults are ``ToolOptions`` (the Agents SDK's own options, such
        as ``timeout`` or ``needs_approval``, and toolfleet's ``FleetOptions``, such as
        ``effect``, ``pool`` or ``classify``).
        """

        def register(fn: Callable[..., Any]) -> Tool:
            return self.add(Tool(fn, **options))

        if func is not None:
            return register(func)
        return register

    def add(self, tool: Tool) -> Tool:
        """Register an already built Tool; a second tool with the same lookup key and version
        is an error (another version of the same tool is not)."""
        key = tool.lookup_key
        versions = self._tools.setdefault(key, {})
        if tool.version in versions:
            raise ConfigurationError(
                f"tool {key!r} version {tool.version!r} is declared twice in this registry; "
                "give one of them another name, namespace or version"
            )
        versions[tool.version] = tool
        self._declared.append(tool)
        return tool

    def replace(self, tool: Tool) -> Tool:
        """Serve ``tool`` instead of every version of its lookup key held so far.

        For a test fleet serving tool objects made at run time (``toolfleet.testing.
        InProcessFleet``), where a later object under a reused name takes the earlier one's
        place. A call already running keeps the object it started with.
        """
        key = tool.lookup_key
        # New containers, not edits in place: a reader iterating the old ones is unaffected.
        self._declared = [t for t in self._declared if t.lookup_key != key]
        self._tools = {k: v for k, v in self._tools.items() if k != key}
        return self.add(tool)

    def add_function_tool(
        self,
        function_tool: FunctionTool,
        *,
        probe: ProbeFunction | None = None,
        compensate: CompensateFunction | None = None,
        **options: Unpack[FleetOptions],
    ) -> Tool:
        """Serve an OpenAI Agents SDK ``FunctionTool`` (``@function_tool``) unchanged.

        Its name, schema, ``needs_approval``, timeout settings, ``failure_error_function``,
        ``is_enabled`` and tool guardrails keep their in-process meaning (see
        ``FunctionToolAdapter``); ``options`` are toolfleet's own (``FleetOptions``), and
        ``probe`` and ``compensate`` declare what ``Tool.probe`` and ``Tool.compensate`` would.
        ``on_unknown`` defaults to "report_now" (the SDK's texts). Without ``effect`` the tool
        is treated as non_idempotent but keeps the SDK's approval behaviour (no release gate);
        ``toolfleet tools review`` lists it. Needs the ``openai-agents`` package.
        """
        from kernel.tools._sdk import FunctionToolAdapter

        return self.add(
            FunctionToolAdapter(function_tool, probe=probe, compensate=compensate, **options)
        )

    @classmethod
    def from_function_tools(
        cls,
        function_tools: Iterable[FunctionTool],
        *,
        hooks: CallHooks | None = None,
        **options: Unpack[FleetOptions],
    ) -> ToolRegistry:
        """A registry serving these SDK function tools, each with the same ``options``."""
        registry = cls(hooks=hooks)
        for function_tool in function_tools:
            registry.add_function_tool(function_tool, **options)
        return registry

    def add_mcp_server(
        self,
        server: MCPServer,
        *,
        effects: Mapping[str, EffectClass] | None = None,
        default_effect: EffectClass | None = None,
        **options: Unpack[FleetOptions],
    ) -> None:
        """Serve the tools of an MCP server (the SDK's ``MCPServerStdio``,
        ``MCPServerStreamableHttp``...) as fleet tools, when the worker starts (``open``).

        Each tool's effect class is what the operator declares (``effects`` maps tool names to
        effect classes, ``default_effect`` covers every tool it does not name), else what the
        server's annotations say (``kernel.rules.effects.mcp_effect_class``: a read-only hint
        makes it read_only, an idempotent hint idempotent, anything else non_idempotent, so
        that it is never run again blindly and, without a probe, waits for approval). A server
        client that retries failed calls by itself (``max_retry_attempts``) fails the
        worker's start when it would serve a tool that is not replay-safe. Each tool is served
        as the SDK serves it in-process (``MCPUtil.to_function_tool``: its schema, the
        server's failure handling and guardrails); ``options`` are toolfleet's own.
        """
        self._mcp.append(_McpSource(server, dict(effects or {}), default_effect, options))

    async def open(self) -> None:
        """Connect the MCP servers and register their tools (the worker calls this first)."""
        for source in self._mcp:
            if source.opened:
                continue
            for listed, function_tool in await source.open():
                seeded = mcp_effect_class(
                    _wire_annotations(getattr(listed, "annotations", None)),
                    declared=source.effects.get(function_tool.name),
                    default=source.default_effect,
                )
                retries = getattr(source.server, "max_retry_attempts", 0)
                if isinstance(retries, int) and retries_blindly(seeded.effect_class, retries):
                    await source.close()
                    raise ConfigurationError(
                        f"MCP server {source.server.name!r} retries every failed call by "
                        f"itself (max_retry_attempts={retries}), which could run tool "
                        f"{function_tool.name!r} ({seeded.effect_class}: {seeded.reason}) "
                        "twice; build it with max_retry_attempts=0 (the fleet retries "
                        "replay-safe tools itself), or declare the tool read_only or "
                        "idempotent in effects= if it is"
                    )
                log.info(
                    "MCP tool served with effect class %s (%s)",
                    seeded.effect_class,
                    seeded.reason,
                    extra={"mcp_server": source.server.name, "tool": function_tool.name},
                )
                options: FleetOptions = {**source.options, "effect": seeded.effect_class}
                self.add_function_tool(function_tool, **options)

    async def close(self) -> None:
        """Disconnect the MCP servers (the worker calls this when it stops)."""
        for source in self._mcp:
            await source.close()

    def get(self, key: str, version: str | None = None) -> Tool:
        """The tool a model calls ``key`` (``name`` or ``namespace.name``), in ``version``, or
        the newest version this registry holds when ``version`` is None.

        Raises ToolNotFoundError when this registry has no such tool or version.
        """
        tool = self.find(key, version)
        if tool is None:
            if version is not None and key in self._tools:
                raise ToolNotFoundError(f"Tool '{key}' version '{version}' not found.")
            raise ToolNotFoundError(TOOL_NOT_FOUND.format(name=key))
        return tool

    def find(self, key: str, version: str | None = None) -> Tool | None:
        """The tool called ``key`` in ``version`` (None: the newest), or None."""
        versions = self._tools.get(key)
        if not versions:
            return None
        return versions.get(newest_version(versions) if version is None else version)

    def versions(self, key: str) -> list[str]:
        """The versions of ``key`` this registry holds, oldest first (empty when none)."""
        return version_order(self._tools.get(key, ()))

    def for_pool(self, pool: str) -> list[Tool]:
        """The tools a worker of ``pool`` serves (every version): those pinned to it and those
        not pinned, in declaration order."""
        return [t for t in self._declared if t.pool is None or t.pool == pool]

    def specs(self, pool: str) -> list[ToolSpec]:
        """Registry entries of the tools a worker of ``pool`` serves, in declaration order."""
        return [t.spec(pool) for t in self.for_pool(pool)]

    def __iter__(self) -> Iterator[Tool]:
        """Every tool, every version, in declaration order."""
        return iter(list(self._declared))

    def __len__(self) -> int:
        """How many tools (each version counts) this registry holds."""
        return len(self._declared)

    def __contains__(self, key: object) -> bool:
        """Whether some version of the tool called ``key`` is here."""
        return key in self._tools

    def __repr__(self) -> str:
        return f"ToolRegistry({list(self._tools)!r})"


class _McpSource:
    """One MCP server a registry serves, and what its operator declared about its tools."""

    def __init__(
        self,
        server: MCPServer,
        effects: dict[str, EffectClass],
        default_effect: EffectClass | None,
        options: FleetOptions,
    ) -> None:
        self.server = server
        self.effects = effects
        self.default_effect = default_effect
        self.options = options
        self.opened = False

    async def open(self) -> list[tuple[object, FunctionTool]]:
        """Connect; each tool the server lists, with the function tool that serves it."""
        from agents.mcp import MCPUtil

        await self.server.connect()  # type: ignore[no-untyped-call]
        self.opened = True
        listed = await self.server.list_tools()
        return [(t, MCPUtil.to_function_tool(t, self.server, False)) for t in listed]

    async def close(self) -> None:
        if self.opened:
            self.opened = False
            await self.server.cleanup()  # type: ignore[no-untyped-call]


def _wire_annotations(annotations: object) -> dict[str, Any] | None:
    """An MCP tool's annotations as they travel (camelCase keys), from the model either major
    of the ``mcp`` package builds (or a plain mapping), so the rule reads one form."""
    if annotations is None:
        return None
    dump = getattr(annotations, "model_dump", None)
    if callable(dump):
        dumped = dump(by_alias=True, exclude_none=True)
        return dict(dumped) if isinstance(dumped, Mapping) else None
    if isinstance(annotations, Mapping):
        return dict(annotations)
    return None
