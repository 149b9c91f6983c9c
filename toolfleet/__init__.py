"""toolfleet: run AI agents' tool calls on a horizontally scaled fleet, through Kafka.

The agent runtime's side: ``FleetClient`` submits model responses and collects turn results;
``toolfleet.agents`` runs OpenAI Agents SDK agents on the fleet; ``toolfleet.testing`` helps
test tools and fleets. ``Settings`` configures everything; every error is a ``ToolfleetError``.
"""

from kernel.errors import (
    ConfigurationError,
    CutOffError,
    InfrastructureError,
    InvalidMessageError,
    MissingExtraError,
    ModelBehaviorError,
    ToolExecutionError,
    ToolfleetError,
    ToolNotFoundError,
    UnavailableError,
    UnreplicatedWriteError,
    UsageError,
)
from kernel.settings import Settings
from toolfleet.client import FleetClient, TurnTimeoutError

__all__ = [
    "ConfigurationError",
    "CutOffError",
    "FleetClient",
    "InfrastructureError",
    "InvalidMessageError",
    "MissingExtraError",
    "ModelBehaviorError",
    "Settings",
    "ToolExecutionError",
    "ToolNotFoundError",
    "ToolfleetError",
    "TurnTimeoutError",
    "UnavailableError",
    "UnreplicatedWriteError",
    "UsageError",
]
