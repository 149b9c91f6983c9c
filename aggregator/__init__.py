"""aggregator: assembles each turn's outcomes into one TurnResult, in model order."""

from aggregator._turn import (
    TurnState,
    TurnStatus,
    accept_outcome,
    build_result,
    is_settled,
    turn_error,
    unsettled_calls,
)

__all__ = [
    "TurnState",
    "TurnStatus",
    "accept_outcome",
    "build_result",
    "is_settled",
    "turn_error",
    "unsettled_calls",
]
