"""FleetRunner: the SDK's own runner, with the function tools of every agent run on the fleet.

``FleetRunner.run`` is ``Runner.run`` on the application's own agents: the SDK runs the agent
loop — model calls, handoffs and their input filters, agent and run guardrails, hooks,
sessions, streaming, approvals and ``RunState``, agents as tools, MCP tool listing,
``tool_use_behavior``, ``max_turns`` — exactly as in-process, and each function call it
invokes goes to the fleet (see ``toolfleet.agents._sdk``), where the planner records it in the
ledger (so it runs at most once, whatever the runner does) and a worker runs it with the
tool's timeout, failure handler and guardrails.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from typing import Any

from agents import Agent, RunConfig, RunHooks, RunResult, RunResultStreaming
from agents.exceptions import (
    UserError,
    _detach_data_redacted_error_traceback,
    _is_error_data_redacted,
    _prepare_data_redacted_error,
    _raise_data_redacted_error,
)
from agents.items import TResponseInputItem
from agents.memory import Session
from agents.run import (
    DEFAULT_MAX_TURNS,
    _data_redacted_sync_cancellation_source,
    get_default_agent_runner,
)
from agents.run_state import RunState

from schemas import CancelRequest, TurnResult
from toolfleet.agents._calls import Binding, bound
from toolfleet.agents._sdk import binding_of, identity_of, install, remember
from toolfleet.client import FleetClient
from toolfleet.serving import GatingToolServer, current_tool_server

__all__ = ["DEFAULT_MAX_TURNS", "FleetRunner", "RunInput"]

RunInput = str | list[TResponseInputItem] | RunState[Any, Any]
"""What ``FleetRunner.run`` accepts as input, as ``Runner.run``."""

install()


class FleetRunner:
    """Runs SDK agents with their function tools executed by a toolfleet fleet.

    ``client`` must be started (``async with FleetClient(settings) as client``), except for
    ``run_sync``, which opens its own. The fleet must serve the function tools of every agent
    the run can reach (``ToolRegistry.from_function_tools(...)``); a call of a tool it does
    not serve fails the run with ``FleetToolNotServed`` (it never runs in this process).
    ``tenant_id`` scopes the call ledger; every run gets its own fleet run id (``run_id_of``),
    which travels inside the RunStates it makes.
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
        """Seconds to wait for the TurnResult of the calls the runner sent together."""
        self.decision_timeout = decision_timeout
        """Unused: a decision now travels with the calls it decides (kept for callers that
        pass it)."""
        self.decided_by = decided_by
        """Who the decisions this runner signs for its runs name as their author."""
        self._gated: frozenset[str] = frozenset()

    def fleet_agent(self, agent: Agent[Any]) -> Agent[Any]:
        """``agent`` itself: FleetRunner runs the application's own agents (kept for code
        written when it ran copies of them)."""
        return agent

    def run_id_of(self, run: RunResult | RunResultStreaming | RunState[Any, Any]) -> str:
        """The fleet run id of a run this runner made, or of a RunState restored from one."""
        identity = identity_of(_context_of(run))
        if identity is None:
            raise UserError("This run was not made by a FleetRunner.")
        return identity.run_id

    def turn_results(
        self, run: RunResult | RunResultStreaming | RunState[Any, Any]
    ) -> list[TurnResult]:
        """The fleet's TurnResult of every call of a run, with status, effect and timings
        (for ``run_streamed``: those arrived when it is read; ``run`` waits for all)."""
        binding = binding_of(_context_of(run))
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

        ``run_id`` names the fleet run; a resumed RunState keeps its run's id by itself, in
        this process or, restored with ``RunState.from_json`` / ``from_string``, in another.
        ``options`` are the other keyword arguments of ``Runner.run``.
        """
        binding = self._binding_for(input, run_id)
        if not isinstance(current_tool_server(), GatingToolServer):
            # A test fleet says each tool's gate when the call is evaluated (``_sdk._gated``).
            await self._read_gates()
        binding.gated = self._gated
        with bound(binding):
            try:
                result = await get_default_agent_runner().run(
                    starting_agent,
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
        with contextlib.suppress(TimeoutError):
            # Every call has its answer; its turn's TurnResult follows right behind.
            await asyncio.wait_for(asyncio.shield(binding.settled()), self.turn_timeout)
        remember(result.context_wrapper, binding)
        return result

    def run_streamed(  # noqa: PLR0917 - Runner.run_streamed's own positional arguments
        self,
        starting_agent: Agent[Any],
        input: RunInput,
        context: Any = None,
        max_turns: int = DEFAULT_MAX_TURNS,
        hooks: RunHooks[Any] | None = None,
        run_config: RunConfig | None = None,
        previous_response_id: str | None = None,
        auto_previous_response_id: bool = False,
        conversation_id: str | None = None,
        session: Session | None = None,
        *,
        error_handlers: Any = None,
        run_id: str | None = None,
        **options: Any,
    ) -> RunResultStreaming:
        """``Runner.run_streamed`` with the function tools on the fleet: the SDK's events, in
        the SDK's order, each tool output as soon as the fleet reports it. Its arguments are
        ``Runner.run_streamed``'s, in its order (positional ones included).

        The fleet's release gate is known as of this runner's last ``run`` (the stream starts
        without waiting for a read), or, under a test fleet that says its tools' gates
        (``toolfleet.serving.GatingToolServer``), as of each call; a gated call it does not
        know of fails the run with FleetApprovalRequired rather than running unapproved."""
        binding = self._binding_for(input, run_id)
        binding.gated = self._gated
        with bound(binding):  # the SDK's run task copies the binding when it is created
            streamed = get_default_agent_runner().run_streamed(
                starting_agent,
                input,
                context=context,
                max_turns=max_turns,
                hooks=hooks,
                run_config=run_config,
                previous_response_id=previous_response_id,
                auto_previous_response_id=auto_previous_response_id,
                conversation_id=conversation_id,
                session=session,
                error_handlers=error_handlers,
                **options,
            )
        wrapper = getattr(streamed, "context_wrapper", None)  # a replaced default runner's result
        if wrapper is not None:
            remember(wrapper, binding)
        return streamed

    def run_sync(self, starting_agent: Agent[Any], input: RunInput, **kwargs: Any) -> RunResult:
        """``Runner.run_sync``: ``run`` on a new event loop, with a client of its own.

        Under a test fleet that runs on an event loop of its own (``toolfleet.serving``: a
        tool server naming its ``loop``), ``run`` goes on that loop while it is idle, with this
        runner's client (the fleet's): a new loop would reach a fleet that does not move.
        """
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop()
            raise UserError(
                "run_sync cannot be called from a running event loop; await FleetRunner.run."
            )
        redacted: BaseException | None = None
        try:
            return self._run_sync(starting_agent, input, **kwargs)
        except BaseException as error:
            redacted = _redacted(error)
            if redacted is None:
                raise
        # As the SDK's run_sync: an error the SDK marked as carrying no payload data is raised
        # from here, detached from the caller's frames and from the exception it was handling.
        _raise_data_redacted_error(redacted)

    def _run_sync(self, starting_agent: Agent[Any], input: RunInput, **kwargs: Any) -> RunResult:
        fleet_loop = getattr(current_tool_server(), "loop", None)
        if isinstance(fleet_loop, asyncio.AbstractEventLoop) and not (
            fleet_loop.is_running() or fleet_loop.is_closed()
        ):
            return fleet_loop.run_until_complete(self.run(starting_agent, input, **kwargs))

        async def main() -> RunResult:
            async with FleetClient(self.client.settings) as client:
                own = FleetRunner(
                    client,
                    tenant_id=self.tenant_id,
                    turn_timeout=self.turn_timeout,
                    decided_by=self.decided_by,
                )
                return await own.run(starting_agent, input, **kwargs)

        return asyncio.run(main())

    async def _read_gates(self) -> None:
        """Which tools the fleet gates, from the tool directory the client keeps (the workers
        announce their tools on Kafka; a gated tool not read yet is held by the planner)."""
        specs = await self.client.tool_specs()
        self._gated = frozenset(
            key for key, spec in specs.items() if spec.needs_approval == "always"
        )

    def _binding_for(self, input: RunInput, run_id: str | None) -> Binding:
        if isinstance(input, RunState):
            known = binding_of(input._context)
            if known is not None and run_id in (None, known.run_id):
                return dataclasses.replace(known, client=self.client, _open={}, asked={})
            identity = identity_of(input._context)
            if identity is not None and identity.tenant_id != self.tenant_id:
                raise UserError(
                    f"This RunState is of run {identity.run_id} of tenant {identity.tenant_id}; "
                    f"resume it with a FleetRunner of that tenant, not {self.tenant_id}."
                )
            if identity is not None and run_id is None:
                run_id = identity.run_id
        return Binding(
            client=self.client,
            tenant_id=self.tenant_id,
            run_id=run_id or f"run-{uuid.uuid4().hex}",
            turn_timeout=self.turn_timeout,
            decided_by=self.decided_by,
        )

    async def _cancel_on_fleet(self, binding: Binding) -> None:
        """Parent cancellation: nothing of the run may start any more, on any worker."""
        request = CancelRequest(
            tenant_id=binding.tenant_id, run_id=binding.run_id, reason="agent run cancelled"
        )
        with contextlib.suppress(Exception):
            await asyncio.shield(self.client.cancel(request))


def _redacted(error: BaseException) -> BaseException | None:
    """What ``AgentRunner.run_sync`` raises instead of ``error`` when the SDK marked it (or the
    cancellation it wraps) as data-redacted, detached; None for any other error."""
    if _is_error_data_redacted(error):
        _detach_data_redacted_error_traceback(error)
        return error
    source = _data_redacted_sync_cancellation_source(error)
    if source is None:
        return None
    prepared = _prepare_data_redacted_error(source)
    _detach_data_redacted_error_traceback(prepared)
    return prepared


def _context_of(run: Any) -> Any:
    # A RunState keeps its context wrapper only in ``_context``.
    return run._context if isinstance(run, RunState) else run.context_wrapper
