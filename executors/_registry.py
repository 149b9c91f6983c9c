"""The set of tools a worker serves, declared with the ``@tools.tool`` decorator."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

from executors._guardrails import InputGuardrail, OutputGuardrail
from executors._runner import CallHooks
from executors._tool import (
    ApprovalFunction,
    OnUnknown,
    TimeoutBehavior,
    Tool,
    ToolErrorFunction,
    default_tool_error_function,
)
from schemas import EffectClass, ToolSpec
from toolfleet.effects import ClassifyHook
from toolfleet.errors import ConfigurationError, ToolNotFoundError
from toolfleet.versions import newest_version, version_order

if TYPE_CHECKING:
    from agents import FunctionTool

    from executors._tool import CompensateFunction, ProbeFunction


class ToolRegistry:
    """Tools by lookup key (``name`` or ``namespace.name``) and version; ``toolfleet worker``
    serves one. Several versions of one tool may be served side by side (declare each with
    its own ``version=``): a command names the version it wants, else it gets the newest."""

    def __init__(self, *, hooks: CallHooks | None = None) -> None:
        self._tools: dict[str, dict[str, Tool]] = {}
        self._declared: list[Tool] = []
        self.hooks = hooks
        """Lifecycle hooks (on_tool_start / on_tool_end) the worker runs once per call."""

    @overload
    def tool(self, func: Callable[..., Any], /) -> Tool: ...

    @overload
    def tool(
        self,
        func: None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        namespace: str | None = None,
        version: str = "1",
        effect: EffectClass = "non_idempotent",
        timeout: float | None = None,
        timeout_behavior: TimeoutBehavior = "error_as_result",
        timeout_error_function: ToolErrorFunction | None = None,
        failure_error_function: ToolErrorFunction | None = default_tool_error_function,
        needs_approval: bool | ApprovalFunction | None = None,
        input_guardrails: Sequence[InputGuardrail] = (),
        output_guardrails: Sequence[OutputGuardrail] = (),
        on_unknown: OnUnknown | None = None,
        is_enabled: bool = True,
        pool: str | None = None,
        definite_errors: Sequence[type[BaseException]] = (),
        classify: ClassifyHook | None = None,
        unattended: str | None = None,
    ) -> Callable[[Callable[..., Any]], Tool]: ...

    def tool(
        self,
        func: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        namespace: str | None = None,
        version: str = "1",
        effect: EffectClass = "non_idempotent",
        timeout: float | None = None,
        timeout_behavior: TimeoutBehavior = "error_as_result",
        timeout_error_function: ToolErrorFunction | None = None,
        failure_error_function: ToolErrorFunction | None = default_tool_error_function,
        needs_approval: bool | ApprovalFunction | None = None,
        input_guardrails: Sequence[InputGuardrail] = (),
        output_guardrails: Sequence[OutputGuardrail] = (),
        on_unknown: OnUnknown | None = None,
        is_enabled: bool = True,
        pool: str | None = None,
        definite_errors: Sequence[type[BaseException]] = (),
        classify: ClassifyHook | None = None,
        unattended: str | None = None,
    ) -> Tool | Callable[[Callable[..., Any]], Tool]:
        """Declare a tool: ``@tools.tool`` or ``@tools.tool(effect=..., timeout=...)``.

        - ``name`` defaults to the function's name, ``description`` to its docstring.
        - ``effect``: read_only | idempotent | non_idempotent (default) | irreversible.
        - ``timeout`` (seconds, async functions only) with ``timeout_behavior``
          "error_as_result" (the SDK's timeout text, or ``timeout_error_function(ctx, err)``)
          or "raise_exception" (the turn fails with ToolTimeoutError).
        - ``failure_error_function(ctx, exc) -> str`` words a failure for the model; the
          default is the SDK's fixed text; ``None`` makes any failure fail the turn.
        - ``needs_approval``: bool or ``(ctx, args) -> bool``; by default (the release
          gate) True for irreversible tools and for non_idempotent tools without a probe.
        - ``unattended="why"``: run a gated tool without approval anyway; the reason is
          published to the registry and printed by ``toolfleet tools review``.
        - ``definite_errors``: exception types that prove nothing took effect (the tool's own
          validation errors, say): not executed, never retried, no human task.
        - ``classify(exc) -> EffectVerdict | None``: the tool's own mapping of exceptions
          (None: the standard table of ``toolfleet.effects``).
        - ``on_unknown``: default "report_now" for read_only tools, else
          "reconcile_then_report".
        - ``pool``: serve the tool only in this pool (default: every pool serving the registry).
        """

        def register(fn: Callable[..., Any]) -> Tool:
            return self.add(
                Tool(
                    fn,
                    name=name,
                    description=description,
                    namespace=namespace,
                    version=version,
                    effect=effect,
                    timeout=timeout,
                    timeout_behavior=timeout_behavior,
                    timeout_error_function=timeout_error_function,
                    failure_error_function=failure_error_function,
                    needs_approval=needs_approval,
                    input_guardrails=input_guardrails,
                    output_guardrails=output_guardrails,
                    on_unknown=on_unknown,
                    is_enabled=is_enabled,
                    pool=pool,
                    definite_errors=definite_errors,
                    classify=classify,
                    unattended=unattended,
                )
            )

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

    def add_function_tool(
        self,
        function_tool: FunctionTool,
        *,
        effect: EffectClass | None = None,
        on_unknown: OnUnknown | None = "report_now",
        pool: str | None = None,
        version: str = "1",
        probe: ProbeFunction | None = None,
        compensate: CompensateFunction | None = None,
        definite_errors: Sequence[type[BaseException]] = (),
        classify: ClassifyHook | None = None,
        unattended: str | None = None,
    ) -> Tool:
        """Serve an OpenAI Agents SDK ``FunctionTool`` (``@function_tool``) unchanged.

        Its name, schema, ``needs_approval``, timeout settings, ``failure_error_function``,
        ``is_enabled`` and tool guardrails keep their in-process meaning (see
        ``executors._sdk``); ``effect``, ``on_unknown`` (default "report_now": the SDK's
        texts), ``pool``, ``version``, ``probe``, ``compensate``, ``definite_errors``,
        ``classify`` and ``unattended`` are toolfleet's own options (see ``tool``). Without
        ``effect`` the tool is treated as non_idempotent but keeps the SDK's approval
        behaviour (no release gate); ``toolfleet tools review`` lists it. Needs the
        ``openai-agents`` package.
        """
        from executors._sdk import FunctionToolAdapter

        return self.add(
            FunctionToolAdapter(
                function_tool,
                effect=effect,
                on_unknown=on_unknown,
                pool=pool,
                version=version,
                probe=probe,
                compensate=compensate,
                definite_errors=definite_errors,
                classify=classify,
                unattended=unattended,
            )
        )

    @classmethod
    def from_function_tools(
        cls,
        function_tools: Iterable[FunctionTool],
        *,
        hooks: CallHooks | None = None,
        effect: EffectClass | None = None,
        pool: str | None = None,
    ) -> ToolRegistry:
        """A registry serving these SDK function tools (same options for all of them)."""
        registry = cls(hooks=hooks)
        for function_tool in function_tools:
            registry.add_function_tool(function_tool, effect=effect, pool=pool)
        return registry

    def get(self, key: str, version: str | None = None) -> Tool:
        """The tool a model calls ``key`` (``name`` or ``namespace.name``), in ``version``, or
        the newest version this registry holds when ``version`` is None.

        Raises ToolNotFoundError when this registry has no such tool or version.
        """
        tool = self.find(key, version)
        if tool is None:
            if version is not None and key in self._tools:
                raise ToolNotFoundError(f"Tool '{key}' version '{version}' not found.")
            raise ToolNotFoundError(f"Tool '{key}' not found.")
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
