"""executors: the public tool API and the runner of single calls.

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
"""

from executors._context import ProbeResult, ProbeState, ToolContext
from executors._errors import (
    ToolCancelledError,
    ToolInputGuardrailTripwireTriggered,
    ToolOutputGuardrailTripwireTriggered,
    ToolTimeoutError,
    default_tool_timeout_error_message,
)
from executors._guardrails import (
    GuardrailBehavior,
    GuardrailResult,
    InputGuardrail,
    OutputGuardrail,
    guardrail_name,
)
from executors._recovery import run_compensate, run_probe
from executors._registry import ToolRegistry
from executors._runner import CallHooks, run_call
from executors._tool import (
    ApprovalFunction,
    CompensateFunction,
    OnUnknown,
    ProbeFunction,
    TimeoutBehavior,
    Tool,
    ToolErrorFunction,
    default_tool_error_function,
)
from toolfleet.effects import EffectVerdict, NotExecuted

__all__ = [
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
