"""One function call of an SDK run, sent to the fleet and answered when it settles.

The SDK's own runner decides everything around a call (approvals, handoffs, guardrails, hooks,
concurrency, which failure fails the run); what it would do in-process — invoke the tool's
function — is replaced by ``invoke_on_fleet``: the calls the runner starts together are
submitted as one ModelResponseEvent of the run (a ``Batch``, one fleet turn, which the
aggregator answers with one TurnResult), and each call is answered as soon as the fleet reports
that it settled with an output, so a fast call does not wait for its slowest sibling. A call
whose failure fails the run is answered by the turn's TurnResult, where the fleet has chosen
among all the turn's failures.

Every call carries the SDK's approval outcome, signed: a person's approval
(``RunState.approve``), or the tool's policy asking for none (``by_policy``), so the worker
never evaluates a ``needs_approval`` the runner already evaluated, and no client waits for a
decision to reach another service before it sends the call.

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
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from agents import FunctionTool
from agents._tool_identity import normalize_tool_call_for_function_tool
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall

from kernel.rules.texts import TOOL_NOT_IN_AGENT
from schemas import (
    AgentRef,
    ApprovalDecision,
    CallError,
    CallOutcome,
    CancelRequest,
    GuardrailVerdict,
    ModelResponseEvent,
    TurnConfig,
    TurnResult,
)
from toolfleet.agents._context import BatchContext, RunContextSync, call_order, context_sync
from toolfleet.agents._errors import (
    FleetApprovalRequired,
    FleetRunCancelled,
    FleetToolNotServed,
    run_error,
)
from toolfleet.serving import current_tool_server

if TYPE_CHECKING:
    from toolfleet.client import FleetClient


@dataclass
class Binding:
    """What the fleet calls of one run need: where to send them and under which identity."""

    client: FleetClient
    tenant_id: str
    run_id: str
    turn_timeout: float
    decided_by: str
    gated: frozenset[str] = frozenset()
    """Lookup keys of the tools the fleet holds every call of for a person (the release
    gate), as last read: the runner asks the SDK's approval question for them."""
    turn_results: list[TurnResult] = field(default_factory=list)
    """Every TurnResult of the run's calls (shared with nested runs), in arrival order."""
    batches: set[asyncio.Task[None]] = field(default_factory=set)
    """The run's batches still waiting for their TurnResult (shared with nested runs)."""
    asked: dict[str, bool] = field(default_factory=dict)
    """Per call_id, whether the SDK's last approval evaluation asked a person."""
    input_results: dict[str, list[Any]] = field(default_factory=dict)
    """Per call_id, the SDK's list of tool input guardrail results the call's verdicts from
    the worker go to (given where the SDK would have run them)."""
    pending_output: dict[str, FleetAnswer | BaseException] = field(default_factory=dict)
    """Per call_id, what the call's output guardrails said on the worker, for the point
    where the SDK runs them: the answer they let through, or the tripwire they raised."""
    contexts: dict[int, RunContextSync] = field(default_factory=dict)
    """Per run context object (by id), the copies its calls carry and where their changes
    go (shared with nested runs, which share the context)."""

    _open: dict[str, Batch] = field(default_factory=dict)
    """Per agent, the batch of calls still accepting calls started in the same step."""

    def nested(self, call_id: str) -> Binding:
        """The binding of an agent tool's nested run, for its call ``call_id``."""
        return replace(
            self,
            run_id=f"{self.run_id}/{call_id}",
            asked={},
            input_results={},
            pending_output={},
            _open={},
        )

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

    async def settled(self) -> None:
        """Wait until every batch of the run has its TurnResult (or gave up waiting)."""
        while self.batches:
            await asyncio.gather(*self.batches, return_exceptions=True)


_BINDING: ContextVar[Binding | None] = ContextVar("toolfleet_agents_binding", default=None)


def current_binding() -> Binding | None:
    """The binding of the FleetRunner run this task belongs to, if any."""
    return _BINDING.get()


