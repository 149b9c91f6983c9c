"""Where FleetRunner meets the SDK: the few points of the SDK's own runner it routes.

FleetRunner runs the application's own agents and tools with the SDK's own runner; nothing is
copied. Inside a FleetRunner run (while a ``Binding`` is bound), and only there:

- Invocation. The SDK's single invocation point of a function tool
  (``run_internal.tool_execution._invoke_function_tool_with_metadata``) sends the call to the
  fleet instead of calling the tool's function. Whatever the tool — on the agent when the run
  started, added by a hook during the run or between runs, listed by an MCP server — the SDK
  found it and invokes it there, so no function tool's body runs in the runner process: it
  runs on a worker, or the run fails with ``FleetToolNotServed``. An agent used as a tool is
  the exception, as in-process: its nested run is the runner's, bound to the nested identity.
- Approval. The SDK's own evaluation (``function_needs_approval``: argument preparation, the
  callable policy, agent-scoped decisions) runs as it is, once each time the SDK calls it; for
  a tool the fleet gates (the release gate) an "invoke" becomes "ask a person".
- Tool guardrails. The worker runs them around the body, with the tool's timeout and failure
  handler; the runner runs only the input guardrails the SDK runs before its approval question
  (``ToolExecutionConfig.pre_approval_tool_input_guardrails``). The verdicts come back with the
  call and are reported where the SDK reports its own (the run's tool guardrail results, a
  rejection bypassing the output schema, an output tripwire raised where the SDK runs the
  output guardrails).
- RunState. ``to_json`` (and so ``to_string``) writes the fleet run's identity into the state
  (its ``toolfleet`` key), ``from_json`` / ``from_string`` read it back, so a state restored
  with the application's agent, in another process, resumes under the same run id.

Outside a FleetRunner run each point behaves exactly as the SDK's own. ``install`` is called
once, when ``toolfleet.agents`` is imported.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import typing
from dataclasses import dataclass, replace
from typing import Any

from agents import FunctionTool, RunContextWrapper
from agents.exceptions import ToolOutputGuardrailTripwireTriggered
from agents.logger import log_tool_action_warning, logger
from agents.run_config import ToolErrorFormatterArgs
from agents.run_internal import tool_execution as _tool_execution
from agents.run_internal import turn_resolution as _turn_resolution
from agents.run_state import RunState
from agents.tool import (
    ToolOriginType,
    ValidToolOutputPydanticModelsTypeAdapter,
    _FunctionToolInvocationResult,
    resolve_function_tool_failure_error_function,
)
from agents.tool_context import ToolContext
from pydantic import TypeAdapter

from kernel.errors import ToolfleetError
from kernel.tools import output_text
from toolfleet.agents._calls import (
    Binding,
    FleetAnswer,
    bound,
    current_binding,
    invoke_on_fleet,
    verdicts_of,
)
from toolfleet.agents._context import install as install_call_order
from toolfleet.agents._errors import FleetTurnError, tool_exception
from toolfleet.agents._guardrails import input_results, output_results
from toolfleet.serving import GatingToolServer, current_tool_server

STATE_KEY = "toolfleet"
"""The key of a serialized RunState that holds the fleet run's identity."""

_BINDING_ATTRIBUTE = "_toolfleet_binding"
"""Where a run's context wrapper carries its binding: the SDK copies the wrapper's attributes
into the RunState it makes (``to_state``), so an in-process resumption finds its run."""
_IDENTITY_ATTRIBUTE = "_toolfleet_identity"
"""Where a RunState restored from JSON keeps the identity its JSON carried."""


@dataclass(frozen=True)
class FleetIdentity:
    """Who a run is on the fleet: its calls are (tenant_id, run_id, call_id)."""

    tenant_id: str
    run_id: str


def remember(context: RunContextWrapper[Any], binding: Binding) -> None:
    """Tie a run's context wrapper (and the RunStates made from it) to its binding."""
    setattr(context, _BINDING_ATTRIBUTE, binding)


def binding_of(context: RunContextWrapper[Any] | None) -> Binding | None:
    """The binding a run's context wrapper was tied to in this process, if any."""
    found = getattr(context, _BINDING_ATTRIBUTE, None)
    return found if isinstance(found, Binding) else None


def identity_of(context: RunContextWrapper[Any] | None) -> FleetIdentity | None:
    """The fleet identity of a run's context wrapper: its binding's, or the one a RunState
    restored from JSON carried."""
    binding = binding_of(context)
    if binding is not None:
        return FleetIdentity(binding.tenant_id, binding.run_id)
    found = getattr(context, _IDENTITY_ATTRIBUTE, None)
    return found if isinstance(found, FleetIdentity) else None


