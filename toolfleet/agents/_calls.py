"""One function call of an SDK run, sent to the fleet and answered from its TurnResult.

The SDK's own runner decides everything around a call (approvals, handoffs, guardrails, hooks,
concurrency, which failure fails the run); what it would do in-process — invoke the tool's
function — is replaced by ``invoke_on_fleet``: the calls the runner starts together are
submitted as one ModelResponseEvent of the run (a ``Batch``), and the output the fleet's worker
produced for each (with the tool's own ``failure_error_function``, timeout and guardrails,
applied on the worker) is returned to the runner as that tool's result.

The identity of a call on the fleet is (tenant, fleet run id, call_id). The fleet run id is
bound for the duration of a ``FleetRunner`` run (``current_binding``); an agent used as a tool
runs its nested agent under ``<run id>/<call_id of the agent tool's call>``, so two parallel
calls of one agent tool never share identities, and a nested call id equal to one of the
parent's never collides with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from agents import FunctionTool
from agents.exceptions import UserError
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall

from schemas import (
    AgentRef,
    ApprovalDecision,
    CancelRequest,
    ModelResponseEvent,
    TurnConfig,
    TurnResult,
)
from toolfleet.agents._errors import FleetApprovalRequired, FleetRunCancelled, run_error

if TYPE_CHECKING:
    from toolfleet.agents._graph import FleetGraph
    from toolfleet.client import FleetClient


@dataclass
class Binding:
    """What the fleet calls of one run need: where to send them and under which identity."""

    client: FleetClient
    tenant_id: str
    run_id: str
    turn_timeout: float
    decision_timeout: float
    decided_by: str
    graph: FleetGraph
    """The fleet copies of the run's agents (nested runs swap theirs in from it)."""
    turn_results: list[TurnResult] = field(default_factory=list)
    """Every TurnResult of the run's calls (shared with nested runs), in arrival order."""

    _open: dict[str, Batch] = field(default_factory=dict)
    """Per agent, the batch of calls still accepting calls started in the same step."""

    def nested(self, call_id: str) -> Binding:
        """The binding of an agent tool's nested run, for its call ``call_id``."""
        return replace(self, run_id=f"{self.run_id}/{call_id}", _open={})

    def batch_for(self, agent_name: str) -> Batch:
        """The open batch of ``agent_name``'s calls (a new one if none is open)."""
        batch = self._open.get(agent_name)
        if batch is None:
            batch = self._open[agent_name] = Batch(self, agent_name)
        return batch

    def close_batch(self, batch: Batch) -> None:
        """Stop adding calls to ``batch``: it is being sent."""
        if self._open.get(batch.agent_name) is batch:
            del self._open[batch.agent_name]


_BINDING: ContextVar[Binding | None] = ContextVar("toolfleet_agents_binding", default=None)


def current_binding() -> Binding | None:
    """The binding of the FleetRunner run this task belongs to, if any."""
    return _BINDING.get()


@contextlib.contextmanager
def bound(binding: Binding) -> Any:
    """Bind ``binding`` for the code (and the tasks it creates) inside the block."""
    token = _BINDING.set(binding)
    try:
        yield binding
    finally:
        _BINDING.reset(token)


def fleet_turn_id(call_id: str) -> int:
    """The fleet turn of the calls a runner sent together, named by the first one's call_id:
    stable, so a resubmission finds its turn (``FleetClient.result(run_id, turn_id)``)."""
    return int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:6], "big")


async def invoke_on_fleet(tool: FunctionTool, ctx: ToolContext[Any], arguments: str) -> str:
    """Run one call of ``tool`` on the fleet; its model-visible output.

    The calls the runner starts together (those of one model response, up to the run's
    ``max_function_tool_concurrency``) travel as one fleet turn, so they are planned together
    and their results come back together: when several fail, the run error is the one the
    fleet chose among all of them (BaseException-class first, then model order), never the
    one whose worker happened to answer first. A call the runner approved
    (``RunState.approve``) is recorded as approved on the fleet first, so the planner does not
    ask again. A failed call raises the SDK exception the in-process run would have raised.
    """
    binding = current_binding()
    if binding is None:
        raise UserError(
            f"tool {tool.name} is a fleet tool of toolfleet.agents.FleetRunner; it runs only "
            "inside FleetRunner.run, run_streamed or run_sync"
        )
    call = _call_of(ctx, arguments)
    approved = ctx.is_tool_approved(tool.name, call.call_id) is True
    agent_name = getattr(ctx.agent, "name", None) or "agent"
    batch = binding.batch_for(agent_name)
    batch.add(call, tool, approved=approved)
    try:
        result = await asyncio.shield(batch.result)
    except asyncio.CancelledError:
        # The runner cancelled this call (a sibling failed, or the run was cancelled): nothing
        # of it may start any more on any worker.
        batch.leave()
        request = CancelRequest(
            tenant_id=binding.tenant_id,
            run_id=binding.run_id,
            call_id=call.call_id,
            reason="tool call cancelled by the agent runner",
        )
        with contextlib.suppress(Exception):
            await asyncio.shield(binding.client.cancel(request))
        raise
    return _output_of(binding, result, call, tool)


