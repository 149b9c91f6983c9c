"""aggregator: assembles each turn's outcomes into one TurnResult, in model order."""

from aggregator._store import StoredTurn, TurnStore
from aggregator._turn import (
    TurnState,
    TurnStatus,
    accept_outcome,
    build_result,
    for_a_resumed_plan,
    is_settled,
    keep_early,
    turn_error,
    unsettled_calls,
)

__all__ = [
    "StoredTurn",
    "TurnState",
    "TurnStatus",
    "TurnStore",
    "accept_outcome",
    "build_result",
    "for_a_resumed_plan",
    "is_settled",
    "keep_early",
    "turn_error",
    "unsettled_calls",
]
