"""The fleet copy of an agent graph: the same agents, their function tools run on the fleet.

``FleetGraph.agent(a)`` is a clone of ``a`` (same name, instructions, model, guardrails,
hooks, handoffs, output type...) whose function tools — its own, its MCP servers' and those of
every agent reachable through handoffs or agent tools — are fleet tools: the SDK runner plans,
approves and guards them as in-process, and ``invoke_on_fleet`` runs them on a worker.

Clones are made once per original object and kept, so a run, its resumptions and its nested
agent-tool runs always see the same agents (the SDK matches agents of a RunState by identity
within a process and by name across processes; names are unchanged).

An agent tool (``Agent.as_tool``) keeps its SDK implementation: the nested run is started by
the SDK through the default agent runner, which ``install_fleet_runner`` wraps so that, inside a
FleetRunner run, the nested agent is swapped for its fleet copy. The nested run's calls go to
the fleet under the nested identity (see ``Binding.nested``).
"""

from __future__ import annotations

import copy
import functools
import json
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from agents import Agent, FunctionTool, RunContextWrapper
from agents.exceptions import UserError
from agents.handoffs import Handoff
from agents.run import AgentRunner, get_default_agent_runner, set_default_agent_runner
from agents.run_state import RunState
from agents.tool import ToolOriginType, get_function_tool_origin
from agents.tool_context import ToolContext
from agents.tool_guardrails import ToolInputGuardrail, ToolInputGuardrailData

from toolfleet.agents._calls import bound, current_binding, invoke_on_fleet


class FleetGraph:
    """Fleet copies of agents, handoffs and tools, made once per original and kept."""

    def __init__(self) -> None:
        # By id of the original, holding it weakly: an application that builds its agents per
        # request does not grow this (a copy lives as long as its original, or its run state).
        self._agents: dict[int, tuple[weakref.ref[Agent[Any]], Agent[Any]]] = {}
        self._tools: dict[int, tuple[weakref.ref[FunctionTool], FunctionTool]] = {}
        self._gated: frozenset[str] = frozenset()
        """Lookup keys of the tools the fleet asks approval for on every call (the release
        gate of a declared effect class), as last read from the fleet's tool registry."""

    def gate(self, gated: Iterable[str]) -> None:
        """Ask the SDK's approval question for every call of these tools, as the fleet will.

        The fleet holds every call of a gated tool (``non_idempotent`` without a probe, or
        ``irreversible``) for a human; the runner asks it as the SDK asks, and tells the fleet
        the answer, instead of the call failing with FleetApprovalRequired.
        """
        self._gated = frozenset(gated)
        for ref, fleet in self._tools.values():
            original = ref()
            if original is not None:
                fleet.needs_approval = self._approval_of(original)

    def agent(self, original: Agent[Any]) -> Agent[Any]:
        """The fleet copy of ``original`` (itself if it already is one)."""
        if getattr(original, "_toolfleet_copy", False):
            return original
        known = self._agents.get(id(original))
        if known is not None and known[0]() is original:
            return known[1]
        clone = original.clone()
        clone._toolfleet_copy = True
        # Registered before its tools and handoffs are copied: the graph may have cycles.
        self._agents[id(original)] = (_forgotten_with(original, self._agents), clone)
        clone.tools = [self.tool(t) if isinstance(t, FunctionTool) else t for t in original.tools]
        clone.handoffs = [self._handoff(h) for h in original.handoffs]
        if original.mcp_servers:
            get_mcp_tools = original.get_mcp_tools

            async def fleet_mcp_tools(run_context: RunContextWrapper[Any]) -> list[Any]:
                # Listed anew on every turn: copied each time, not kept.
                listed = await get_mcp_tools(run_context)
                return [
                    self._fleet_function_tool(t) if isinstance(t, FunctionTool) else t
                    for t in listed
                ]

            # The servers stay on the agent (the SDK lists their tools and applies their
            # approval policies); only the invocation of each listed tool moves to the fleet.
            clone.get_mcp_tools = fleet_mcp_tools  # type: ignore[method-assign]
        return clone

    def check_state(self, state: RunState[Any, Any]) -> None:
        """Refuse a RunState that names the original agents: resumed as it is, the SDK would
        run its pending calls, and every later one, in this process instead of the fleet."""
        for agent in (state._current_agent, state._starting_agent):
            if agent is not None and not getattr(agent, "_toolfleet_copy", False):
                raise UserError(
                    "This RunState names the original agent, whose tools run in-process; "
                    "restore it with the fleet copy: RunState.from_string("
                    "runner.fleet_agent(agent), data)."
                )

    def tool(self, original: FunctionTool) -> FunctionTool:
        """The fleet copy of a function tool (an agent tool keeps running in the runner)."""
        known = self._tools.get(id(original))
        if known is not None and known[0]() is original:
            return known[1]
        origin = get_function_tool_origin(original)
        if origin is not None and origin.type == ToolOriginType.AGENT_AS_TOOL:
            fleet = self._agent_tool(original)
        else:
            fleet = self._fleet_function_tool(original)
        self._tools[id(original)] = (_forgotten_with(original, self._tools), fleet)
        return fleet

    def _fleet_function_tool(self, original: FunctionTool) -> FunctionTool:
        fleet = copy.copy(original)
        fleet.on_invoke_tool = functools.partial(invoke_on_fleet, original)
        # The worker applies the tool's timeout, failure_error_function and guardrails around
        # the body; the runner keeps only what must happen before a call is sent: input
        # guardrails that run before the approval question, if the run asks for that.
        fleet.needs_approval = self._approval_of(original)
        fleet.timeout_seconds = None
        fleet.tool_output_guardrails = None
        fleet.tool_input_guardrails = [
            _before_approval_only(g, original) for g in original.tool_input_guardrails or ()
        ] or None
        return fleet

    def _approval_of(self, original: FunctionTool) -> Any:
        if original.needs_approval is False and original.qualified_name in self._gated:
            return True
        return original.needs_approval

    def _agent_tool(self, original: FunctionTool) -> FunctionTool:
        fleet = copy.copy(original)
        invoke = original.on_invoke_tool

        async def run_nested(ctx: ToolContext[Any], arguments: str) -> Any:
            binding = current_binding()
            if binding is None:
                return await invoke(ctx, arguments)
            with bound(binding.nested(ctx.tool_call_id)):
                return await invoke(ctx, arguments)

        fleet.on_invoke_tool = run_nested
        nested = getattr(original, "_agent_instance", None)
        if isinstance(nested, Agent):
            # The SDK finds a nested agent's resumable state through this attribute.
            fleet._agent_instance = self.agent(nested)
        return fleet

    def _handoff(self, original: Agent[Any] | Handoff[Any, Any]) -> Any:
        if isinstance(original, Agent):
            return self.agent(original)
        fleet = copy.copy(original)
        invoke = original.on_invoke_handoff

        async def hand_over(ctx: RunContextWrapper[Any], arguments: str) -> Agent[Any]:
            return self.agent(await invoke(ctx, arguments))

        fleet.on_invoke_handoff = hand_over
        target = original._agent_ref() if original._agent_ref is not None else None
        if isinstance(target, Agent):
            # What the SDK reads to walk the graph (RunState restores agents by name).
            fleet._agent_ref = weakref.ref(self.agent(target))
        return fleet


