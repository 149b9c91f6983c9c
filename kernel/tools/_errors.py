"""Errors a tool call can end in, named and worded as the OpenAI Agents SDK (0.24) names them.

The class names end up in ``CallError.type`` and the messages in ``CallError.message``, so an
operator reading an outcome sees the same words the SDK would have raised in-process.
"""

from __future__ import annotations

from kernel.errors import ToolExecutionError
from kernel.rules.texts import HEARTBEAT_TIMEOUT, timeout_text


def default_tool_timeout_error_message(*, tool_name: str, timeout_seconds: float) -> str:
    """The SDK's model-visible text for a timed-out call (also ToolTimeoutError's message):
    ``kernel.rules.texts.timeout_text``, under the SDK's name for it."""
    return timeout_text(tool_name, timeout_seconds)


class ToolTimeoutError(ToolExecutionError):
    """A tool invocation exceeded its timeout.

    Passed to ``timeout_error_function``; with ``timeout_behavior="raise_exception"`` it is the
    error that fails the turn.
    """

    def __init__(self, tool_name: str, timeout_seconds: float) -> None:
        self.tool_name = tool_name
        self.timeout_seconds = timeout_seconds
        super().__init__(
            default_tool_timeout_error_message(tool_name=tool_name, timeout_seconds=timeout_seconds)
        )


class HeartbeatTimeoutError(ToolTimeoutError):
    """A running tool sent no heartbeat within its heartbeat timeout and was cancelled.

    A ToolTimeoutError, so ``timeout_error_function`` and ``timeout_behavior`` treat it as
    any timeout; its message says which kind it was.
    """

    def __init__(self, tool_name: str, timeout_seconds: float) -> None:
        super().__init__(tool_name, timeout_seconds)
        self.args = (HEARTBEAT_TIMEOUT.format(name=tool_name, seconds=timeout_seconds),)

    def __str__(self) -> str:
        return str(self.args[0])


class ToolCancelledError(ToolExecutionError):
    """What a ``failure_error_function`` receives when the tool itself was cancelled.

    Failure formatters take an ``Exception``; ``asyncio.CancelledError`` is not one, so it is
    adapted, as the SDK does (message: the cancellation's own text or "Tool execution cancelled.").
    """

    def __init__(self, message: str = "") -> None:
        super().__init__(message or "Tool execution cancelled.")


class ToolInputGuardrailTripwireTriggered(ToolExecutionError):
    """An input guardrail answered ``raise_exception``: the turn fails, the tool never runs."""

    def __init__(self, guardrail_name: str) -> None:
        self.guardrail_name = guardrail_name
        super().__init__(f"Tool input guardrail {guardrail_name} triggered tripwire")


class ToolOutputGuardrailTripwireTriggered(ToolExecutionError):
    """An output guardrail answered ``raise_exception``: the turn fails, the output is dropped."""

    def __init__(self, guardrail_name: str) -> None:
        self.guardrail_name = guardrail_name
        super().__init__(f"Tool output guardrail {guardrail_name} triggered tripwire")
