"""The tool API: declare tools, and run one call through its whole lifecycle.

Tool authors import these names from ``executors`` (the worker pools' package re-exports them);
the worker, the SDK adapter and ``toolfleet.testing`` use them from here.
"""

from kernel.rules.effects import EffectVerdict, NotExecuted
from kernel.tools._context import ProbeResult, ProbeState, ToolContext, current_tool_context
from kernel.tools._deferred import Deferred
from kernel.tools._errors import (
    HeartbeatTimeoutError,
    ToolCancelledError,
    ToolInputGuardrailTripwireTriggered,
    ToolOutputGuardrailTripwireTriggered,
    ToolTimeoutError,
    default_tool_timeout_error_message,
)
from kernel.tools._failures import FailureRecording, ToolFailure, call_view_path
from kernel.tools._guardrails import (
    GuardrailBehavior,
    GuardrailResult,
    InputGuardrail,
    OutputGuardrail,
    guardrail_name,
)
from kernel.tools._heartbeat import HEARTBEAT_WRITE_S, MAX_DETAILS_BYTES, HeartbeatWriter
from kernel.tools._progress import ProgressSink
from kernel.tools._recovery import run_compensate, run_probe
from kernel.tools._registry import ToolRegistry
from kernel.tools._runner import CallHooks, accept_completion, output_text, run_call
from kernel.tools._sdk import FunctionToolAdapter, is_function_tool
from kernel.tools._tool import (
    ApprovalFunction,
    CompensateFunction,
    FleetOptions,
    OnUnknown,
    ProbeFunction,
    TimeoutBehavior,
    Tool,
    ToolErrorFunction,
    default_tool_error_function,
)

__all__ = [
    "HEARTBEAT_WRITE_S",
    "MAX_DETAILS_BYTES",
    "ApprovalFunction",
    "CallHooks",
    "CompensateFunction",
    "Deferred",
    "EffectVerdict",
    "FailureRecording",
    "FleetOptions",
    "FunctionToolAdapter",
    "GuardrailBehavior",
    "GuardrailResult",
    "HeartbeatTimeoutError",
    "HeartbeatWriter",
    "InputGuardrail",
    "NotExecuted",
    "OnUnknown",
    "OutputGuardrail",
    "ProbeFunction",
    "ProbeResult",
    "ProbeState",
    "ProgressSink",
    "TimeoutBehavior",
    "Tool",
    "ToolCancelledError",
    "ToolContext",
    "ToolErrorFunction",
    "ToolFailure",
    "ToolInputGuardrailTripwireTriggered",
    "ToolOutputGuardrailTripwireTriggered",
    "ToolRegistry",
    "ToolTimeoutError",
    "accept_completion",
    "call_view_path",
    "current_tool_context",
    "default_tool_error_function",
    "default_tool_timeout_error_message",
    "guardrail_name",
    "is_function_tool",
    "output_text",
    "run_call",
    "run_compensate",
    "run_probe",
]
