"""The message toolfleet hands back to the agent runtime: one result per turn."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas._base import Message, WireModel
from schemas.internal import CallError, CallStatus, Effect, GuardrailVerdict, TurnError


class FunctionCallOutput(WireModel):
    """An output item the runtime can append to the model's next input as it is."""

    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    output: str


class Interruption(WireModel):
    """A call waiting for approval."""

    call_id: str
    tool_name: str
    arguments: str
    reason: str | None = Field(
        default=None,
        description="Why the call waits when it is more than its approval policy: a run held "
        "after a wrong effect, say.",
    )


class CallRecord(WireModel):
    """Per-call bookkeeping for dashboards and audits."""

    call_id: str
    tool_name: str
    status: CallStatus
    effect: Effect
    attempts: int = Field(ge=0)
    started_at: float | None = None
    finished_at: float | None = None
    guardrails: list[GuardrailVerdict] = Field(
        default_factory=list, description="The tool's guardrails that ran, in the order they ran."
    )
    error: CallError | None = Field(
        default=None, description="What the tool raised, when its failure was handled."
    )
    value: str | None = Field(
        default=None,
        description="The body's return value as JSON when it is not text itself, so an agent "
        "runtime can give the application the object (None: the output is all there is).",
    )
    run_context: str | None = Field(
        default=None,
        description="The run context's copy as the call left it, as JSON text, when the call "
        "changed it (None: unchanged, or no copy travelled).",
    )


class TurnResult(Message):
    """Every call of one turn, settled: outputs in model order, interruptions, the error."""

    topic = "turn-results"

    run_id: str = Field(min_length=1)
    turn_id: int = Field(ge=0)
    status: Literal["completed", "interrupted", "failed", "cancelled"]
    outputs: list[FunctionCallOutput] = Field(default_factory=list, description="In model order.")
    interruptions: list[Interruption] = Field(default_factory=list)
    error: TurnError | None = None
    next_tool_choice: Literal["auto"] | None = Field(
        default=None,
        description="'auto' when the agent used a tool and resets tool_choice for its next call.",
    )
    calls: list[CallRecord] = Field(default_factory=list)
