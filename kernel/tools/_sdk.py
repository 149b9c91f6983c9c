"""Serving the OpenAI Agents SDK's own function tools on the fleet, unchanged.

``ToolRegistry.add_function_tool(ft)`` (or ``ToolRegistry.from_function_tools([...])``) turns an
``agents.FunctionTool`` — typically made with ``@function_tool`` — into a toolfleet ``Tool`` whose
model-visible behaviour is the one the SDK (0.24) gives it in-process:

- the body is the SDK's own invoker, so the arguments are decoded and validated by the tool's
  own pydantic model, sync functions run in a thread, and structured return values are checked,
  exactly as in-process; a validation failure surfaces inside the body, as in the SDK (input
  guardrails and ``on_tool_start`` have run by then, nothing of the function has);
- ``failure_error_function`` (default, custom or None), ``timeout`` with both
  ``timeout_behavior`` values and ``timeout_error_function`` keep their SDK meaning: the
  toolfleet runner applies them around the body, so a timeout is still reported with effect
  ``unknown``;
- ``needs_approval`` (bool, or the SDK's ``(run_context, params, call_id)`` policy, evaluated by
  the SDK's own fail-closed evaluation) and the tool input / output guardrails run with an SDK
  ``ToolContext``; tripwire messages name the guardrail class, as the SDK does;
- a bool ``is_enabled`` is published to the registry; a callable one depends on the run
  context, which lives with the agent, so ``toolfleet.agents.FleetRunner`` evaluates it there.

What a tool sees of the run: the SDK ``ToolContext`` passed to the function, guardrails,
policies and formatters has ``context`` set to a copy of the agent run's context when the call
carries one (``ExecutionCommand.run_context``, which ``toolfleet.agents.FleetRunner`` sends for
a dataclass, pydantic model or JSON context), rebuilt as the type the function declares for it
(``ctx: RunContextWrapper[MyContext]``), else as the class the copy names when the worker has
its module imported, else as JSON's values; one copy per attempt, whose changes travel back
with the outcome (``CallOutcome.run_context``). A call without a copy (another runtime, a
context that could not be copied, a command the fleet rebuilt from its ledger) sees
toolfleet's ``ToolContext`` (idempotency key, tenant, run, attempt) instead. Either way the
fleet's own view of the call (its ``idempotency_key`` for the upstream,
``record_upstream_ref``) is ``current_tool_context()``.
``ToolContext.agent`` is an agent named as the run's agent that made the call (a placeholder
named ``toolfleet`` when the call does not say): the agent object itself stays with the
runner. Structured tool outputs (images, files) cannot be carried on toolfleet's string-only
wire; they reach the model as their ``str()``.

toolfleet's own options (``FleetOptions``, plus ``probe`` and ``compensate``) can be given
alongside: an undeclared ``effect`` is treated as ``non_idempotent`` with the SDK's approval
behaviour kept (a declared one puts the tool under the release gate), and ``on_unknown``
defaults to ``report_now`` (the SDK's texts).

The SDK is imported lazily: toolfleet itself works without ``openai-agents`` installed.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import json
from functools import cache
from typing import TYPE_CHECKING, Any, Unpack, get_args, get_origin, get_type_hints

from kernel.errors import ConfigurationError
from kernel.tools._context import ToolContext
from kernel.tools._errors import ToolTimeoutError
from kernel.tools._guardrails import GuardrailResult
from kernel.tools._tool import (
    ApprovalFunction,
    CompensateFunction,
    FleetOptions,
    ProbeFunction,
    Tool,
)

if TYPE_CHECKING:
    from agents import Agent, FunctionTool
    from agents.tool_context import ToolContext as SdkToolContext
    from agents.tool_guardrails import (
        ToolGuardrailFunctionOutput,
        ToolInputGuardrail,
        ToolOutputGuardrail,
    )

_MISSING_SDK = (
    "serving Agents SDK function tools needs the openai-agents package: "
    "pip install 'toolfleet[agents]'"
)


def _require_sdk() -> None:
    try:
        import agents  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigurationError(_MISSING_SDK) from exc


@cache
def _placeholder_agent() -> Agent[Any]:
    """The agent the SDK callbacks see on a worker when the call does not name its agent."""
    from agents import Agent

    return Agent(name="toolfleet")


@functools.lru_cache(maxsize=256)
def _agent_named(name: str) -> Agent[Any]:
    """The agent the SDK callbacks see on a worker: one named as the run's agent (the object
    itself, with its tools and model, stays with the runner)."""
    from agents import Agent

    return Agent(name=name)


def _agent_of(ctx: ToolContext) -> Agent[Any]:
    name = ctx._run_context.agent
    return _agent_named(name) if name else _placeholder_agent()


def _declared_context_type(function_tool: FunctionTool) -> Any:
    """The type a ``@function_tool`` function declares for its run context
    (``ctx: RunContextWrapper[MyContext]`` or ``ToolContext[MyContext]``), if any."""
    from agents import RunContextWrapper

    try:
        func = function_tool.__wrapped__
        params = list(inspect.signature(func).parameters.values())
    except (AttributeError, TypeError, ValueError):  # a hand-built FunctionTool: no function
        return None
    if not params:
        return None
    try:
        annotation = get_type_hints(func).get(params[0].name)
    except Exception:  # unresolvable annotations: the copy is rebuilt another way
        return None
    origin = get_origin(annotation) or annotation
    if not (isinstance(origin, type) and issubclass(origin, RunContextWrapper)):
        return None
    args = get_args(annotation)
    return args[0] if args else None


def is_function_tool(obj: object) -> bool:
    """Whether ``obj`` is an ``agents.FunctionTool`` (False when the SDK is not installed)."""
    try:
        from agents import FunctionTool
    except ImportError:  # pragma: no cover - depends on the environment
        return False
    return isinstance(obj, FunctionTool)


class FunctionToolAdapter(Tool):
    """A toolfleet Tool that runs an ``agents.FunctionTool`` as the SDK runs it in-process.

    Build it with ``ToolRegistry.add_function_tool``; ``function_tool`` is the SDK object.
    """

    def __init__(
        self,
        function_tool: FunctionTool,
        *,
        probe: ProbeFunction | None = None,
        compensate: CompensateFunction | None = None,
        **options: Unpack[FleetOptions],
    ) -> None:
        _require_sdk()
        from agents import FunctionTool
        from agents.tool import (
            _FailureHandlingFunctionToolInvoker,
            resolve_function_tool_failure_error_function,
            set_function_tool_failure_error_function,
        )

        if not isinstance(function_tool, FunctionTool):
            raise ConfigurationError(
                f"add_function_tool wants an agents.FunctionTool (made with @function_tool), "
                f"got {type(function_tool).__name__}"
            )
        self.function_tool = function_tool
        self._context_type = _declared_context_type(function_tool)
        # The SDK's own invoker, minus its failure handling: toolfleet's runner applies the
        # failure policy itself, so that a failure keeps its status and effect.
        self._invoker_tool = copy.copy(function_tool)
        set_function_tool_failure_error_function(self._invoker_tool, None)
        # Only the SDK's wrapped invokers turn exceptions into outputs; a hand-built
        # FunctionTool's exceptions fail the run, and only its cancellations are formatted.
        self._formats_exceptions = isinstance(
            function_tool.on_invoke_tool, _FailureHandlingFunctionToolInvoker
        )
        self._sdk_failure_function = resolve_function_tool_failure_error_function(function_tool)
        needs_approval: bool | ApprovalFunction | None
        if callable(function_tool.needs_approval):
            needs_approval = self._needs_approval
        elif function_tool.needs_approval:
            needs_approval = True
        else:
            # The release gate decides (kernel.rules.effects.gated_by_default): an undeclared
            # effect class keeps the SDK's behaviour, a declared one puts the tool under it.
            needs_approval = None
        is_enabled = function_tool.is_enabled
        fleet_options = FleetOptions(on_unknown="report_now")
        fleet_options.update(options)
        super().__init__(
            self._body,
            name=function_tool.name,
            description=function_tool.description,
            namespace=getattr(function_tool, "_tool_namespace", None) or None,
            effect_declared=options.get("effect") is not None,
            timeout=function_tool.timeout_seconds,
            timeout_behavior=function_tool.timeout_behavior,
            timeout_error_function=(
                self._timeout_text if function_tool.timeout_error_function is not None else None
            ),
            failure_error_function=(
                self._failure_text if self._sdk_failure_function is not None else None
            ),
            needs_approval=needs_approval,
            input_guardrails=[
                _SdkInputGuardrail(self, g) for g in function_tool.tool_input_guardrails or ()
            ],
            output_guardrails=[
                _SdkOutputGuardrail(self, g) for g in function_tool.tool_output_guardrails or ()
            ],
            # A callable is_enabled depends on the run context: the agent side evaluates it.
            is_enabled=is_enabled if isinstance(is_enabled, bool) else True,
            **fleet_options,
        )
        if probe is not None:
            self.probe(probe)
        if compensate is not None:
            self.compensate(compensate)

    @property
    def serves_sdk_tool(self) -> bool:
        """Always: this tool is an Agents SDK function tool served unchanged."""
        return True

    @property
    def parameters_schema(self) -> dict[str, Any]:
        """The SDK tool's own JSON schema (strict, as the model sees it)."""
        return copy.deepcopy(self.function_tool.params_json_schema)

    def parse_arguments(self, arguments: str) -> dict[str, Any]:
        """The raw JSON object, never an error: the SDK validates inside the body.

        Bad or invalid arguments then fail where they fail in-process — after input guardrails
        and ``on_tool_start``, before any of the function runs — with the SDK's own
        ModelBehaviorError, which the failure policy words for the model.
        """
        try:
            data = json.loads(arguments) if arguments else {}
        except (ValueError, RecursionError):
            return {}
        return data if isinstance(data, dict) else {}

    def parse_arguments_for_approval(self, arguments: str) -> dict[str, Any] | None:
        """The SDK's strict parse for approval policies: None (approval required) if unsure."""
        from agents.util._approvals import parse_function_tool_arguments

        return parse_function_tool_arguments(arguments)

    async def invoke(self, ctx: ToolContext, args: dict[str, Any]) -> Any:
        """Run the SDK's invoker with the raw arguments, as ``Runner.run`` would."""
        return await self._body(ctx)

    def sdk_context(self, ctx: ToolContext) -> SdkToolContext[Any]:
        """The SDK ToolContext for one call; its ``context`` is the call's copy of the agent
        run's context, or toolfleet's ToolContext when no copy travelled."""
        from agents.tool_context import ToolContext as SdkToolContext
        from openai.types.responses import ResponseFunctionToolCall

        # As the model wrote it: a namespace only when the tool has one.
        namespace = {"namespace": self.namespace} if self.namespace else {}
        call = ResponseFunctionToolCall(
            type="function_call",
            call_id=ctx.call_id,
            name=self.name,
            arguments=ctx.arguments,
            **namespace,
        )
        carried = ctx._run_context
        if carried.item:
            # The call as the model wrote it (its id, status, a hosted agent's attribution).
            with contextlib.suppress(ValueError):
                call = ResponseFunctionToolCall.model_validate(
                    {**carried.item, **call.model_dump(exclude_unset=True)}
                )
        return SdkToolContext(
            carried.copy(self._context_type, default=ctx),
            tool_name=self.name,
            tool_call_id=ctx.call_id,
            tool_arguments=ctx.arguments,
            tool_call=call,
            tool_namespace=self.namespace,
            agent=_agent_of(ctx),
            tool_input=carried.tool_input(),
        )

    async def _body(self, ctx: ToolContext) -> Any:
        from agents.tool import _get_function_tool_invoke_context

        sdk_ctx = self.sdk_context(ctx)
        invoke_ctx = _get_function_tool_invoke_context(self._invoker_tool, sdk_ctx)
        return await self._invoker_tool.on_invoke_tool(invoke_ctx, ctx.arguments)  # type: ignore[arg-type]

    async def _needs_approval(self, ctx: ToolContext, args: dict[str, Any]) -> bool:
        from agents.util._approvals import evaluate_function_tool_approval

        evaluation = await evaluate_function_tool_approval(
            self.function_tool, self.sdk_context(ctx), ctx.arguments, ctx.call_id
        )
        return evaluation.outcome == "require_approval"

    async def _failure_text(self, ctx: ToolContext, error: Exception) -> str:
        from kernel.tools._errors import ToolCancelledError

        if not self._formats_exceptions and not isinstance(error, ToolCancelledError):
            raise error  # a hand-built FunctionTool's exception fails the run, as in the SDK
        formatter = self._sdk_failure_function
        assert formatter is not None
        return str(await _text(formatter(self.sdk_context(ctx), error)))

    async def _timeout_text(self, ctx: ToolContext, error: Exception) -> str:
        from agents.exceptions import ToolTimeoutError as SdkToolTimeoutError

        formatter = self.function_tool.timeout_error_function
        assert formatter is not None
        seconds = error.timeout_seconds if isinstance(error, ToolTimeoutError) else 0.0
        sdk_error = SdkToolTimeoutError(tool_name=self.name, timeout_seconds=seconds)
        return str(await _text(formatter(self.sdk_context(ctx), sdk_error)))

    def __repr__(self) -> str:
        return f"FunctionToolAdapter({self.lookup_key!r}, effect={self.effect!r})"