def _origin(tool: FunctionTool) -> Any:
    return getattr(getattr(tool, "_tool_origin", None), "type", None)


def runs_on_fleet(tool: FunctionTool) -> bool:
    """Whether FleetRunner sends this tool's calls to the fleet (every function tool but an
    agent used as a tool, whose nested run stays with the runner)."""
    return bool(_origin(tool) != ToolOriginType.AGENT_AS_TOOL)


# --- the SDK's functions, as they were before ``install`` -------------------------------------
# (Private parts of openai-agents 0.24.0, which is why the package is pinned.)
tool_execution: Any = _tool_execution
turn_resolution: Any = _turn_resolution
_sdk_invoke = tool_execution._invoke_function_tool_with_metadata
_sdk_needs_approval = tool_execution.function_needs_approval
_sdk_input_guardrails = tool_execution._execute_tool_input_guardrails
_sdk_output_guardrails = tool_execution._execute_tool_output_guardrails
_sdk_to_json = RunState.to_json
_sdk_from_json = RunState.from_json


async def _invoke(*, function_tool: FunctionTool, context: ToolContext[Any], arguments: str) -> Any:
    binding = current_binding()
    if binding is None:
        return await _sdk_invoke(function_tool=function_tool, context=context, arguments=arguments)
    if not runs_on_fleet(function_tool):
        with bound(binding.nested(context.tool_call_id)):
            return await _sdk_invoke(
                function_tool=function_tool, context=context, arguments=arguments
            )
    call_id = context.tool_call_id
    reported = binding.input_results.pop(call_id, None)
    try:
        answer = await invoke_on_fleet(binding, function_tool, context, arguments)
    except FleetTurnError as exc:
        if exc.type != "CancelledError":
            raise
        # The tool cancelled itself and no failure handler took it: in-process that
        # cancellation leaves the SDK's runner as it is, and so it does here.
        raise asyncio.CancelledError(str(exc)) from None
    except Exception as exc:
        verdicts = verdicts_of(exc)
        if reported is not None:
            reported.extend(input_results(function_tool, verdicts))
        if isinstance(exc, ToolOutputGuardrailTripwireTriggered):
            # In-process the output guardrails raise it, after the body: so here.
            binding.pending_output[call_id] = exc
            return _FunctionToolInvocationResult(None)
        raise
    if reported is not None:
        reported.extend(input_results(function_tool, answer.guardrails))
    raised = _propagated(function_tool, context, answer)
    if raised is not None:
        raise raised
    answer = await _formatted(function_tool, context, answer)
    binding.pending_output[call_id] = answer
    # An input guardrail's rejection text is the SDK's own output, never the tool's: the
    # SDK does not hold it to the tool's output schema.
    return _FunctionToolInvocationResult(
        returned(function_tool, answer),
        is_sdk_generated_error=_sdk_generated(function_tool, answer),
    )


def _propagated(
    tool: FunctionTool, context: ToolContext[Any], answer: FleetAnswer
) -> Exception | None:
    """The tool's exception, when the SDK would let it fail the run for this very call where
    the worker, which does not see the call's caller, gave the default failure text: a
    program's call of a tool with an output schema has no default failure text
    (``resolve_function_tool_failure_error_function`` with the call's context)."""
    error = answer.error
    if (
        answer.status != "failed"
        or error is None
        or error.severity != "error"
        or not getattr(tool, "_use_default_failure_error_function", False)
        or resolve_function_tool_failure_error_function(tool, context) is not None
    ):
        return None
    return tool_exception(error.type, error.message)


async def _formatted(
    tool: FunctionTool, context: ToolContext[Any], answer: FleetAnswer
) -> FleetAnswer:
    """The answer with ``RunConfig.tool_error_formatter`` applied, as the SDK applies it in the
    runner to a tool exception its default failure text handled (the worker has no RunConfig).
    The formatter's ``error`` is the tool's exception as ``tool_exception`` rebuilds it (it
    stayed on the worker)."""
    config = getattr(context, "run_config", None)
    formatter = getattr(config, "tool_error_formatter", None)
    error = answer.error
    if (
        formatter is None
        or answer.status != "failed"
        or error is None
        or error.severity != "error"  # a cancellation or a BaseException: not formatted
        or error.type == "MCPToolCancellationError"
        or not getattr(tool, "_use_default_failure_error_function", False)
    ):
        return answer
    try:
        message = formatter(
            ToolErrorFormatterArgs(
                kind="tool_exception",
                tool_type="function",
                tool_name=context.qualified_tool_name,
                call_id=context.tool_call_id,
                default_message=answer.output,
                run_context=context,
                error=tool_exception(error.type, error.message),
            )
        )
        message = await message if inspect.isawaitable(message) else message
    except Exception as exc:
        log_tool_action_warning(logger, "Tool error formatter failed", exc)
        return answer
    if isinstance(message, str):
        return replace(answer, output=message, value=None)
    if message is not None:
        logger.warning("Tool error formatter returned a non-string value")
    return answer


