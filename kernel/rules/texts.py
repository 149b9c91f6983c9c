"""Model-visible texts: the Agents SDK's, as it words them, and those toolfleet adds."""

from __future__ import annotations

from schemas import ToolSpec

UNKNOWN_OUTCOME = (
    "The outcome of tool '{name}' is unknown: it may or may not have taken effect, and it is "
    "under review. Do not call it again for the same purpose; the result will be reported "
    "when it is known."
)
"""An unresolved call under reconcile_then_report: never says it failed, never invites a retry."""

DEFAULT_ERROR = "An error occurred while running the tool. Please try again."
"""The SDK's text for a failed call: also what the model sees for one proven not applied."""

CIRCUIT_OPEN = (
    "Tool '{name}' is temporarily unavailable: its current version failed too often "
    "recently ({reason}) and was switched off until an operator re-enables it. It did not "
    "run. Do not retry it now."
)
"""A call refused because its tool version's circuit is open."""

COMPENSATED = (
    "Tool '{name}' applied a wrong effect, which has been reversed. Nothing of it remains."
)
"""A call whose wrong effect was compensated (after approval)."""

OUTPUT_TOO_LARGE = (
    "Tool '{name}' returned {size} bytes, more than the {limit}-byte limit; the output was not "
    "kept. Ask for less (a narrower query, a page of results)."
)
"""A call whose output was over TOOLFLEET_MAX_OUTPUT_BYTES (its effect is what the body did)."""

TIMEOUT = "Tool '{name}' timed out after {seconds:g} seconds."
"""The SDK's timeout text, which report_now tools show for an unknown effect (``timeout_text``)."""

NEVER_STARTED_DEADLINE = (
    "Tool '{name}' was not started: the turn's deadline passed while the call waited for "
    "capacity. It had no effect."
)
"""A call still waiting for admission at its turn's deadline (toolfleet's own text)."""

HEARTBEAT_TIMEOUT = "Tool '{name}' sent no heartbeat for {seconds:g} seconds and was stopped."
"""A body cancelled by its heartbeat timeout (toolfleet's own text, in the SDK's manner)."""

NOT_STARTED_IN_TIME = (
    "Tool '{name}' was not started within {seconds:g} seconds of the call (its "
    "schedule-to-start timeout). It had no effect."
)
"""A call that waited longer than its tool's schedule-to-start timeout: never started."""

TOOL_NOT_FOUND = "Tool '{name}' not found."
"""The SDK's text for a call of a tool that is not there (``return_error_to_model``)."""

TOOL_NOT_IN_AGENT = "Tool {name} not found in agent {agent}"
"""The SDK's ModelBehaviorError for a call of a tool that is not there (``raise_error``)."""

TOOL_DISABLED = "Tool {name} is currently disabled for agent {agent}."
"""The SDK's ModelBehaviorError for a call of a disabled tool (the planner's check)."""

TOOL_DISABLED_ON_WORKER = "Tool {name} is currently disabled."
"""The same, found by a worker that serves the tool disabled (it does not know the agent)."""

RUN_ERROR = "Error running tool {name}: {error}"
"""The SDK's error for a failure no failure handler words for the model: the turn fails."""


def timeout_text(name: str, seconds: float) -> str:
    """The SDK's text for a call of tool ``name`` that timed out after ``seconds``: the model
    sees it, and it is the message of the ToolTimeoutError that fails a turn."""
    return TIMEOUT.format(name=name, seconds=seconds)


def unknown_outcome_text(spec: ToolSpec) -> str:
    """What the model sees for a call whose effect is unknown, per the tool's on_unknown."""
    if spec.on_unknown == "report_now" and spec.timeout_s is not None:
        return timeout_text(spec.name, spec.timeout_s)
    return UNKNOWN_OUTCOME.format(name=spec.name)
