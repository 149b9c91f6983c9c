"""Wire models of toolfleet (pydantic v2); JSON Schema copies live in ``schemas/json/``."""

from schemas._base import SCHEMA_VERSION, Message, WireModel, describe_validation_error
from schemas._errors import InvalidMessageError, ToolfleetError
from schemas.inbound import (
    AgentRef,
    ApprovalDecision,
    CancelRequest,
    FunctionCallItem,
    ModelResponseEvent,
    TurnConfig,
)
from schemas.internal import (
    CallError,
    CallOutcome,
    CallStatus,
    DeadLetter,
    Disposition,
    Effect,
    EffectClass,
    ErrorSeverity,
    ExecutionCommand,
    GuardrailVerdict,
    HumanTask,
    PlannedCall,
    RetryHint,
    TaskResolution,
    ToolSpec,
    TurnError,
    TurnPlan,
)
from schemas.outbound import CallRecord, FunctionCallOutput, Interruption, TurnResult

EXPORTED_MODELS: tuple[type[WireModel], ...] = (
    ModelResponseEvent,
    ApprovalDecision,
    CancelRequest,
    TurnResult,
    ExecutionCommand,
    TurnPlan,
    CallOutcome,
    HumanTask,
    TaskResolution,
    DeadLetter,
)
"""The top-level messages whose JSON Schema is published in ``schemas/json/``."""

__all__ = [
    "EXPORTED_MODELS",
    "SCHEMA_VERSION",
    "AgentRef",
    "ApprovalDecision",
    "CallError",
    "CallOutcome",
    "CallRecord",
    "CallStatus",
    "CancelRequest",
    "DeadLetter",
    "Disposition",
    "Effect",
    "EffectClass",
    "ErrorSeverity",
    "ExecutionCommand",
    "FunctionCallItem",
    "FunctionCallOutput",
    "GuardrailVerdict",
    "HumanTask",
    "Interruption",
    "InvalidMessageError",
    "Message",
    "ModelResponseEvent",
    "PlannedCall",
    "RetryHint",
    "TaskResolution",
    "ToolSpec",
    "ToolfleetError",
    "TurnConfig",
    "TurnError",
    "TurnPlan",
    "TurnResult",
    "WireModel",
    "describe_validation_error",
]