def _sdk_generated(tool: FunctionTool, answer: FleetAnswer) -> bool:
    """Whether the SDK wrote the output instead of the tool (an input guardrail's rejection,
    the default failure or timeout text): in-process the SDK does not hold such an output to
    the tool's output schema."""
    if answer.rejected("input"):
        return True
    if answer.status in ("failed", "cancelled"):
        return bool(getattr(tool, "_use_default_failure_error_function", False))
    return answer.status == "timed_out" and tool.timeout_error_function is None


def returned(tool: FunctionTool, answer: FleetAnswer) -> Any:
    """What the tool returned, as the SDK gives it to ``tool_use_behavior``, ``on_tool_end``,
    the run's items and ``final_output``: the object rebuilt from its JSON (by the tool's
    output type when it declares one), or the text the model sees when the rebuilt object
    would not show the model that very text (a tuple, an object JSON cannot hold, a model
    without an output type): the model must see what the worker's tool produced."""
    if answer.value is None:
        return answer.output
    try:
        value = json.loads(answer.value)
        adapter = getattr(tool, "_output_type_adapter", None) or _annotated_output(tool)
        if adapter is not None:
            rebuilt = adapter.validate_python(value)
        elif _origin(tool) == ToolOriginType.MCP:
            rebuilt = value  # an MCP tool's content reaches the SDK as mappings, as they are
        else:
            rebuilt = _content(value)
    except ValueError:  # pydantic's ValidationError is one
        return answer.output
    return rebuilt if output_text(rebuilt) == answer.output else answer.output


def _annotated_output(tool: FunctionTool) -> TypeAdapter[Any] | None:
    """A TypeAdapter for the return annotation of the function a tool wraps, when it names a
    type JSON cannot show as it is (a pydantic model, a dataclass, a typed container): the
    SDK declares an output type only for ``output_type=`` or programmatic callers, yet
    in-process the application gets the object the function returned, so the runner
    rebuilds it by the annotation."""
    try:
        function = tool.__wrapped__
    except AttributeError:  # not made by function_tool, or its invoker was replaced
        return None
    try:
        return _adapter_for_return_of(function)
    except TypeError:  # a callable object that cannot be hashed: read it without the cache
        return _adapter_for_return_of.__wrapped__(function)


@functools.lru_cache(maxsize=1024)
def _adapter_for_return_of(function: Any) -> TypeAdapter[Any] | None:
    try:
        annotation = typing.get_type_hints(function, include_extras=True).get("return")
    except Exception:  # an annotation that does not resolve in this process
        return None
    if annotation in (None, Any, str, type(None)):
        return None
    try:
        return TypeAdapter(annotation)
    except Exception:  # pydantic cannot validate into it (an arbitrary class)
        return None


def _content(value: Any) -> Any:
    """The SDK's structured tool outputs (``ToolOutputText``, images, files) in a JSON value,
    alone or in a list, as those objects; any other value as it is."""
    if isinstance(value, list):
        return [_content(part) for part in value]
    if isinstance(value, dict) and value.get("type") in ("text", "image", "file"):
        try:
            return ValidToolOutputPydanticModelsTypeAdapter.validate_python(value)
        except ValueError:
            return value
    return value


async def _needs_approval(
    function_tool: FunctionTool, context_wrapper: RunContextWrapper[Any], tool_call: Any
) -> Any:
    evaluation = await _sdk_needs_approval(function_tool, context_wrapper, tool_call)
    binding = current_binding()
    if binding is None or not runs_on_fleet(function_tool):
        return evaluation
    if evaluation.outcome == "invoke" and await _gated(binding, function_tool):
        # The fleet holds every call of this tool for a person: ask, the SDK's way.
        evaluation.outcome, evaluation.prepared = "require_approval", None
    binding.asked[tool_call.call_id] = evaluation.outcome == "require_approval"
    return evaluation


