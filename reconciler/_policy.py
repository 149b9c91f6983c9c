"""The failure table of DESIGN.md as a pure function: what to do next about one call.

- not_executed (no effect): retry only if replay-safe, same key, within an attempt limit;
- unknown (maybe): probe by idempotency key; after the probe budget, a human task; never
  re-submit blindly;
- wrong_effect (yes): compensation after approval, linked in the audit chain; history is
  only appended.

Nothing here performs I/O; ``reconciler.service`` carries the actions out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from schemas import EffectClass

REPLAY_SAFE: frozenset[EffectClass] = frozenset({"read_only", "idempotent"})
"""Effect classes whose calls may be submitted again with the same idempotency key."""


@dataclass(frozen=True)
class RecoveryPolicy:
    """Budgets of the reconciler."""

    max_attempts: int = 2
    """Executions of one call in all, the first included (only replay-safe calls retry)."""
    probe_budget: int = 4
    """Probes of one unknown call before a human takes over."""
    probe_backoff_s: float = 0.5
    """Delay before the second probe; doubles with each further probe."""
    max_backoff_s: float = 10.0
    report_after_s: float = 30.0
    """How long a reconcile_then_report turn waits for a human before the model is told."""


@dataclass(frozen=True)
class CallCase:
    """What the reconciler knows about the call it is deciding on."""

    effect_class: EffectClass
    has_probe: bool
    has_compensate: bool
    attempts: int
    """Executions so far (the ledger's attempt counter)."""
    probes: int
    """Probes answered so far for the current attempt."""


@dataclass(frozen=True)
class Probe:
    """Ask the tool's probe, after ``delay_s``."""

    delay_s: float


@dataclass(frozen=True)
class ResolveApplied:
    """The effect is there: the call succeeded with ``output``."""

    output: str


@dataclass(frozen=True)
class ResolveNotApplied:
    """The effect is not there and will not be retried: the call did not run."""

    reason: str


@dataclass(frozen=True)
class Retry:
    """Submit the call again, same idempotency key, as a new fenced attempt."""

    reason: str


@dataclass(frozen=True)
class HandOver:
    """Automation stops here: a human task, with why."""

    reason: str


@dataclass(frozen=True)
class AskCompensationApproval:
    """The effect is wrong: ask an operator to approve running the tool's compensate action."""

    reason: str


@dataclass(frozen=True)
class Compensate:
    """Run the tool's compensate action (its approval is recorded)."""


Action = (
    Probe | ResolveApplied | ResolveNotApplied | Retry | HandOver | AskCompensationApproval
    | Compensate
)  # fmt: skip
"""Everything ``decide_*`` can answer."""

ProbeAnswer = Literal["applied", "not_applied", "unknown", "wrong_effect"]
Resolution = Literal[
    "applied", "not_applied", "wrong_effect", "approve_compensation", "reject_compensation"
]


def decide_unknown(case: CallCase, policy: RecoveryPolicy) -> Action:
    """A call's effect became unknown (timeout, lost worker, broker error after start)."""
    if case.effect_class == "read_only":
        return _not_applied_or_retry(case, policy, "a read-only call cannot have applied")
    if not case.has_probe:
        return HandOver("effect unknown and the tool declares no probe")
    return Probe(0.0)


def decide_probe(
    case: CallCase, answer: ProbeAnswer, output: str | None, detail: str | None,
    policy: RecoveryPolicy,
) -> Action:  # fmt: skip
    """The probe answered (``case.probes`` counts this answer)."""
    if answer == "applied":
        return ResolveApplied(output or "")
    if answer == "not_applied":
        return _not_applied_or_retry(case, policy, "the probe found no effect upstream")
    if answer == "wrong_effect":
        return _wrong_effect(case, f"the probe found a wrong effect upstream: {output}")
    if case.probes < policy.probe_budget:
        delay = min(policy.max_backoff_s, policy.probe_backoff_s * 2 ** (case.probes - 1))
        return Probe(delay)
    why = f"; last answer: {detail}" if detail else ""
    return HandOver(f"effect still unknown after {case.probes} probes{why}")


def decide_resolution(case: CallCase, resolution: Resolution, output: str | None) -> Action:
    """An operator answered a human task about the call."""
    if resolution == "applied":
        return ResolveApplied(output or "")
    if resolution == "not_applied":
        return ResolveNotApplied("an operator confirmed the effect did not happen")
    if resolution == "wrong_effect":
        return _wrong_effect(case, "an operator reported a wrong effect")
    if resolution == "approve_compensation":
        return Compensate()
    return HandOver("compensation rejected: the wrong effect stays, for an operator to handle")


def _wrong_effect(case: CallCase, why: str) -> Action:
    if not case.has_compensate:
        return HandOver(f"{why}, and the tool declares no compensate action")
    return AskCompensationApproval(f"{why}; approve to run the tool's compensate action")


def _not_applied_or_retry(case: CallCase, policy: RecoveryPolicy, why: str) -> Action:
    if case.effect_class not in REPLAY_SAFE:
        return HandOver(
            f"{why}, but the tool is {case.effect_class}: it is never re-submitted "
            "automatically; decide whether to run it again"
        )
    if case.attempts >= policy.max_attempts:
        return ResolveNotApplied(f"{why}; attempt limit of {policy.max_attempts} reached")
    return Retry(f"{why}; replay-safe ({case.effect_class}), same idempotency key")