@contextlib.contextmanager
def bound(binding: Binding) -> Iterator[Binding]:
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


def lookup_key(call: ResponseFunctionToolCall) -> str:
    """The name the fleet's registry knows a call's tool by (``namespace.name`` or ``name``)."""
    return f"{call.namespace}.{call.name}" if call.namespace else call.name


@dataclass(frozen=True)
class FleetAnswer:
    """A call's answer from the fleet: what the model sees, and the verdicts of the tool's
    guardrails, which ran on the worker."""

    output: str
    guardrails: list[GuardrailVerdict] = field(default_factory=list)
    value: str | None = None
    """The tool's return value as JSON when it was not text (see ``returned``)."""
    status: str = "succeeded"
    """The call's status on the fleet (``failed``: a failure handler's text, ...)."""
    error: CallError | None = None
    """What the tool raised, when a failure handler made ``output`` of it."""

    def rejected(self, kind: str) -> bool:
        """Whether a guardrail of ``kind`` replaced the output with its rejection text."""
        return any(
            v.kind == kind and v.behavior in ("reject_content", "wrong_effect")
            for v in self.guardrails
        )


_VERDICTS_ATTRIBUTE = "_toolfleet_guardrails"


def verdicts_of(exc: BaseException) -> list[GuardrailVerdict]:
    """The guardrail verdicts of the failed call an exception of ``invoke_on_fleet`` stands
    for (empty when none ran)."""
    found = getattr(exc, _VERDICTS_ATTRIBUTE, None)
    return list(found) if isinstance(found, list) else []


async def invoke_on_fleet(
    binding: Binding, tool: FunctionTool, ctx: ToolContext[Any], arguments: str
) -> FleetAnswer:
    """Run one call of ``tool`` on the fleet; its model-visible output and guardrail verdicts.

    The calls the runner starts together (those of one model response, up to the run's
    ``max_function_tool_concurrency``) travel as one fleet turn, each with the SDK's approval
    outcome signed beside it. Each returns as soon as the fleet reports its output; a failed
    call raises the SDK exception the in-process run would have raised, once the turn's
    result says which failure the fleet chose among all of the turn's (BaseException-class
    first, then model order), never the one whose worker happened to answer first.
    """
    # A deferred top-level tool's call can name the tool as its own namespace: the fleet
    # knows it by its name alone, as the SDK dispatches it.
    call = normalize_tool_call_for_function_tool(_call_of(ctx, arguments), tool)
    # The SDK invokes a tool only when its approval evaluation in this run said "invoke"
    # (``binding.asked`` False), or a person approved the call: a decision the SDK scopes to
    # an agent, which ``is_tool_approved`` (by name) does not see, is one too.
    approved_by_person = (
        binding.asked.get(call.call_id) is not False
        or ctx.is_tool_approved(tool.name, call.call_id) is True
    )
    decision = binding.client.auth.sign(
        ApprovalDecision(
            tenant_id=binding.tenant_id,
            run_id=binding.run_id,
            call_id=call.call_id,
            tool_name=lookup_key(call),
            approve=True,
            decided_by=binding.decided_by,
            by_policy=None if approved_by_person else True,
        )
    )
    agent_name = getattr(ctx.agent, "name", None) or "agent"
    batch = binding.batch_for(agent_name)
    batch.carry_context(ctx)
    answer = batch.add(call, tool, decision)
    try:
        return await asyncio.shield(answer)
    except _SiblingFailed:
        # A sibling's failure failed the turn before this call produced anything: as
        # in-process, where the runner cancels the siblings of the call that fails the run.
        raise asyncio.CancelledError from None
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
        # Sent beside the cancellation, not awaited before it: as in-process, the call's task
        # (and its function span) ends as soon as the runner cancels it, and the run waits for
        # the request with its batches (``Binding.settled``).
        sending = asyncio.get_running_loop().create_task(_cancel_quietly(binding, request))
        binding.batches.add(sending)
        sending.add_done_callback(binding.batches.discard)
        raise


