"""The one exception tree of toolfleet: every error it raises is a ToolfleetError."""

from __future__ import annotations


class ToolfleetError(Exception):
    """Root of every error toolfleet raises; the message says what to do next."""


class ConfigurationError(ToolfleetError):
    """A setting, flag or tool declaration is invalid; fix the configuration and restart."""


class InfrastructureError(ToolfleetError):
    """Kafka or Redis could not be started, reached or stopped; the message names which and why."""


class InvalidMessageError(ToolfleetError):
    """A message on a topic is not valid for its schema; it belongs in the dead-letter topic."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class ToolNotFoundError(ToolfleetError):
    """A call names a tool no worker pool has published; publish the tool or fix the call."""


class ToolExecutionError(ToolfleetError):
    """A tool failed in a way its failure policy turns into a failed turn."""


class ModelBehaviorError(ToolfleetError):
    """The model produced tool calls that cannot be executed safely (reused or empty call IDs)."""


class CutOffError(InfrastructureError):
    """This instance could not reach Kafka or Redis for longer than the cut-off bound while
    its peers may: it gives up its partitions, waits until both answer, and rejoins."""
