"""FleetRunner: the SDK's own runner, with the function tools of every agent run on the fleet.

``FleetRunner.run`` is ``Runner.run`` on the fleet copy of the agent graph (``FleetGraph``):
the SDK runs the agent loop — model calls, handoffs and their input filters, agent and run
guardrails, hooks, sessions, streaming, approvals and ``RunState``, agents as tools, MCP tool
listing, ``tool_use_behavior``, ``max_turns`` — exactly as in-process, and each function call
it would invoke goes to the fleet as a one-call turn (``invoke_on_fleet``), where the planner
records it in the ledger (so it runs at most once, whatever the runner does) and a worker runs
it with the tool's timeout, failure handler and guardrails.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from typing import TYPE_CHECKING, Any

from agents import Agent, RunConfig, RunContextWrapper, RunHooks, RunResult, RunResultStreaming
from agents.exceptions import UserError
from agents.items import TResponseInputItem
from agents.memory import Session
from agents.run import DEFAULT_MAX_TURNS, get_default_agent_runner

__all__ = ["DEFAULT_MAX_TURNS", "FleetRunner", "RunInput"]
from agents.run_state import RunState

from schemas import CancelRequest, TurnResult
from toolfleet.agents._calls import Binding, bound, current_binding
from toolfleet.agents._graph import FleetGraph, install_fleet_runner
from toolfleet.client import FleetClient

if TYPE_CHECKING:
    from kernel.stores.registry import ToolDirectory

RunInput = str | list[TResponseInputItem] | RunState[Any, Any]
"""What ``FleetRunner.run`` accepts as input, as ``Runner.run``."""


def _graph_of_current_run() -> FleetGraph | None:
    binding = current_binding()
    return binding.graph if binding is not None else None


class FleetRunner:
    """Runs SDK agents with their function tools executed by a toolfleet fleet.

    ``client`` must be started (``async with FleetClient(settings) as client``), except for
    ``run_sync``, which opens its own. The fleet must serve the function tools of every agent
    the run can reach (``ToolRegistry.from_function_tools(...)``). ``tenant_id`` scopes the
    call ledger; every run gets its own fleet run id (``run_id_of``).
    """

    def __init__(
        self,
        client: FleetClient,
        *,
        tenant_id: str,
        turn_timeout: float = 60.0,
        decision_timeout: float = 10.0,
        decided_by: str = "toolfleet.agents",
    ) -> None:
        self.client = client
        self.tenant_id = tenant_id
        self.turn_timeout = turn_timeout
        """Seconds to wait for one call's TurnResult."""
        self.decision_timeout = decision_timeout
        """Seconds to wait for the planner to record an approval given on a RunState."""
        self.decided_by = decided_by
        """Who the approvals this runner publishes for its runs name as their author."""
        self.graph = FleetGraph()
        """The fleet copies of the agents this runner has run."""
        self._directory: ToolDirectory | None = None
        install_fleet_runner(_graph_of_current_run)

    def fleet_agent(self, agent: Agent[Any]) -> Agent[Any]:
        """The fleet copy of ``agent`` this runner runs (same name and settings; its function
        tools run on the fleet). Restore a saved RunState with it:
        ``RunState.from_string(runner.fleet_agent(agent), data)``."""
        return self.graph.agent(agent)

    def run_id_of(self, run: RunResult | RunResultStreaming | RunState[Any, Any]) -> str:
        """The fleet run id of a run this runner made (to resume it after a restart)."""
        binding = _binding_of(run)
        if binding is None:
            raise UserError("This run was not made by a FleetRunner.")
        return binding.run_id

    def turn_results(
        self, run: RunResult | RunResultStreaming | RunState[Any, Any]
    ) -> list[TurnResult]:
        """The fleet's TurnResult of every call of a run, with status, effect and timings."""
        binding = _binding_of(run)
        return list(binding.turn_results) if binding is not None else []

    async def run(
        self,
        starting_agent: Agent[Any],
        input: RunInput,
        *,
        context: Any = None,
        max_turns: int = DEFAULT_MAX_TURNS,
        hooks: RunHooks[Any] | None = None,
        run_config: RunConfig | None = None,
        session: Session | None = None,
        run_id: str | None = None,
        **options: Any,
    ) -> RunResult:
        """``Runner.run`` with the function tools on the fleet.

        ``run_id`` names the fleet run; a resumption in the same process keeps the run's id by
        itself, one from a RunState restored from JSON in another process needs it passed
        (``run_id_of`` of the interrupted run), or its calls would get a new identity.
        ``options`` are the other keyword arguments of ``Runner.run``.
        """
        binding = self._binding_for(input, run_id)
        await self._read_gates()
        with bound(binding):
            try:
                result = await get_default_agent_runner().run(
                    self.graph.agent(starting_agent),
                    input,
                    context=context,
                    max_turns=max_turns,
                    hooks=hooks,
                    run_config=run_config,
                    session=session,
                    **options,
                )
            except asyncio.CancelledError:
                await self._cancel_on_fleet(binding)
                raise
        _remember(result.context_wrapper, binding)
        return result

    def run_streamed(
        self,
        starting_agent: Agent[Any],
        input: RunInput,
        *,
        context: Any = None,
        max_turns: int = DEFAULT_MAX_TURNS,
        hooks: RunHooks[Any] | None = None,
        run_config: RunConfig | None = None,
        session: Session | None = None,
        run_id: str | None = None,
        **options: Any,
    ) -> RunResultStreaming:
        """``Runner.run_streamed`` with the function tools on the fleet: the SDK's events, in
        the SDK's order, each tool output as the fleet returns it.

        The fleet's release gate is known as of this runner's last ``run`` (the stream starts
        without waiting for a read); a gated call it does not know of fails the run with
        FleetApprovalRequired rather than running unapproved."""
        binding = self._binding_for(input, run_id)
        with bound(binding):  # the SDK's run task copies the binding when it is created
            streamed = get_default_agent_runner().run_streamed(
                self.graph.agent(starting_agent),
                input,
                context=context,
                max_turns=max_turns,
                hooks=hooks,
                run_config=run_config,
                session=session,
                **options,
            )
        _remember(streamed.context_wrapper, binding)
        return streamed

    def run_sync(self, starting_agent: Agent[Any], input: RunInput, **kwargs: Any) -> RunResult:
        """``Runner.run_sync``: ``run`` on a new event loop, with a client of its own."""
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop()
            raise UserError(
                "run_sync cannot be called from a running event loop; await FleetRunner.run."
            )

        async def main() -> RunResult:
            async with FleetClient(self.client.settings) as client:
                own = FleetRunner(
                    client,
                    tenant_id=self.tenant_id,
                    turn_timeout=self.turn_timeout,
                    decision_timeout=self.decision_timeout,
                    decided_by=self.decided_by,
                )
                own.graph = self.graph
                return await own.run(starting_agent, input, **kwargs)

        return asyncio.run(main())

    async def _read_gates(self) -> None:
        """Read which tools the fleet gates (at most every few seconds: the directory caches)."""
        from kernel.adapters.redis import connect_redis
        from kernel.stores.keys import Keys
        from kernel.stores.registry import ToolDirectory

        if self._directory is None:
            settings = self.client.settings
            self._directory = ToolDirectory(connect_redis(settings), Keys.of(settings))
        specs = await self._directory.specs()
        self.graph.gate(key for key, spec in specs.items() if spec.needs_approval == "always")

    def _binding_for(self, input: RunInput, run_id: str | None) -> Binding:
        if isinstance(input, RunState):
            known = _binding_of(input)
            if known is not None and run_id in (None, known.run_id):
                return dataclasses.replace(known, client=self.client, graph=self.graph)
            if run_id is None:
                raise UserError(
                    "Resuming a RunState this FleetRunner did not make: pass run_id= (the "
                    "interrupted run's FleetRunner.run_id_of) so its calls keep their identity "
                    "on the fleet."
                )
        return Binding(
            client=self.client,
            tenant_id=self.tenant_id,
            run_id=run_id or f"run-{uuid.uuid4().hex}",
            turn_timeout=self.turn_timeout,
            decision_timeout=self.decision_timeout,
            decided_by=self.decided_by,
            graph=self.graph,
        )

    async def _cancel_on_fleet(self, binding: Binding) -> None:
        """Parent cancellation: nothing of the run may start any more, on any worker."""
        request = CancelRequest(
            tenant_id=binding.tenant_id, run_id=binding.run_id, reason="agent run cancelled"
        )
        with contextlib.suppress(Exception):
            await asyncio.shield(self.client.cancel(request))


_BINDING_ATTRIBUTE = "_toolfleet_binding"
"""Where a run's context wrapper carries its binding: the SDK copies the wrapper's attributes
into the RunState it makes (``to_state``), so an in-process resumption finds its run id."""


def _remember(context: RunContextWrapper[Any], binding: Binding) -> None:
    setattr(context, _BINDING_ATTRIBUTE, binding)


def _binding_of(run: Any) -> Binding | None:
    # A RunState keeps its context wrapper only in ``_context``.
    context = run._context if isinstance(run, RunState) else run.context_wrapper
    found = getattr(context, _BINDING_ATTRIBUTE, None)
    return found if isinstance(found, Binding) else None
