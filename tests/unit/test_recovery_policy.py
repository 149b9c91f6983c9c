"""The failure table, decided without I/O."""

from __future__ import annotations

from typing import Any

from reconciler import (
    AskCompensationApproval,
    CallCase,
    Compensate,
    HandOver,
    Probe,
    RecoveryPolicy,
    ResolveApplied,
    ResolveNotApplied,
    Retry,
    decide_probe,
    decide_refused,
    decide_resolution,
    decide_transient,
    decide_unknown,
)

POLICY = RecoveryPolicy(max_attempts=2, probe_budget=3, probe_backoff_s=0.5)


def case(**overrides: Any) -> CallCase:
    fields: dict[str, Any] = {
        "effect_class": "non_idempotent", "has_probe": True, "has_compensate": True,
        "attempts": 1, "probes": 0,
    }  # fmt: skip
    return CallCase(**(fields | overrides))


def test_unknown_effect_is_probed_first() -> None:
    assert decide_unknown(case(), POLICY) == Probe(0.0)


def test_unknown_effect_without_a_probe_goes_to_a_human_at_once() -> None:
    action = decide_unknown(case(has_probe=False), POLICY)
    assert isinstance(action, HandOver) and "no probe" in action.reason


def test_an_idempotent_tool_without_a_probe_is_resubmitted_with_the_same_key() -> None:
    action = decide_unknown(case(effect_class="idempotent", has_probe=False), POLICY)
    assert isinstance(action, Retry) and "same idempotency key" in action.reason
    spent = decide_unknown(case(effect_class="idempotent", has_probe=False, attempts=2), POLICY)
    assert isinstance(spent, HandOver) and "after 2 attempts" in spent.reason


def test_a_transient_not_executed_call_is_retried_with_backoff_only_if_replay_safe() -> None:
    def transient(**fields: Any) -> Any:
        return decide_transient(case(**fields), POLICY, output="busy", retry_after_s=None,
                                jitter=0.0)  # fmt: skip

    action = transient(effect_class="idempotent")
    assert isinstance(action, Retry) and action.delay_s == POLICY.retry_backoff_s / 2
    after = decide_transient(case(effect_class="read_only"), POLICY, output="busy",
                             retry_after_s=3.0, jitter=0.9)  # fmt: skip
    assert isinstance(after, Retry) and after.delay_s == 3.0
    # Out of attempts, or not replay-safe: the last attempt's own text is what the model sees.
    for final in (transient(effect_class="idempotent", attempts=2),
                  transient(effect_class="non_idempotent")):  # fmt: skip
        assert isinstance(final, ResolveNotApplied) and final.output == "busy"


def test_an_attempt_that_did_not_run_after_an_unknown_one_proves_nothing_about_it() -> None:
    """Found by the simulator (seeds 80 and 82): an idempotent tool without a probe applied
    on attempt 1 and lost its answer; attempt 2 never left; the call was recorded as not
    executed. With no attempt left, an earlier unknown attempt goes to a person."""
    maybe = case(effect_class="idempotent", has_probe=False, attempts=2, maybe_applied=True)
    spent = decide_transient(maybe, POLICY, output="busy", retry_after_s=None, jitter=0.0)
    assert isinstance(spent, HandOver) and "earlier attempt" in spent.reason
    # With an attempt left it is retried with the same key: the upstream dedupes.
    early = case(effect_class="idempotent", has_probe=False, attempts=1, maybe_applied=True)
    assert isinstance(
        decide_transient(early, POLICY, output="busy", retry_after_s=None, jitter=0.0), Retry
    )
    refused = decide_refused(maybe, output="no")
    assert isinstance(refused, HandOver) and "earlier attempt" in refused.reason
    assert decide_refused(case(attempts=2), output="no") == ResolveNotApplied(
        "attempt 2 was refused", output="no"
    )


def test_probe_applied_resolves_with_the_upstream_output() -> None:
    assert decide_probe(case(probes=1), "applied", "T-1", None, POLICY) == ResolveApplied("T-1")


def test_not_applied_retries_only_replay_safe_tools_with_attempts_left() -> None:
    assert isinstance(decide_probe(case(effect_class="idempotent", probes=1),
                                   "not_applied", None, None, POLICY), Retry)  # fmt: skip
    for effect_class in ("non_idempotent", "irreversible"):
        action = decide_probe(case(effect_class=effect_class, probes=1), "not_applied", None,
                              None, POLICY)  # fmt: skip
        assert isinstance(action, HandOver) and "never re-submitted" in action.reason


def test_retries_are_bounded_by_the_attempt_limit() -> None:
    action = decide_probe(case(effect_class="idempotent", attempts=2, probes=1), "not_applied",
                          None, None, POLICY)  # fmt: skip
    assert isinstance(action, ResolveNotApplied) and "attempt limit" in action.reason


def test_inconclusive_probes_back_off_then_hand_over() -> None:
    delays = [decide_probe(case(probes=n), "unknown", None, "503", POLICY) for n in (1, 2)]
    assert delays == [Probe(0.5), Probe(1.0)]
    action = decide_probe(case(probes=3), "unknown", None, "503", POLICY)
    assert isinstance(action, HandOver) and "after 3 probes; last answer: 503" in action.reason


def test_read_only_unknown_is_retried_not_probed() -> None:
    assert isinstance(decide_unknown(case(effect_class="read_only"), POLICY), Retry)


def test_wrong_effect_asks_for_compensation_approval_and_runs_it_only_when_approved() -> None:
    assert isinstance(decide_resolution(case(), "wrong_effect", None), AskCompensationApproval)
    assert decide_resolution(case(), "approve_compensation", None) == Compensate()
    assert isinstance(decide_resolution(case(), "reject_compensation", None), HandOver)
    no_action = decide_resolution(case(has_compensate=False), "wrong_effect", None)
    assert isinstance(no_action, HandOver) and "no compensate action" in no_action.reason


def test_human_answers_resolve_the_call() -> None:
    assert decide_resolution(case(), "applied", "done") == ResolveApplied("done")
    assert isinstance(decide_resolution(case(), "not_applied", None), ResolveNotApplied)
