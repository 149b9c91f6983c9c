"""What a tool, its guardrails and its probe see of the call they serve."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from schemas import ExecutionCommand


@dataclass(frozen=True)
class ToolContext:
    """The identity of one call attempt, passed as the optional first parameter of a tool.

    ``idempotency_key`` is stable across attempts of the same call: hand it to the upstream
    system so a retried or reconciled attempt cannot apply the effect twice.
    """

    tenant_id: str
    run_id: str
    turn_id: int
    call_id: str
    tool_name: str
    arguments: str
    """The raw JSON arguments, exactly as the model wrote them."""
    idempotency_key: str
    attempt: int
    fencing_token: int
    args: dict[str, Any] = field(default_factory=dict)
    """The validated arguments (parameter name -> value); empty when they could not be parsed."""
    worker_id: str | None = None
    deadline_at: float | None = None
    """Unix time the turn ends, if the turn has a deadline."""

    @classmethod
    def from_command(
        cls,
        command: ExecutionCommand,
        *,
        worker_id: str | None = None,
        args: dict[str, Any] | None = None,
    ) -> ToolContext:
        """Build the context of the attempt a command describes."""
        return cls(
            tenant_id=command.tenant_id,
            run_id=command.run_id,
            turn_id=command.turn_id,
            call_id=command.call_id,
            tool_name=command.tool_name,
            arguments=command.arguments,
            idempotency_key=command.idempotency_key,
            attempt=command.attempt,
            fencing_token=command.fencing_token,
            args=dict(args or {}),
            worker_id=worker_id,
            deadline_at=command.deadline_at,
        )


ProbeState = Literal["applied", "not_applied", "unknown", "wrong_effect"]
"""What a probe found upstream for an idempotency key."""


@dataclass(frozen=True)
class ProbeResult:
    """The answer of a tool's probe: did the call's effect reach the upstream system?

    Build it with ``ProbeResult.applied(output)``, ``ProbeResult.not_applied()`` or
    ``ProbeResult.unknown()``.
    """

    state: ProbeState
    output: str | None = None
    """For ``applied``: the output the model should see, as if the call had returned it."""
    detail: str | None = None
    """Why the probe answered as it did, for the audit chain and operators."""

    @classmethod
    def applied(cls, output: str, *, detail: str | None = None) -> ProbeResult:
        """The effect is there upstream; ``output`` stands in for the call's lost output."""
        return cls(state="applied", output=str(output), detail=detail)

    @classmethod
    def not_applied(cls, *, detail: str | None = None) -> ProbeResult:
        """The upstream system has no trace of the idempotency key: nothing was applied."""
        return cls(state="not_applied", detail=detail)

    @classmethod
    def wrong_effect(cls, output: str, *, detail: str | None = None) -> ProbeResult:
        """Something was applied upstream, but not what the call asked for: compensate it."""
        return cls(state="wrong_effect", output=str(output), detail=detail)

    @classmethod
    def unknown(cls, detail: str | None = None) -> ProbeResult:
        """The probe could not tell (yet); the reconciler may ask again or escalate."""
        return cls(state="unknown", detail=detail)