async def _cancel_quietly(binding: Binding, request: CancelRequest) -> None:
    with contextlib.suppress(Exception):
        await binding.client.cancel(request)


class _SiblingFailed(Exception):
    """Internal: the call's turn failed on another call's failure; the call has no output."""


@dataclass
class _Pending:
    call: ResponseFunctionToolCall
    tool: FunctionTool
    decision: ApprovalDecision
    answer: asyncio.Future[FleetAnswer]


class Batch:
    """The calls one agent of a run starts in one step of the event loop: one fleet turn."""

    def __init__(self, binding: Binding, agent_name: str) -> None:
        self.binding = binding
        self.agent_name = agent_name
        self.calls: list[_Pending] = []
        self._task: asyncio.Task[None] | None = None
        self._waiting = 0
        self.context: BatchContext | None = None
        """The run context the calls carry, and where their changes to it go."""

    def carry_context(self, ctx: ToolContext[Any]) -> None:
        """A call of the batch carries a copy of the run's context (one copy per batch)."""
        if self.context is None:
            limit = self.binding.client.settings.max_argument_bytes
            sync = context_sync(self.binding.contexts, ctx.context, limit=limit)
            self.context = sync.batch(agent=self.agent_name, tool_input=ctx.tool_input)
        self.context.join(ctx.tool_call_id, call_order())

    def _context_back(self, pending: _Pending, changes: str | None) -> None:
        """Apply what a call changed in its copy of the run context, as it is answered."""
        if self.context is not None:
            self.context.apply(pending.call.call_id, changes)

    def add(
        self, call: ResponseFunctionToolCall, tool: FunctionTool, decision: ApprovalDecision
    ) -> asyncio.Future[FleetAnswer]:
        """Join a call; the batch is sent once the tasks started with it have joined too.
        Returns the future of the call's answer."""
        answer: asyncio.Future[FleetAnswer] = asyncio.get_running_loop().create_future()
        # Retrieved even when nobody waits any more, so an unread failure is not reported.
        answer.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.calls.append(_Pending(call, tool, decision, answer))
        self._waiting += 1
        if len(self.calls) == 1:
            # The runner creates the tasks of a response's calls together; each reaches this
            # point in its first steps, before the loop runs anything scheduled later.
            asyncio.get_running_loop().call_soon(self._send)
        return answer

    def leave(self) -> None:
        """A call no longer waits (cancelled); the last one to leave stops the wait."""
        self._waiting -= 1
        if self._waiting == 0 and self._task is not None:
            self._task.cancel()

    def _send(self) -> None:
        self.binding.close_batch(self)
        self._task = asyncio.get_running_loop().create_task(self._run())
        self.binding.batches.add(self._task)
        self._task.add_done_callback(self.binding.batches.discard)

    async def _run(self) -> None:
        binding = self.binding
        first = self.calls[0].call.call_id
        event = ModelResponseEvent(
            tenant_id=binding.tenant_id,
            run_id=binding.run_id,
            turn_id=fleet_turn_id(first),
            agent=AgentRef(name=self.agent_name),
            response_id=f"calls-{first}",
            items=[_wire(p.call) for p in self.calls],
            # A resumption every time: calls sent again (the runner restarted from a saved
            # state) get a new plan epoch, so their turn answers again (from the ledger).
            resume=True,
            config=TurnConfig(failure_policy="error_as_output", tool_not_found="raise_error"),
            decisions=[p.decision for p in self.calls],
            run_context=self.context.copy if self.context is not None else None,
        )
        stop_following = None
        try:
            server = current_tool_server()
            if server is not None:  # a test fleet serving the application's own objects
                for pending in self.calls:
                    await server.ensure_served(pending.tool)
            stop_following = await binding.client.follow(
                event.run_id, event.turn_id, self._on_outcome, tenant_id=event.tenant_id
            )
            result = await binding.client.run_turn(event, within=binding.turn_timeout)
        except asyncio.CancelledError:
            for pending in self.calls:
                pending.answer.cancel()
            raise
        except Exception as exc:  # every call still waiting learns why
            for pending in self.calls:
                if not pending.answer.done():
                    pending.answer.set_exception(exc)
        else:
            binding.turn_results.append(result)
            for pending in self.calls:
                if not pending.answer.done():
                    record = next(
                        (r for r in result.calls if r.call_id == pending.call.call_id), None
                    )
                    self._context_back(pending, record.run_context if record else None)
                    _answer(binding, result, pending, self.agent_name)
        finally:
            if stop_following is not None:
                stop_following()
            if self.context is not None:
                self.context.settled()

    def _on_outcome(self, outcome: CallOutcome) -> None:
        """A worker's outcome of one of the calls: its answer now, if it is the output the
        turn result will give the model (resolved, and not a failure of the run)."""
        pending = next((p for p in self.calls if p.call.call_id == outcome.call_id), None)
        if pending is None or pending.answer.done():
            return
        final = (
            outcome.kind == "execute"
            and outcome.resolved
            and not outcome.fails_turn
            and outcome.status in ("succeeded", "failed")
            and outcome.output is not None
        )
        if final and outcome.output is not None:
            self._context_back(pending, outcome.run_context)
            pending.answer.set_result(
                FleetAnswer(
                    outcome.output,
                    list(outcome.guardrails),
                    outcome.value,
                    outcome.status,
                    outcome.error,
                )
            )


