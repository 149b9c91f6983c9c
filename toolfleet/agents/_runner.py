"""FleetRunner: the SDK's agent loop, with the fleet executing the tool calls.

Per model response: call the agent's model (as ``Runner.run`` does: the agent's instructions,
enabled tools, model settings and output schema), publish the response as one
ModelResponseEvent, wait for its TurnResult, append the outputs to the conversation and call
the model again — until a response has no tool calls (the final output), the model has been
called ``max_turns`` times (MaxTurnsExceeded), the fleet reports a turn error (raised as the
SDK exception the in-process run would have raised), or calls wait for approval (the result's
``interruptions``; decide on ``result.to_state()`` and run again with the state).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from agents import (
    Agent,
    CodeInterpreterTool,
    FileSearchTool,
    FunctionTool,
    ImageGenerationTool,
    RunConfig,
    RunContextWrapper,
    WebSearchTool,
)
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError, ModelRefusalError, UserError
from agents.items import (
    ItemHelpers,
    MessageOutputItem,
    ModelResponse,
    ReasoningItem,
    RunItem,
    ToolApprovalItem,
    ToolCallItem,
    ToolCallOutputItem,
    TResponseInputItem,
)
from agents.run_internal.turn_preparation import get_model, get_model_settings, get_output_schema
from agents.tool import get_function_tool_origin
from agents.tracing import get_current_trace, trace
from agents.tracing.model_tracing import get_model_tracing_impl
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseReasoningItem,
)

from kernel.rules.texts import TOOL_NOT_FOUND, TOOL_NOT_IN_AGENT
from schemas import (
    AgentRef,
    ApprovalDecision,
    CancelRequest,
    ModelResponseEvent,
    TurnConfig,
    TurnResult,
)
from toolfleet.agents._errors import FleetRunCancelled, run_error
from toolfleet.agents._state import FleetRunResult, FleetRunState, PendingTurn
from toolfleet.client import FleetClient

DEFAULT_MAX_TURNS = 10
"""As ``agents.run.DEFAULT_MAX_TURNS``: model calls per run before MaxTurnsExceeded."""

_HOSTED_TOOLS = (FileSearchTool, WebSearchTool, CodeInterpreterTool, ImageGenerationTool)


class FleetRunner:
    """Runs SDK agents with their function tools executed by a toolfleet fleet.

    ``client`` must be started (``async with FleetClient(settings) as client``); the fleet must
    serve the agent's function tools (``ToolRegistry.from_function_tools(agent.tools)``).
    ``tenant_id`` scopes the call ledger; every run gets its own ``run_id``.
    """

    def __init__(
        self,
        client: FleetClient,
        *,
        tenant_id: str,
        turn_timeout: float = 60.0,
        decision_timeout: float = 10.0,
    ) -> None:
        self.client = client
        self.tenant_id = tenant_id
        self.turn_timeout = turn_timeout
        """Seconds to wait for one TurnResult."""
        self.decision_timeout = decision_timeout
        """Seconds to wait for the planner to record the approval decisions of a resumption."""

    async def run(
        self,
        starting_agent: Agent[Any],
        input: str | list[TResponseInputItem] | FleetRunState,
        *,
        context: Any = None,
        max_turns: int = DEFAULT_MAX_TURNS,
        run_config: RunConfig | None = None,
        run_id: str | None = None,
    ) -> FleetRunResult:
        """Run ``starting_agent`` on ``input``, or resume the interrupted run ``input``.

        Accepts the run configuration that applies to tool execution on the fleet:
        ``tool_execution.max_function_tool_concurrency``,
        ``tool_execution.pre_approval_tool_input_guardrails`` and ``tool_not_found_behavior``,
        plus the model settings (``model``, ``model_provider``, ``model_settings``) and tracing
        flags. Settings it cannot honour raise UserError rather than being ignored.
        """
        config = run_config or RunConfig()
        _check_supported(starting_agent, config)
        if isinstance(input, FleetRunState):
            state = input
            if state.agent is not starting_agent:
                raise UserError("Resume a run with the agent it was interrupted with.")
        else:
            state = FleetRunState(
                run_id=run_id or f"run-{uuid.uuid4().hex}",
                agent=starting_agent,
                context_wrapper=RunContextWrapper(context=context),
                original_input=input,
            )
        if get_current_trace() is not None or config.tracing_disabled:
            return await self._run(state, config, max_turns)
        with trace(
            workflow_name=config.workflow_name,
            trace_id=config.trace_id,
            group_id=config.group_id,
            metadata=config.trace_metadata,
        ):
            return await self._run(state, config, max_turns)

    async def _run(self, state: FleetRunState, config: RunConfig, max_turns: int) -> FleetRunResult:
        agent = state.agent
        if state.pending is not None:
            await self._publish_decisions(state)
        while True:
            if state.pending is None:
                if state.model_calls >= max_turns:
                    raise MaxTurnsExceeded(f"Max turns ({max_turns}) exceeded")
                response = await self._call_model(state, config)
                calls = [i for i in response.output if isinstance(i, ResponseFunctionToolCall)]
                tools = await _function_tools(agent, state.context_wrapper)
                state.new_items.extend(_response_items(agent, response, tools))
                if not calls:
                    final = _final_output(agent, response)
                    if final is _RUN_AGAIN:
                        continue
                    return self._result(state, final)
                state.pending = self._plan(state, response, calls, tools, config)
            pending = state.pending
            result = await self._settle(state, pending)
            tools = await _function_tools(agent, state.context_wrapper)
            outputs = self._take_results(state, pending, result, tools)
            if result is not None and result.status == "failed" and result.error is not None:
                state.pending = None
                raise run_error(result.error, pending.calls, tools)
            if result is not None and result.status == "cancelled":
                state.pending = None
                raise FleetRunCancelled(f"run {state.run_id} was cancelled on the fleet")
            if state.interruptions:
                return self._result(state, None)
            state.pending, state.interruptions = None, []
            state.turn_id += 1
            state.used_tools = True
            stop = _stop_after_tools(agent, pending, outputs)
            if stop is not _RUN_AGAIN:
                return self._result(state, stop)

    async def _call_model(self, state: FleetRunState, config: RunConfig) -> ModelResponse:
        agent, ctx = state.agent, state.context_wrapper
        settings = get_model_settings(agent, config)
        if agent.reset_tool_choice is True and state.used_tools:
            settings = dataclasses.replace(settings, tool_choice=None)
        response = await get_model(agent, config).get_response(
            system_instructions=await agent.get_system_prompt(ctx),
            input=state.input_list(),
            model_settings=settings,
            tools=await agent.get_all_tools(ctx),
            output_schema=get_output_schema(agent),
            handoffs=[],
            tracing=get_model_tracing_impl(
                config.tracing_disabled, config.trace_include_sensitive_data
            ),
            previous_response_id=None,
            conversation_id=None,
            prompt=await agent.get_prompt(ctx),
        )
        state.model_calls += 1
        state.raw_responses.append(response)
        ctx.usage.add(response.usage)
        return response

    def _plan(
        self,
        state: FleetRunState,
        response: ModelResponse,
        calls: list[ResponseFunctionToolCall],
        tools: Sequence[FunctionTool],
        config: RunConfig,
    ) -> PendingTurn:
        """The event to submit; calls of tools the agent does not have are decided here.

        As in the SDK, a call of a tool the agent does not have (or has disabled) fails the run
        under ``raise_error`` before anything runs, and is answered "Tool '{name}' not found."
        under ``return_error_to_model``. Such calls never reach the fleet, even if it serves the
        tool: the agent's tool list is what the model may call.
        """
        agent = state.agent
        known = {t.qualified_name for t in tools}
        local: dict[str, str] = {}
        remote: list[ResponseFunctionToolCall] = []
        for call in calls:
            name = _qualified(call)
            if name in known:
                remote.append(call)
            elif config.tool_not_found_behavior != "return_error_to_model":
                raise ModelBehaviorError(TOOL_NOT_IN_AGENT.format(name=name, agent=agent.name))
            elif not call.call_id:
                remote.append(call)  # the planner fails the turn: empty call ids come first
            else:
                local.setdefault(call.call_id, TOOL_NOT_FOUND.format(name=name))
        event = None
        if remote:
            event = ModelResponseEvent(
                tenant_id=self.tenant_id,
                run_id=state.run_id,
                turn_id=state.turn_id,
                agent=AgentRef(name=agent.name),
                response_id=response.response_id or f"resp-{uuid.uuid4().hex}",
                items=[_wire(c) for c in remote],
                config=_turn_config(agent, config),
            )
        return PendingTurn(response, calls, event, local)

    async def _settle(self, state: FleetRunState, pending: PendingTurn) -> TurnResult | None:
        """Submit (or resubmit, resumed) the pending turn and wait for its TurnResult."""
        if pending.event is None:
            return None
        event = pending.event
        if state.turn_results and state.turn_results[-1].turn_id == event.turn_id:
            event = event.model_copy(update={"resume": True})
        try:
            result = await self.client.run_turn(event, within=self.turn_timeout)
        except asyncio.CancelledError:
            # Parent cancellation: nothing of the run may start any more, on any worker.
            request = CancelRequest(
                tenant_id=self.tenant_id, run_id=state.run_id, reason="agent run cancelled"
            )
            with contextlib.suppress(Exception):
                await asyncio.shield(self.client.cancel(request))
            raise
        state.turn_results.append(result)
        return result

    def _take_results(
        self,
        state: FleetRunState,
        pending: PendingTurn,
        result: TurnResult | None,
        tools: Sequence[FunctionTool],
    ) -> dict[str, str]:
        """Append the turn's new outputs and approval items; all its outputs by call_id.

        As the SDK lays them out: one item per invocation, in model order, an approval item
        where a call waits (``state.interruptions``). Calls of tools the agent lacks are in
        model order too (a deliberate difference: the SDK lists those outputs last). A
        resumed turn only adds what is new, after the earlier items, as the SDK does.
        """
        outputs = dict(pending.local_outputs)
        if result is not None:
            outputs.update((o.call_id, o.output) for o in result.outputs)
        waiting = {i.call_id for i in result.interruptions} if result is not None else set()
        asked = {
            getattr(i.raw_item, "call_id", None): i
            for i in state.new_items
            if isinstance(i, ToolApprovalItem)
        }
        by_name = {t.qualified_name: t for t in tools}
        state.interruptions = []
        seen: set[str] = set()
        for call in pending.calls:
            if call.call_id in seen:
                continue
            seen.add(call.call_id)
            if call.call_id in outputs and call.call_id not in state.output_call_ids:
                state.output_call_ids.add(call.call_id)
                text = outputs[call.call_id]
                state.new_items.append(
                    ToolCallOutputItem(
                        output=text,
                        raw_item=ItemHelpers.tool_call_output_item(call, text),
                        agent=state.agent,
                    )
                )
            elif call.call_id in waiting:
                item = asked.get(call.call_id)
                if item is None:
                    item = _approval_item(state.agent, call, by_name.get(_qualified(call)))
                    state.new_items.append(item)
                state.interruptions.append(item)
        order = {c.call_id: n for n, c in reversed(list(enumerate(pending.calls)))}
        return dict(sorted(outputs.items(), key=lambda kv: order.get(kv[0], len(order))))

    async def _publish_decisions(self, state: FleetRunState) -> None:
        """Publish the decisions taken on the state; wait until the planner has them.

        Decisions and model responses travel on different topics, so a resumed response can
        overtake its decisions; the planner would then just ask again. The wait makes the
        resumption see them.
        """
        from kernel.adapters.redis import connect_redis
        from kernel.stores.keys import Keys

        decisions, state.decisions = state.decisions, []
        if not decisions:
            return
        for d in decisions:
            await self.client.decide(
                ApprovalDecision(
                    tenant_id=self.tenant_id,
                    run_id=state.run_id,
                    call_id=d.call_id,
                    tool_name=d.tool_name,
                    approve=d.approve,
                    message=d.message,
                    sticky=d.sticky,
                    decided_by=state.decided_by,
                )
            )
        redis = connect_redis(self.client.settings)
        key = Keys.of(self.client.settings).approvals(self.tenant_id, state.run_id)
        deadline = time.monotonic() + self.decision_timeout
        try:
            for d in decisions:
                while True:
                    raw = await redis.hget(key, f"call:{d.call_id}")
                    if raw is not None and json.loads(raw)["approve"] == d.approve:
                        break
                    if time.monotonic() > deadline:
                        raise UserError(
                            f"the planner did not record the decision on {d.call_id} within "
                            f"{self.decision_timeout:g} s; is it running?"
                        )
                    await asyncio.sleep(0.02)  # polling interval of a deadline-bounded wait
        finally:
            await redis.aclose()

    def _result(self, state: FleetRunState, final: Any) -> FleetRunResult:
        return FleetRunResult(
            input=state.original_input,
            new_items=list(state.new_items),
            raw_responses=list(state.raw_responses),
            final_output=final,
            interruptions=list(state.interruptions),
            last_agent=state.agent,
            context_wrapper=state.context_wrapper,
            run_id=state.run_id,
            turn_results=list(state.turn_results),
            _state=state,
        )


_RUN_AGAIN: Any = object()


def _check_supported(agent: Agent[Any], config: RunConfig) -> None:
    """Refuse what the fleet runner cannot honour, instead of silently ignoring it."""
    problems = []
    if agent.handoffs:
        problems.append("handoffs")
    if agent.input_guardrails or agent.output_guardrails:
        problems.append("agent input/output guardrails")
    if config.input_guardrails or config.output_guardrails:
        problems.append("run-level input/output guardrails")
    if agent.hooks is not None:
        problems.append("agent hooks (use ToolRegistry(hooks=...) on the workers)")
    if agent.mcp_servers:
        problems.append("MCP servers")
    if config.tool_error_formatter is not None:
        problems.append("RunConfig.tool_error_formatter")
    if config.call_model_input_filter is not None:
        problems.append("RunConfig.call_model_input_filter")
    behavior = agent.tool_use_behavior
    if callable(behavior):
        problems.append("a callable tool_use_behavior")
    for tool in agent.tools:
        if not isinstance(tool, (FunctionTool, *_HOSTED_TOOLS)):
            problems.append(f"tools of type {type(tool).__name__}")
    if problems:
        raise UserError("toolfleet.agents.FleetRunner does not support " + ", ".join(problems))


async def _function_tools(agent: Agent[Any], ctx: RunContextWrapper[Any]) -> list[FunctionTool]:
    """The agent's enabled function tools (a callable ``is_enabled`` is evaluated here)."""
    return [t for t in await agent.get_all_tools(ctx) if isinstance(t, FunctionTool)]