async def _text(result: object) -> Any:
    return await result if inspect.isawaitable(result) else result


def _verdict(output: ToolGuardrailFunctionOutput) -> GuardrailResult:
    behavior = output.behavior
    if behavior["type"] == "raise_exception":
        return GuardrailResult.raise_exception(output.output_info)
    if behavior["type"] == "reject_content":
        return GuardrailResult.reject_content(behavior["message"], output.output_info)
    return GuardrailResult.allow(output.output_info)


class _SdkInputGuardrail:
    """An SDK ToolInputGuardrail as a toolfleet input guardrail ``(ctx, args) -> result``."""

    def __init__(self, tool: FunctionToolAdapter, guardrail: ToolInputGuardrail[Any]) -> None:
        self.tool = tool
        self.guardrail = guardrail
        # The SDK's tripwire message names the guardrail object's class; so does ours.
        self.name = type(guardrail).__name__

    async def __call__(self, ctx: ToolContext, args: dict[str, Any]) -> GuardrailResult:
        from agents.tool_guardrails import ToolInputGuardrailData

        data = ToolInputGuardrailData(context=self.tool.sdk_context(ctx), agent=_agent_of(ctx))
        return _verdict(await self.guardrail.run(data))


class _SdkOutputGuardrail:
    """An SDK ToolOutputGuardrail as a toolfleet output guardrail ``(ctx, args, output)``."""

    def __init__(self, tool: FunctionToolAdapter, guardrail: ToolOutputGuardrail[Any]) -> None:
        self.tool = tool
        self.guardrail = guardrail
        self.name = type(guardrail).__name__

    async def __call__(
        self, ctx: ToolContext, args: dict[str, Any], output: Any
    ) -> GuardrailResult:
        from agents.tool_guardrails import ToolOutputGuardrailData

        data = ToolOutputGuardrailData(
            context=self.tool.sdk_context(ctx), agent=_agent_of(ctx), output=output
        )
        return _verdict(await self.guardrail.run(data))


__all__ = ["FunctionToolAdapter", "is_function_tool"]