def _answer(binding: Binding, result: TurnResult, pending: _Pending, agent_name: str) -> None:
    """Settle one call from its turn's result."""
    call, answer = pending.call, pending.answer
    lookup = lookup_key(call)
    if result.status == "cancelled":
        answer.set_exception(FleetRunCancelled(f"run {binding.run_id} was cancelled on the fleet"))
        return
    error = result.error
    if result.status == "failed" and error is not None and error.call_id in (call.call_id, None):
        not_served = TOOL_NOT_IN_AGENT.format(name=lookup, agent=agent_name)
        if error.type == "ModelBehaviorError" and error.message == not_served:
            answer.set_exception(
                FleetToolNotServed(
                    f"tool {lookup} is not served by the fleet (run {binding.run_id}, call "
                    f"{call.call_id}), so it ran nowhere: add it to the workers' ToolRegistry "
                    "(ToolRegistry.from_function_tools or add_function_tool), or, in tests, "
                    "run the agent on toolfleet.testing.InProcessFleet, which serves any tool"
                )
            )
            return
        record = next((r for r in result.calls if r.call_id == call.call_id), None)
        raised = record.error if record is not None else None
        exc = run_error(error, [call], [pending.tool], raised=raised)
        setattr(exc, _VERDICTS_ATTRIBUTE, list(error.guardrails))
        answer.set_exception(exc)
        return
    output = next((o.output for o in result.outputs if o.call_id == call.call_id), None)
    if output is not None:
        record = next((r for r in result.calls if r.call_id == call.call_id), None)
        answer.set_result(
            FleetAnswer(output, list(record.guardrails), record.value, record.status, record.error)
            if record is not None
            else FleetAnswer(output)
        )
        return
    if any(i.call_id == call.call_id for i in result.interruptions):
        answer.set_exception(
            FleetApprovalRequired(
                f"the fleet holds call {call.call_id} of tool {lookup} for an operator's "
                f"approval (run {binding.run_id}); see `toolfleet inspect` and `toolfleet "
                "tasks` for why, decide it with FleetClient.decide, then run the agent again"
            )
        )
        return
    answer.set_exception(_SiblingFailed())


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
    # The item's other fields (its id, status, a hosted agent's attribution) reach the tool's
    # view of its call on the worker, as in-process; never the call's identity.
    other = call.model_dump(mode="json", exclude_unset=True, exclude_none=True)
    item.update((k, v) for k, v in other.items() if k not in item and k != "namespace")
    return item
