"""The recovery table as a pure function: what to do next about one call.

What an outcome's effect is, and whether trying again can help, is ``kernel.rules.effects``'s to
say; this module decides what follows from it:

- not_executed, transient (the request never left, HTTP 429, ``NotExecuted(retryable=True)``):
  retried only if replay-safe, same key, backoff with jitter or Retry-After, attempt limit;
- unknown (maybe): probe by idempotency key; an idempotent tool without a probe is
  re-submitted with the same key (its upstream dedupes); after the probe budget, or without a
  probe, a human task; never re-submitted blindly;
- wrong_effect (yes): compensation after approval, linked in the audit chain; history is
  only appended.

Nothing here performs I/O; ``reconciler.service`` carries the actions out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from kernel.rules.backoff import Backoff
from kernel.rules.effects import REPLAY_SAFE, effect_for_class, fleet_retries, retry_delay
from kernel.settings import Settings
from schemas import EffectClass


def _setting(name: str) -> Any:
    """The default of a setting: the one place a recovery budget's default is written."""
    return Settings.model_fields[name].default


@dataclass(frozen=True)
class RecoveryPolicy:
    """Budgets of the reconciler; the defaults are the settings' (``RecoveryPolicy.of``)."""

    max_attempts: int = _setting("recovery_max_attempts")
    """Executions of one call in all, the first included (only replay-safe calls retry)."""
    probe_budget: int = _setting("recovery_probe_budget")
    """Probes of one unknown call before a human takes over."""
    probe_backoff_s: float = _setting("recovery_probe_backoff_s")
    """Delay before the second probe; doubles with each further probe."""
    max_backoff_s: float = 10.0
    report_after_s: float = _setting("recovery_report_after_s")
    """How long a reconcile_then_report turn waits for a human before the model is told."""
    retry_backoff_s: float = _setting("recovery_retry_backoff_s")
    """First backoff step of a transient retry; doubles per attempt, with jitter."""

    @classmethod
    def of(cls, settings: Settings) -> RecoveryPolicy:
        """The budgets ``settings`` set (TOOLFLEET_RECOVERY_*)."""
        return cls(
            max_attempts=settings.recovery_max_attempts,
            probe_budget=settings.recovery_probe_budget,
            probe_backoff_s=settings.recovery_probe_backoff_s,
            report_after_s=settings.recovery_report_after_s,
            retry_backoff_s=settings.recovery_retry_backoff_s,
        )


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
    maybe_applied: bool = False
    """An earlier attempt's effect is unknown, and no probe has found the key unused since:
    a later attempt that provably did not run says nothing about that one."""


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
    output: str | None = None
    """What the model sees (the last attempt's own text); None: the standard failure text."""


@dataclass(frozen=True)
class Retry:
    """Submit the call again, same idempotency key, as a new fenced attempt, after a delay."""

    reason: str
    delay_s: float = 0.0


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
    """A call's effect became unknown (a transport error or exception after start, a
    timeout, a lost worker, a broker error after start)."""
    if effect_for_class(case.effect_class, "unknown") == "not_executed":
        return _not_applied_or_retry(case, policy, "a read-only call cannot have applied")
    if case.has_probe:
        return Probe(0.0)
    if case.effect_class == "idempotent":
        if case.attempts < policy.max_attempts:
            return Retry(
                "effect unknown and no probe; the tool is idempotent: re-submitted with the "
                "same idempotency key, which its upstream dedupes"
            )
        return HandOver(
            f"effect still unknown after {case.attempts} attempts of an idempotent tool "
            "without a probe"
        )
    return HandOver("effect unknown and the tool declares no probe")


def decide_transient(
    case: CallCase,
    policy: RecoveryPolicy,
    *,
    output: str | None,
    retry_after_s: float | None,
    jitter: float,
) -> Action:
    """An attempt proved not executed, and trying again can help (the worker left it
    unresolved for the fleet's retry). ``jitter`` is a random number in [0, 1)."""
    if fleet_retries(
        "not_executed",
        "transient",
        case.effect_class,
        attempt=case.attempts,
        max_attempts=policy.max_attempts,
        retry_after_s=retry_after_s,
    ):
        delay = retry_delay(
            case.attempts, retry_after_s, base_s=policy.retry_backoff_s,
            cap_s=policy.max_backoff_s, jitter=jitter,
        )  # fmt: skip
        return Retry(
            f"attempt {case.attempts} not executed (transient); replay-safe "
            f"({case.effect_class}), same idempotency key",
            delay,
        )
    if case.maybe_applied:
        return HandOver(
            f"attempt {case.attempts} did not run, and no attempt is left of "
            f"{policy.max_attempts}; an earlier attempt's effect is still unknown"
        )
    return ResolveNotApplied(
        f"not executed (transient), and no attempt is left of {policy.max_attempts}",
        output=output,
    )


def decide_refused(case: CallCase, *, output: str | None) -> Action:
    """An attempt was refused for good (not executed, permanent) after an earlier attempt
    whose effect is unknown: that one may still have applied."""
    if case.maybe_applied:
        return HandOver(
            f"attempt {case.attempts} was refused; an earlier attempt's effect is still unknown"
        )
    return ResolveNotApplied(f"attempt {case.attempts} was refused", output=output)


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
        # Exact steps, no jitter: an unknown call's probes keep their promised schedule.
        steps = Backoff.capped(policy.probe_backoff_s, policy.max_backoff_s)
        return Probe(steps.step(case.probes))
    why = f"; last answer: {detail}" if detail else ""
    return HandOver(f"effect still unknown after {case.probes} probes{why}")


def decide_wrong_effect(case: CallCase, found_by: str) -> Action:
    """Something other than a probe (an output guardrail) found the call's effect wrong."""
    return _wrong_effect(case, f"{found_by} found the effect wrong")


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