def _output_of(
    binding: Binding, result: TurnResult, call: ResponseFunctionToolCall, tool: FunctionTool
) -> str:
    """This call's part of its fleet turn's result."""
    if result.status == "cancelled":
        raise FleetRunCancelled(f"run {binding.run_id} was cancelled on the fleet")
    failed = result.status == "failed" and result.error is not None
    if failed and result.error is not None and result.error.call_id in (call.call_id, None):
        raise run_error(result.error, [call], [tool])
    output = next((o.output for o in result.outputs if o.call_id == call.call_id), None)
    if output is not None:
        return output
    if any(i.call_id == call.call_id for i in result.interruptions):
        lookup = f"{call.namespace}.{call.name}" if call.namespace else call.name
        raise FleetApprovalRequired(
            f"the fleet holds call {call.call_id} of tool {lookup} for an operator's approval "
            f"(run {binding.run_id}); see `toolfleet inspect` and `toolfleet tasks` for why, "
            "decide it with FleetClient.decide, then run the agent again"
        )
    # A sibling's failure failed the turn before this call produced anything: as in-process,
    # where the runner cancels the siblings of the call that fails the run.
    raise asyncio.CancelledError


class Batch:
    """The calls one agent of a run starts in one step of the event loop: one fleet turn."""

    def __init__(self, binding: Binding, agent_name: str) -> None:
        self.binding = binding
        self.agent_name = agent_name
        self.calls: list[tuple[ResponseFunctionToolCall, FunctionTool, bool]] = []
        self.result: asyncio.Future[TurnResult] = asyncio.get_running_loop().create_future()
        # Retrieved even when every call has left, so an unread failure is not reported.
        self.result.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._task: asyncio.Task[None] | None = None
        self._waiting = 0

    def add(self, call: ResponseFunctionToolCall, tool: FunctionTool, *, approved: bool) -> None:
        """Join a call; the batch is sent once the tasks started with it have joined too."""
        self.calls.append((call, tool, approved))
        self._waiting += 1
        if len(self.calls) == 1:
            # The runner creates the tasks of a response's calls together; each reaches this
            # point in its first step, before the loop runs anything scheduled later.
            asyncio.get_running_loop().call_soon(self._send)

    def leave(self) -> None:
        """A call no longer waits (cancelled); the last one to leave stops the wait."""
        self._waiting -= 1
        if self._waiting == 0 and self._task is not None:
            self._task.cancel()

    def _send(self) -> None:
        self.binding.close_batch(self)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        binding = self.binding
        try:
            for call, _, approved in self.calls:
                if approved:
                    lookup = f"{call.namespace}.{call.name}" if call.namespace else call.name
                    await _record_approval(binding, call.call_id, lookup)
            first = self.calls[0][0].call_id
            event = ModelResponseEvent(
                tenant_id=binding.tenant_id,
                run_id=binding.run_id,
                turn_id=fleet_turn_id(first),
                agent=AgentRef(name=self.agent_name),
                response_id=f"calls-{first}",
                items=[_wire(call) for call, _, _ in self.calls],
                # A resumption every time: calls sent again (the runner restarted from a saved
                # state) get a new plan epoch, so their turn answers again (from the ledger).
                resume=True,
                config=TurnConfig(failure_policy="error_as_output", tool_not_found="raise_error"),
            )
            result = await binding.client.run_turn(event, within=binding.turn_timeout)
        except asyncio.CancelledError:
            self.result.cancel()
            raise
        except Exception as exc:  # every waiting call learns why
            self.result.set_exception(exc)
        else:
            binding.turn_results.append(result)
            self.result.set_result(result)


def _call_of(ctx: ToolContext[Any], arguments: str) -> ResponseFunctionToolCall:
    if isinstance(ctx.tool_call, ResponseFunctionToolCall):
        return ctx.tool_call
    return ResponseFunctionToolCall(
        type="function_call",
        call_id=ctx.tool_call_id,
        name=ctx.tool_name,
        arguments=arguments,
        namespace=ctx.tool_namespace,
    )


def _wire(call: ResponseFunctionToolCall) -> dict[str, Any]:
    item: dict[str, Any] = {
        "type": "function_call",
        "call_id": call.call_id,
        "name": call.name,
        "arguments": call.arguments,
    }
    if call.namespace:
        item["namespace"] = call.namespace
    return item


async def _record_approval(binding: Binding, call_id: str, tool: str) -> None:
    """Publish the runner's approval of a call; wait until the planner has recorded it.

    Decisions and model responses travel on different topics, so the call could overtake its
    decision; the planner would then ask again. The wait makes the submission see it.
    """
    from kernel.adapters.redis import connect_redis
    from kernel.stores.keys import Keys

    settings = binding.client.settings
    redis = connect_redis(settings)
    key = Keys.of(settings).approvals(binding.tenant_id, binding.run_id)
    try:
        if await _approved(redis, key, call_id):
            return  # decided before (a resubmission)
        await binding.client.decide(
            ApprovalDecision(
                tenant_id=binding.tenant_id,
                run_id=binding.run_id,
                call_id=call_id,
                tool_name=tool,
                approve=True,
                decided_by=binding.decided_by,
            )
        )
        deadline = time.monotonic() + binding.decision_timeout
        while not await _approved(redis, key, call_id):
            if time.monotonic() > deadline:
                raise UserError(
                    f"the planner did not record the approval of {call_id} within "
                    f"{binding.decision_timeout:g} s; is it running?"
                )
            await asyncio.sleep(0.02)  # polling interval of a deadline-bounded wait
    finally:
        await redis.aclose()


async def _approved(redis: Any, key: str, call_id: str) -> bool:
    raw = await redis.hget(key, f"call:{call_id}")
    return raw is not None and bool(json.loads(raw)["approve"])