def _qualified(call: ResponseFunctionToolCall) -> str:
    namespace = getattr(call, "namespace", None)
    return f"{namespace}.{call.name}" if namespace else call.name


def _wire(call: ResponseFunctionToolCall) -> dict[str, Any]:
    item: dict[str, Any] = {
        "type": "function_call",
        "call_id": call.call_id,
        "name": call.name,
        "arguments": call.arguments,
    }
    namespace = getattr(call, "namespace", None)
    if namespace:
        item["namespace"] = namespace
    return item


def _turn_config(agent: Agent[Any], config: RunConfig) -> TurnConfig:
    execution = config.tool_execution
    return TurnConfig(
        max_concurrency=execution.max_function_tool_concurrency if execution else None,
        failure_policy="error_as_output",  # each tool's failure_error_function decides
        tool_not_found=config.tool_not_found_behavior,
        pre_approval_guardrails=bool(execution and execution.pre_approval_tool_input_guardrails),
        reset_tool_choice=agent.reset_tool_choice,
    )


def _response_items(
    agent: Agent[Any], response: ModelResponse, tools: Sequence[FunctionTool]
) -> list[RunItem]:
    """The run items of a model response, as the SDK makes them (one per call_id)."""
    by_name = {t.qualified_name: t for t in tools}
    items: list[RunItem] = []
    seen: set[str] = set()
    for output in response.output:
        if isinstance(output, ResponseOutputMessage):
            items.append(MessageOutputItem(raw_item=output, agent=agent))
        elif isinstance(output, ResponseReasoningItem):
            items.append(ReasoningItem(raw_item=output, agent=agent))
        elif isinstance(output, ResponseFunctionToolCall):
            if output.call_id and output.call_id in seen:
                continue  # the SDK keeps one item per invocation
            seen.add(output.call_id)
            tool = by_name.get(_qualified(output))
            items.append(
                ToolCallItem(
                    raw_item=output,
                    agent=agent,
                    description=tool.description if tool else None,
                    tool_origin=get_function_tool_origin(tool) if tool else None,
                )
            )
        else:
            items.append(ToolCallItem(raw_item=output, agent=agent))  # type: ignore[arg-type]
    return items