def _forgotten_with(original: Any, memo: dict[int, Any]) -> weakref.ref[Any]:
    """A weak reference to ``original`` that drops its entry from ``memo`` when it goes."""
    key = id(original)

    def forget(ref: weakref.ref[Any]) -> None:
        if memo.get(key, (None,))[0] is ref:
            del memo[key]

    return weakref.ref(original, forget)


def _before_approval_only(
    guardrail: ToolInputGuardrail[Any], tool: FunctionTool
) -> ToolInputGuardrail[Any]:
    """``guardrail`` run by the runner only while the call's approval is undecided.

    With ``pre_approval_tool_input_guardrails`` the SDK runs input guardrails before it asks
    for approval, and again before the invocation; the second run happens on the worker, so
    the runner's copy lets a decided call through untouched. Without the setting the SDK calls
    it only before the invocation, where the call is decided or needs no decision: it passes
    here and runs on the worker.
    """

    async def check(data: ToolInputGuardrailData) -> Any:
        from agents.tool_guardrails import ToolGuardrailFunctionOutput

        ctx = data.context
        config = ctx.run_config
        pre_approval = bool(
            config is not None
            and config.tool_execution is not None
            and config.tool_execution.pre_approval_tool_input_guardrails
        )
        undecided = ctx.is_tool_approved(tool.name, ctx.tool_call_id) is None
        if pre_approval and undecided and await _asks_for_approval(tool, ctx):
            return await guardrail.run(data)
        return ToolGuardrailFunctionOutput.allow()

    return ToolInputGuardrail(guardrail_function=check, name=guardrail.name)


async def _asks_for_approval(tool: FunctionTool, ctx: ToolContext[Any]) -> bool:
    policy = tool.needs_approval
    if not callable(policy):
        return bool(policy)
    try:
        params = json.loads(ctx.tool_arguments or "{}")
    except ValueError:
        return True  # fails closed, as the SDK's evaluation does
    return bool(await policy(ctx, params, ctx.tool_call_id))


class _FleetAwareRunner(AgentRunner):
    """The SDK's default runner, swapping in fleet copies of agents inside a FleetRunner run.

    ``Agent.as_tool`` starts its nested run with ``Runner.run``/``run_streamed``, i.e. through
    the default agent runner, with the original nested agent; outside a FleetRunner run this
    runner only delegates.
    """

    def __init__(self, inner: AgentRunner, graph_of: Callable[[], FleetGraph | None]) -> None:
        self._inner = inner
        self._graph_of = graph_of

    def _swap(self, agent: Agent[Any], input: Any) -> tuple[Agent[Any], Any]:
        graph = self._graph_of()
        if graph is None:
            return agent, input
        if isinstance(input, RunState):
            graph.check_state(input)
        return graph.agent(agent), input

    async def run(self, starting_agent: Agent[Any], input: Any, **kwargs: Any) -> Any:
        return await self._inner.run(*self._swap(starting_agent, input), **kwargs)

    def run_sync(self, starting_agent: Agent[Any], input: Any, **kwargs: Any) -> Any:
        return self._inner.run_sync(*self._swap(starting_agent, input), **kwargs)

    def run_streamed(self, starting_agent: Agent[Any], input: Any, **kwargs: Any) -> Any:
        return self._inner.run_streamed(*self._swap(starting_agent, input), **kwargs)


def install_fleet_runner(graph_of: Callable[[], FleetGraph | None]) -> None:
    """Make the SDK's default agent runner fleet-aware (once per process)."""
    current = get_default_agent_runner()
    if not isinstance(current, _FleetAwareRunner):
        set_default_agent_runner(_FleetAwareRunner(current, graph_of))
