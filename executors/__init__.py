"""executors: the worker pools, and the public tool API they serve.

```python
from executors import ToolRegistry, ToolContext, ProbeResult

tools = ToolRegistry()

@tools.tool(effect="non_idempotent", timeout=5.0, needs_approval=False)
async def create_ticket(ctx: ToolContext, title: str, priority: int = 3) -> str: ...

@create_ticket.probe
async def _(ctx: ToolContext) -> ProbeResult: ...

@create_ticket.compensate
async def _(ctx: ToolContext, original_output: str) -> str: ...
```

The tool API is defined in ``kernel.tools`` and re-exported here, where tool authors look for
it; the worker service is ``executors.worker`` (started by ``toolfleet worker``).
"""

from executors._after_publish import AfterPublish
from kernel.tools import (
    ApprovalFunction,
    CallHooks,
    CompensateFunction,
    EffectVerdict,
    GuardrailBehavior,
    GuardrailResult,
    InputGuardrail,
    NotExecuted,
    OnUnknown,
    OutputGuardrail,
    ProbeFunction,
    ProbeResult,
    ProbeState,
    TimeoutBehavior,
    Tool,
    ToolCancelledError,
    ToolContext,
    ToolErrorFunction,
    ToolInputGuardrailTripwireTriggered,
    ToolOutputGuardrailTripwireTriggered,
    ToolRegistry,
    ToolTimeoutError,
    default_tool_error_function,
    default_tool_timeout_error_message,
    guardrail_name,
    run_call,
    run_compensate,
    run_probe,
)

__all__ = [
    "AfterPublish",
    "ApprovalFunction",
    "CallHooks",
    "CompensateFunction",
    "EffectVerdict",
    "GuardrailBehavior",
    "GuardrailResult",
    "InputGuardrail",
    "NotExecuted",
    "OnUnknown",
    "OutputGuardrail",
    "ProbeFunction",
    "ProbeResult",
    "ProbeState",
    "TimeoutBehavior",
    "Tool",
    "ToolCancelledError",
    "ToolContext",
    "ToolErrorFunction",
    "ToolInputGuardrailTripwireTriggered",
    "ToolOutputGuardrailTripwireTriggered",
    "ToolRegistry",
    "ToolTimeoutError",
    "default_tool_error_function",
    "default_tool_timeout_error_message",
    "guardrail_name",
    "run_call",
    "run_compensate",
    "run_probe",
]
