"""Tool guardrails: checks that run right before a tool body and right after it.

An input guardrail is a callable ``(ctx, args) -> GuardrailResult``; an output guardrail is
``(ctx, args, output) -> GuardrailResult``; either may be sync or async. They run one after
the other in declaration order, and the first ``reject_content`` or ``raise_exception`` wins,
as in the OpenAI Agents SDK.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from kernel.tools._context import ToolContext

GuardrailBehavior = Literal["allow", "reject_content", "raise_exception", "wrong_effect"]
"""What a guardrail decided."""


@dataclass(frozen=True)
class GuardrailResult:
    """A guardrail's verdict; build it with ``allow()``, ``reject_content(msg)`` or
    ``raise_exception()``."""

    behavior: GuardrailBehavior = "allow"
    message: str | None = None
    """For ``reject_content``: what the model sees instead of the call's output."""
    output_info: Any = None
    """Free-form details about the checks performed, for logs and operators."""

    @classmethod
    def allow(cls, output_info: Any = None) -> GuardrailResult:
        """Let the call (or its output) through unchanged."""
        return cls(behavior="allow", output_info=output_info)

    @classmethod
    def reject_content(cls, message: str, output_info: Any = None) -> GuardrailResult:
        """Replace the call's output with ``message``; the turn goes on."""
        return cls(behavior="reject_content", message=message, output_info=output_info)

    @classmethod
    def raise_exception(cls, output_info: Any = None) -> GuardrailResult:
        """Trip the wire: the whole turn fails with a tripwire error."""
        return cls(behavior="raise_exception", output_info=output_info)

    @classmethod
    def wrong_effect(cls, message: str, output_info: Any = None) -> GuardrailResult:
        """Output guardrails only: the call took effect, but not the one asked for. The
        effect becomes ``wrong_effect``: the reconciler asks for approval of the tool's
        compensation, and the run's later side-effecting calls wait for a human meanwhile;
        ``message`` is what the model sees once it is told."""
        return cls(behavior="wrong_effect", message=message, output_info=output_info)


InputGuardrail = Callable[
    [ToolContext, dict[str, Any]], GuardrailResult | Awaitable[GuardrailResult]
]
"""``(ctx, args) -> GuardrailResult``, sync or async."""

OutputGuardrail = Callable[
    [ToolContext, dict[str, Any], Any], GuardrailResult | Awaitable[GuardrailResult]
]
"""``(ctx, args, output) -> GuardrailResult``, sync or async; ``output`` is the raw value."""


def guardrail_name(guardrail: object) -> str:
    """The name a tripwire message uses: a ``name`` attribute, else ``__name__``, else the class.

    The SDK (0.24) puts the guardrail object's class name into the message, which for its own
    guardrail wrappers is always ``ToolInputGuardrail``/``ToolOutputGuardrail``; toolfleet's
    guardrails are plain callables, so their own name is the informative choice.
    """
    name = getattr(guardrail, "name", None)
    if isinstance(name, str) and name:
        return name
    dunder = getattr(guardrail, "__name__", None)
    if isinstance(dunder, str) and dunder:
        return dunder
    return type(guardrail).__name__


def check_guardrail_result(kind: str, guardrail: object, result: object) -> GuardrailResult:
    """Return ``result`` if it is a GuardrailResult; a guardrail returning anything else is a bug.

    Raises TypeError, which the runner reports like any other guardrail failure.
    """
    if not isinstance(result, GuardrailResult):
        raise TypeError(
            f"{kind} guardrail {guardrail_name(guardrail)} returned {type(result).__name__}; "
            "return GuardrailResult.allow(), .reject_content(message) or .raise_exception()"
        )
    if kind == "input" and result.behavior == "wrong_effect":
        raise TypeError(
            f"input guardrail {guardrail_name(guardrail)} returned wrong_effect, but nothing has "
            "run yet; only output guardrails can find an effect wrong"
        )
    return result
