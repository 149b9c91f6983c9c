"""A failed TurnResult as the exception ``Runner.run`` would have raised in-process."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from agents import FunctionTool
from agents import exceptions as sdk
from agents.tool_guardrails import (
    ToolGuardrailFunctionOutput,
    ToolInputGuardrail,
    ToolOutputGuardrail,
)
from openai.types.responses import ResponseFunctionToolCall

from kernel.errors import ToolfleetError
from kernel.rules.texts import RUN_ERROR
from schemas import CallError, GuardrailVerdict, TurnError
from toolfleet.agents._guardrails import input_guardrail, output_guardrail, sdk_output


class FleetRunError(ToolfleetError, sdk.AgentsException):
    """A fleet failure the SDK runner passes on as it is (an ``AgentsException``)."""


class FleetRunCancelled(FleetRunError):
    """The run was cancelled on the fleet (a CancelRequest without call_id); no tool output."""


class FleetApprovalRequired(FleetRunError):
    """The fleet holds a call for an operator's approval the runner did not ask for.

    The runner asks the tool's own ``needs_approval`` and the fleet's release gate; the fleet
    can still hold a call for a reason the runner cannot see (a wrong effect earlier in the
    run). Decide the call on the fleet, then run again.
    """


class FleetToolNotServed(FleetRunError):
    """A function tool the run called is served by no worker of the fleet, so it ran nowhere.

    FleetRunner never runs a function tool in the runner process: a tool added to an agent at
    any time (by a hook, between runs) runs on the fleet, or the run fails with this error.
    Serve the tool on the workers (``ToolRegistry.from_function_tools``), or, in tests, run the
    agent on ``toolfleet.testing.InProcessFleet``.
    """


class FleetToolError(ToolfleetError):
    """What a function tool raised on a worker, as ``RunConfig.tool_error_formatter`` sees it.

    The exception itself stayed in the worker's process; ``type`` is its class name and the
    message its text there (``ToolErrorFormatterArgs.error`` is this object).
    """

    def __init__(self, type: str, message: str) -> None:
        super().__init__(message)
        self.type = type


def tool_exception(type_name: str, message: str) -> Exception:
    """What a tool raised on a worker, as the runner can give it: never the object itself,
    which stayed in the worker's process.

    An exception of a Python built-in class (``ValueError``, ``RuntimeError``, ...) is rebuilt
    from its class name and text, so that ``isinstance`` checks of built-in classes hold as
    in-process; any other class (the application's, the SDK's, pydantic's), or a built-in one
    whose text its constructor would not give back (``KeyError``), is a ``FleetToolError``
    naming it.
    """
    cls = getattr(builtins, type_name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            rebuilt = cls(message)
        except Exception:  # a class whose constructor wants more than a text
            rebuilt = None
        if rebuilt is not None and str(rebuilt) == message:
            return rebuilt
    return FleetToolError(type_name, message)


class FleetTurnError(FleetRunError):
    """A turn failure with no SDK exception class to stand for it.

    For example a tool that died of a BaseException (``type`` is its class name) or a tool-local
    cancellation without a failure handler (``type`` "CancelledError"): in-process those
    propagate out of ``Runner.run`` as they are, which a remote failure cannot do.
    """

    def __init__(self, error: TurnError) -> None:
        super().__init__(error.message)
        self.type = error.type
        self.call_id = error.call_id


def run_error(
    error: TurnError,
    calls: Sequence[ResponseFunctionToolCall],
    tools: Sequence[FunctionTool],
    *,
    raised: CallError | None = None,
) -> Exception:
    """The SDK exception for a failed turn, with the fleet's message (the SDK's own texts).

    ``calls`` are the turn's function calls and ``tools`` the agent's, to fill the attributes
    some SDK exceptions carry (the timed-out tool's name and timeout, the guardrail).
    ``raised`` is the failing call's error (its record in the TurnResult): where the SDK wraps
    a tool's exception in ``UserError("Error running tool ...")``, that exception, as
    ``tool_exception`` gives it, is the UserError's ``__cause__``, as in-process.
    """
    call = next((c for c in calls if c.call_id == error.call_id), None)
    tool = _tool_of(call, tools)
    exc = _sdk_exception(error, call, tool)
    cause = _wrapped(error, raised, call)
    if cause is not None and isinstance(exc, sdk.UserError):
        exc.__cause__ = cause
    return exc


def _wrapped(
    error: TurnError, raised: CallError | None, call: ResponseFunctionToolCall | None
) -> Exception | None:
    """The tool exception a UserError("Error running tool {name}: {error}") wraps, if any."""
    if raised is None or call is None or error.type != "UserError" or raised.type == "UserError":
        return None
    prefix = RUN_ERROR.format(name=call.name, error="")
    if not error.message.startswith(prefix):
        return None
    return tool_exception(raised.type, error.message.removeprefix(prefix))


def _sdk_exception(
    error: TurnError, call: ResponseFunctionToolCall | None, tool: FunctionTool | None
) -> Exception:
    exc: Exception
    if error.type == "ToolTimeoutError":
        seconds = tool.timeout_seconds if tool and tool.timeout_seconds else 0.0
        exc = sdk.ToolTimeoutError(tool.name if tool else (call.name if call else ""), seconds)
    elif error.type == "ToolInputGuardrailTripwireTriggered":
        tripped = _tripwire(error, "input")
        if tripped is not None:
            exc = sdk.ToolInputGuardrailTripwireTriggered(
                input_guardrail(tool, tripped), sdk_output(tripped)
            )
        else:
            found = tool.tool_input_guardrails if tool else None
            guardrail = found[0] if found and len(found) == 1 else _unknown_input_guardrail()
            exc = sdk.ToolInputGuardrailTripwireTriggered(guardrail, _tripped())
    elif error.type == "ToolOutputGuardrailTripwireTriggered":
        tripped = _tripwire(error, "output")
        if tripped is not None:
            exc = sdk.ToolOutputGuardrailTripwireTriggered(
                output_guardrail(tool, tripped), sdk_output(tripped)
            )
        else:
            found_out = tool.tool_output_guardrails if tool else None
            guardrail_out = (
                found_out[0] if found_out and len(found_out) == 1 else _unknown_output_guardrail()
            )
            exc = sdk.ToolOutputGuardrailTripwireTriggered(guardrail_out, _tripped())
    else:
        cls = getattr(sdk, error.type, None)
        if (
            isinstance(cls, type)
            and issubclass(cls, sdk.AgentsException)
            and error.type in _MESSAGE_ONLY
        ):
            exc = cls(error.message)
        else:
            return FleetTurnError(error)
    exc.args = (error.message,)  # the fleet's words, which are the SDK's
    if hasattr(exc, "message"):
        exc.message = error.message
    return exc


_MESSAGE_ONLY = frozenset(
    {
        "AgentsException",
        "ModelBehaviorError",
        "UserError",
        "MaxTurnsExceeded",
        "ModelRefusalError",
        "ModelTimeoutError",
        "MCPToolCancellationError",
    }
)
"""SDK exception classes constructed from a message alone."""


def _tool_of(
    call: ResponseFunctionToolCall | None, tools: Sequence[FunctionTool]
) -> FunctionTool | None:
    if call is None:
        return None
    key = f"{call.namespace}.{call.name}" if getattr(call, "namespace", None) else call.name
    return next((t for t in tools if t.qualified_name == key), None)


def _tripwire(error: TurnError, kind: str) -> GuardrailVerdict | None:
    """The verdict that tripped, as the worker reported it (None from an older worker)."""
    return next(
        (
            v
            for v in reversed(error.guardrails)
            if v.kind == kind and v.behavior == "raise_exception"
        ),
        None,
    )


def _tripped() -> ToolGuardrailFunctionOutput:
    return ToolGuardrailFunctionOutput.raise_exception(output_info="tripped on the fleet")


def _never(data: Any) -> ToolGuardrailFunctionOutput:
    """Stands in for a guardrail that ran on the fleet and cannot be named from here."""
    return _tripped()


def _unknown_input_guardrail() -> ToolInputGuardrail[Any]:
    return ToolInputGuardrail(guardrail_function=_never, name="fleet")


def _unknown_output_guardrail() -> ToolOutputGuardrail[Any]:
    return ToolOutputGuardrail(guardrail_function=_never, name="fleet")