def _final_output(agent: Agent[Any], response: ModelResponse) -> Any:
    """The final output of a response without tool calls (as the SDK's run_llm_again)."""
    messages = [o for o in response.output if isinstance(o, ResponseOutputMessage)]
    last = messages[-1] if messages else None
    refusal = ItemHelpers.extract_refusal(last) if last is not None else None
    if refusal:
        raise ModelRefusalError(refusal)
    text = ItemHelpers.extract_text(last) if last is not None else None
    schema = get_output_schema(agent)
    if schema is None or schema.is_plain_text():
        return text or ""
    if not text:
        return _RUN_AGAIN  # the SDK asks the model again for the structured output
    return schema.validate_json(text)


def _stop_after_tools(agent: Agent[Any], pending: PendingTurn, outputs: dict[str, str]) -> Any:
    """The final output when ``tool_use_behavior`` stops after tools, else _RUN_AGAIN.

    The outputs are the texts the model would have seen (the fleet's wire carries strings).
    """
    behavior = agent.tool_use_behavior
    if behavior == "stop_on_first_tool" and outputs:
        return next(iter(outputs.values()))
    if isinstance(behavior, dict):
        stop_at = set(behavior.get("stop_at_tool_names", []))
        for call in pending.calls:
            if _qualified(call) in stop_at and call.call_id in outputs:
                return outputs[call.call_id]
    return _RUN_AGAIN


def _approval_item(
    agent: Agent[Any], call: ResponseFunctionToolCall, tool: FunctionTool | None
) -> ToolApprovalItem:
    """The SDK approval item for a call the fleet reports waiting for approval."""
    return ToolApprovalItem(
        agent=agent,
        raw_item=call,
        tool_name=call.name,
        tool_namespace=getattr(call, "namespace", None),
        tool_origin=get_function_tool_origin(tool) if tool else None,
    )
