"""planner: turns model responses into plans and commands; the pure decision logic lives here."""

from planner._identity import (
    EMPTY_CALL_ID,
    REUSED_COMPLETED,
    REUSED_IN_FLIGHT,
    REUSED_IN_RESPONSE,
    fingerprint,
    idempotency_key,
    lookup_key,
    parse_arguments,
)
from planner._planning import (
    DEFAULT_REJECTION_MESSAGE,
    ApprovalState,
    ApprovalView,
    Decision,
    Dispatch,
    FailurePolicy,
    LedgerState,
    LedgerUpdate,
    LedgerView,
    PlanResult,
    next_to_release,
    plan_turn,
)

__all__ = [
    "DEFAULT_REJECTION_MESSAGE",
    "EMPTY_CALL_ID",
    "REUSED_COMPLETED",
    "REUSED_IN_FLIGHT",
    "REUSED_IN_RESPONSE",
    "ApprovalState",
    "ApprovalView",
    "Decision",
    "Dispatch",
    "FailurePolicy",
    "LedgerState",
    "LedgerUpdate",
    "LedgerView",
    "PlanResult",
    "fingerprint",
    "idempotency_key",
    "lookup_key",
    "next_to_release",
    "parse_arguments",
    "plan_turn",
]
