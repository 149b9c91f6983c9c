"""What a turn may take of an attempt's outcome (``kernel.rules.outcomes.reported``)."""

from __future__ import annotations

from kernel.rules.outcomes import ended, reported
from schemas import ExecutionCommand


def _command(attempt: int) -> ExecutionCommand:
    return ExecutionCommand(
        tenant_id="t1", run_id="r1", turn_id=0, call_id="c1", tool_name="charge",
        arguments="{}", fingerprint="f" * 64, idempotency_key="k1", index=0,
        attempt=attempt, fencing_token=attempt, issued_at=1796440000.0, pool="payments",
    )  # fmt: skip


def test_a_first_attempt_that_never_began_settles_as_not_executed() -> None:
    skipped = reported(ended(_command(1), "w1", "skipped"))
    assert (skipped.effect, skipped.resolved) == ("not_executed", True)


def test_a_retry_that_never_began_leaves_the_call_to_the_reconciler() -> None:
    """Attempt 1 may have applied: a retry that did nothing says nothing of it."""
    skipped = reported(ended(_command(2), "w1", "skipped"))
    assert (skipped.effect, skipped.resolved) == ("not_executed", False)


def test_other_outcomes_are_reported_as_they_are() -> None:
    cancelled = ended(_command(2), "w1", "cancelled")  # effect unknown: the reconciler's anyway
    assert reported(cancelled) == cancelled
    probe = ended(_command(2), "w1", "skipped").model_copy(update={"kind": "probe"})
    assert reported(probe) == probe
