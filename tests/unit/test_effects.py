"""kernel.rules.effects: the classification table and the rules built on it (pure)."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest

from kernel.rules.effects import (
    CLASSIFICATION,
    Budgets,
    EffectVerdict,
    NotExecuted,
    attendance,
    classify_exception,
    counts_against_circuit,
    effect_for_class,
    effect_of_probe,
    fails_turn,
    fleet_retries,
    gated_by_default,
    needs_review,
    parse_retry_after,
    probe_answer,
    retry_delay,
    review_rows,
    settles_call,
)
from schemas import CallOutcome, ToolSpec


def library_error(module: str, name: str, base: type[BaseException] = Exception) -> type:
    """An exception class that reads like ``module.name`` (the libraries are not installed)."""
    return type(name, (base,), {"__module__": module})


@dataclass
class _Response:
    status_code: int
    headers: dict[str, str]


def http_error(module: str, name: str, status: int, headers: dict[str, str] | None = None) -> Any:
    cls = library_error(module, name)
    exc = cls(f"HTTP {status}")
    if module == "aiohttp.client_exceptions":
        exc.status, exc.headers = status, headers or {}
    else:
        exc.response = _Response(status, headers or {})
    return exc


NEVER_LEFT = [
    ConnectionRefusedError("refused"),
    socket.gaierror(-2, "Name or service not known"),
    library_error("httpx._exceptions", "ConnectError")("x"),
    library_error("httpx._exceptions", "ConnectTimeout")("x"),
    library_error("aiohttp.client_exceptions", "ClientConnectorError")("x"),
    library_error("requests.exceptions", "ConnectTimeout")("x"),
]
MAYBE_APPLIED = [
    TimeoutError("read timed out"),
    ConnectionResetError("reset by peer"),
    BrokenPipeError("closed"),
    ValueError("anything else"),
    library_error("httpx._exceptions", "ReadTimeout")("x"),
    library_error("httpx._exceptions", "RemoteProtocolError")("server disconnected"),
    library_error("aiohttp.client_exceptions", "ServerDisconnectedError")("x"),
    library_error("requests.exceptions", "ReadTimeout")("x"),
    http_error("httpx._exceptions", "HTTPStatusError", 502),
    http_error("httpx._exceptions", "HTTPStatusError", 500),
    http_error("requests.exceptions", "HTTPError", 408),
    http_error("aiohttp.client_exceptions", "ClientResponseError", 409),
    asyncio.CancelledError(),
]


@pytest.mark.parametrize("exc", NEVER_LEFT, ids=lambda e: type(e).__name__)
def test_a_request_that_never_left_is_not_executed_and_transient(exc: BaseException) -> None:
    verdict = classify_exception(exc)
    assert (verdict.effect, verdict.retry) == ("not_executed", "transient")


@pytest.mark.parametrize("exc", MAYBE_APPLIED, ids=lambda e: f"{type(e).__name__}:{e}")
def test_a_lost_response_is_an_unknown_effect(exc: BaseException) -> None:
    verdict = classify_exception(exc)
    assert (verdict.effect, verdict.retry) == ("unknown", None)


@pytest.mark.parametrize(
    ("module", "name"),
    [("httpx._exceptions", "HTTPStatusError"), ("requests.exceptions", "HTTPError"),
     ("aiohttp.client_exceptions", "ClientResponseError")],
)  # fmt: skip
def test_http_status_errors_follow_the_table(module: str, name: str) -> None:
    assert classify_exception(http_error(module, name, 404)).retry == "permanent"
    assert classify_exception(http_error(module, name, 403)).effect == "not_executed"
    too_many = classify_exception(http_error(module, name, 429, {"Retry-After": "7"}))
    assert (too_many.effect, too_many.retry, too_many.retry_after_s) == (
        "not_executed", "transient", 7.0,
    )  # fmt: skip
    for status in (408, 409, 500, 502, 503):
        assert classify_exception(http_error(module, name, status)).effect == "unknown"


def test_a_wrapper_is_judged_by_what_it_wraps() -> None:
    new_connection = library_error("urllib3.exceptions", "NewConnectionError")("refused")
    max_retry = library_error("urllib3.exceptions", "MaxRetryError")("pool")
    max_retry.reason = new_connection
    wrapped = library_error("requests.exceptions", "ConnectionError")(max_retry)
    assert classify_exception(wrapped).effect == "not_executed"
    # A wrapper of a reset connection stays unknown; so does an unknown error raised "from" a
    # refused connection (the request may have been sent again after it).
    reset = library_error("requests.exceptions", "ConnectionError")(ConnectionResetError())
    assert classify_exception(reset).effect == "unknown"
    try:
        raise RuntimeError("gave up") from ConnectionRefusedError()
    except RuntimeError as chained:
        assert classify_exception(chained).effect == "unknown"


def test_what_the_tool_declares_comes_first() -> None:
    assert classify_exception(NotExecuted("card declined")) == EffectVerdict(
        "not_executed", "card declined", "permanent"
    )
    busy = classify_exception(NotExecuted("busy", retryable=True, retry_after_s=2))
    assert (busy.retry, busy.retry_after_s) == ("transient", 2)
    assert classify_exception(KeyError("x"), definite=[LookupError]).effect == "not_executed"

    def hook(exc: BaseException) -> EffectVerdict | None:
        return EffectVerdict.wrong_effect("half applied") if isinstance(exc, OSError) else None

    assert classify_exception(ConnectionRefusedError(), hook=hook).effect == "wrong_effect"
    assert classify_exception(ValueError(), hook=hook).effect == "unknown"  # the table

    def broken(exc: BaseException) -> EffectVerdict | None:
        raise RuntimeError("bug in the hook")

    assert classify_exception(ConnectionRefusedError(), hook=broken).effect == "not_executed"


def test_retry_after_reads_seconds_and_http_dates() -> None:
    now = 1_800_000_000.0
    date = format_datetime(datetime.fromtimestamp(now + 30, UTC), usegmt=True)
    assert parse_retry_after("12", now) == 12.0
    assert parse_retry_after(date, now) == pytest.approx(30.0)
    assert parse_retry_after("soon", now) is None and parse_retry_after(None, now) is None


def test_a_read_only_tool_cannot_have_applied_anything() -> None:
    assert effect_for_class("read_only", "unknown") == "not_executed"
    assert effect_for_class("idempotent", "unknown") == "unknown"
    assert effect_for_class("read_only", "applied") == "applied"


def test_the_fleet_retries_only_transient_replay_safe_calls_with_attempts_left() -> None:
    def retries(retry: Any, cls: str, attempt: int = 1, after: float | None = None) -> bool:
        return fleet_retries("not_executed", retry, cls, attempt=attempt, max_attempts=3,
                             retry_after_s=after)  # fmt: skip

    assert retries("transient", "idempotent") and retries("transient", "read_only")
    assert not retries("transient", "non_idempotent")
    assert not retries("permanent", "idempotent")
    assert not retries("transient", "idempotent", attempt=3)
    assert not retries("transient", "idempotent", after=3600)  # too long: the model is told
    assert not fleet_retries("unknown", "transient", "idempotent", attempt=1, max_attempts=3)


def test_backoff_doubles_with_jitter_and_retry_after_wins() -> None:
    delays = [retry_delay(a, None, base_s=0.2, cap_s=10, jitter=0.5) for a in (1, 2, 3)]
    assert delays == pytest.approx([0.15, 0.3, 0.6])
    assert retry_delay(9, None, base_s=0.2, cap_s=10, jitter=0.999) < 10
    assert retry_delay(1, 4.0, base_s=0.2, cap_s=10, jitter=0.5) == 4.0


def _outcome(**fields: Any) -> CallOutcome:
    base: dict[str, Any] = {
        "tenant_id": "t", "run_id": "r", "turn_id": 0, "call_id": "c", "tool_name": "x",
        "index": 0, "attempt": 1, "fencing_token": 1, "status": "failed",
        "effect": "not_executed",
    }  # fmt: skip
    return CallOutcome(**(base | fields))


def test_which_outcome_settles_a_call_and_which_fails_the_turn() -> None:
    pending_retry = _outcome(resolved=False, retry="transient")
    unknown = _outcome(effect="unknown", resolved=False)
    assert not settles_call(pending_retry, "report_now")  # the model sees only the last try
    assert settles_call(unknown, "report_now") and not settles_call(
        unknown, "reconcile_then_report"
    )
    assert settles_call(_outcome(), "reconcile_then_report")
    assert fails_turn(_outcome(), "fail_turn") and not fails_turn(_outcome(), "error_as_output")
    assert not fails_turn(unknown, "fail_turn")
    assert fails_turn(_outcome(fails_turn=True), "error_as_output")
    assert counts_against_circuit("failed") and counts_against_circuit("timed_out")
    assert not counts_against_circuit("succeeded") and not counts_against_circuit("rejected")


def test_probe_answers_and_effects_map_both_ways() -> None:
    for answer in ("applied", "not_applied", "unknown", "wrong_effect"):
        assert probe_answer(effect_of_probe(answer)) == answer  # type: ignore[arg-type]
    assert probe_answer("compensated") == "unknown"


def _spec(**fields: Any) -> ToolSpec:
    return ToolSpec(**({"name": "t", "pool": "p", "parameters": {}} | fields))


def test_the_gate_and_the_review_agree() -> None:
    assert gated_by_default("non_idempotent", False, unattended_reason=None, effect_declared=True)
    assert not gated_by_default(
        "non_idempotent", True, unattended_reason=None, effect_declared=True
    )
    assert not gated_by_default("non_idempotent", False, unattended_reason="why",
                                effect_declared=True)  # fmt: skip
    assert gated_by_default("irreversible", True, unattended_reason="why", effect_declared=True)
    assert not gated_by_default("irreversible", False, unattended_reason=None,
                                effect_declared=False)  # fmt: skip
    sdk = _spec(effect_declared=False, sdk_tool=True)
    assert needs_review(sdk) and "Agents SDK" in attendance(sdk)[1]
    assert not needs_review(_spec(unattended_reason="harmless"))
    assert not needs_review(_spec(has_probe=True)) and not needs_review(
        _spec(needs_approval="always")
    )
    assert not needs_review(_spec(effect_class="idempotent"))


def test_review_rows_cover_every_classification_row_and_the_systemic_one() -> None:
    budgets = Budgets(max_attempts=3, probe_budget=4, circuit_error_rate=0.5, circuit_window_s=60)
    rows = review_rows(_spec(has_probe=True, has_compensate=True), budgets)
    assert [r.signal for r in rows[:-1]] == [signal for signal, _, _ in CLASSIFICATION]
    unknown = next(r for r in rows if r.effect == "unknown")
    assert "probe" in unknown.first_action and unknown.forbidden == "re-submitting blindly"
    read_only = review_rows(_spec(effect_class="read_only"), budgets)
    assert "unknown" not in {r.effect for r in read_only}
    idempotent = review_rows(_spec(effect_class="idempotent"), budgets)
    assert any(
        "same idempotency key" in r.first_action for r in idempotent if r.effect == "unknown"
    )


def test_the_docs_print_the_classification_table_of_the_code() -> None:
    readme = (Path(__file__).parents[2] / "docs" / "concepts" / "effects.md").read_text()
    start = readme.index("<!-- classification table")
    table = readme[readme.index("\n", start) + 1 : readme.index("<!-- end of classification")]
    rows = [line.strip("| ").split(" | ") for line in table.strip().splitlines()[2:]]
    assert [tuple(row) for row in rows] == list(CLASSIFICATION)