async def _gated(binding: Binding, tool: FunctionTool) -> bool:
    """Whether the fleet's release gate holds every call of ``tool`` for a person.

    Under a tool server that knows its gate (a test fleet serving the application's objects),
    the gate of this very object, served now, before its call is sent: a gate read when the
    run started can be an earlier object's of the same name. Otherwise the gate as the runner
    last read it from the fleet's registry (``binding.gated``).
    """
    server = current_tool_server()
    if isinstance(server, GatingToolServer):
        try:
            await server.ensure_served(tool)
            return server.gated(tool)
        except ToolfleetError:
            pass  # reported where the call is sent, which serves it again
    return tool.qualified_name in binding.gated


async def _input_guardrails(
    *,
    func_tool: FunctionTool,
    tool_context: ToolContext[Any],
    agent: Any,
    tool_input_guardrail_results: list[Any],
) -> str | None:
    binding = current_binding()
    if binding is not None and runs_on_fleet(func_tool) and func_tool.tool_input_guardrails:
        call_id = tool_context.tool_call_id
        undecided = tool_context.is_tool_approved(func_tool.name, call_id) is None
        if not (undecided and binding.asked.get(call_id)):
            # Right before the body: the worker runs them; their verdicts, which come back
            # with the call, go to this list.
            binding.input_results[call_id] = tool_input_guardrail_results
            return None
    rejection: str | None = await _sdk_input_guardrails(
        func_tool=func_tool,
        tool_context=tool_context,
        agent=agent,
        tool_input_guardrail_results=tool_input_guardrail_results,
    )
    return rejection


async def _output_guardrails(
    *,
    func_tool: FunctionTool,
    tool_context: ToolContext[Any],
    agent: Any,
    real_result: Any,
    tool_output_guardrail_results: list[Any],
) -> Any:
    binding = current_binding()
    if binding is not None and runs_on_fleet(func_tool):
        # The worker ran them on the body's result; ``real_result`` is what they let through.
        answer = binding.pending_output.pop(tool_context.tool_call_id, None)
        if isinstance(answer, ToolOutputGuardrailTripwireTriggered):
            tool_output_guardrail_results.extend(output_results(func_tool, verdicts_of(answer)))
            raise answer
        rejected = False
        if isinstance(answer, FleetAnswer):
            tool_output_guardrail_results.extend(output_results(func_tool, answer.guardrails))
            rejected = answer.rejected("output")
        return tool_execution._ToolOutputGuardrailExecutionResult(
            real_result, is_rejection=rejected
        )
    return await _sdk_output_guardrails(
        func_tool=func_tool,
        tool_context=tool_context,
        agent=agent,
        real_result=real_result,
        tool_output_guardrail_results=tool_output_guardrail_results,
    )


@functools.wraps(_sdk_to_json)
def _to_json(self: RunState[Any, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    data: dict[str, Any] = _sdk_to_json(self, *args, **kwargs)
    identity = identity_of(self._context)
    if identity is not None:
        data[STATE_KEY] = {"tenant_id": identity.tenant_id, "run_id": identity.run_id}
    return data


@functools.wraps(_sdk_from_json)
async def _from_json(*args: Any, **kwargs: Any) -> RunState[Any, Any]:
    state_json = kwargs["state_json"] if "state_json" in kwargs else args[1]
    identity = _identity_in(state_json)
    state: RunState[Any, Any] = await _sdk_from_json(*args, **kwargs)
    if identity is not None and state._context is not None:
        setattr(state._context, _IDENTITY_ATTRIBUTE, identity)
    return state


def _identity_in(state_json: Any) -> FleetIdentity | None:
    entry = state_json.get(STATE_KEY) if isinstance(state_json, dict) else None
    if not isinstance(entry, dict):
        return None
    tenant_id, run_id = entry.get("tenant_id"), entry.get("run_id")
    if isinstance(tenant_id, str) and isinstance(run_id, str) and tenant_id and run_id:
        return FleetIdentity(tenant_id, run_id)
    return None


def install() -> None:
    """Route the SDK's points listed above through FleetRunner (once per process)."""
    if tool_execution._invoke_function_tool_with_metadata is _invoke:
        return
    install_call_order()  # each call knows its place in model order (the run context's)
    tool_execution._invoke_function_tool_with_metadata = _invoke
    tool_execution.function_needs_approval = _needs_approval
    turn_resolution.function_needs_approval = _needs_approval
    tool_execution._execute_tool_input_guardrails = _input_guardrails
    tool_execution._execute_tool_output_guardrails = _output_guardrails
    RunState.to_json = _to_json  # type: ignore[method-assign]
    RunState.from_json = staticmethod(_from_json)  # type: ignore[method-assign]
