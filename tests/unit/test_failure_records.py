"""What a tool failure's record and log line hold: secrets taken out by a configurable pattern,
a bounded traceback (head and tail, whole lines), and the call named in full with a link to the
console's call view at that attempt."""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

import pytest
from pydantic import ValidationError

from executors import Tool, ToolRegistry, run_call, run_compensate, run_probe
from kernel.settings import TRACEBACK_REDACT_PATTERN, Settings
from kernel.stores.ledger import CallFailure, LedgerEntry
from kernel.tools import FailureRecording, ToolFailure, call_view_path
from kernel.tools._failures import SECRET, TRACEBACK_MAX_BYTES, FailureLog, redact_secrets
from schemas import ExecutionCommand

SECRETS = re.compile(TRACEBACK_REDACT_PATTERN)


def command(arguments: dict[str, Any], **overrides: Any) -> ExecutionCommand:
    fields: dict[str, Any] = {
        "tenant_id": "acme", "run_id": "run/7", "turn_id": 0, "call_id": "call_2",
        "tool_name": "lookup", "arguments": json.dumps(arguments), "index": 0,
        "pool": "default", "attempt": 3, "fencing_token": 3, "idempotency_key": "idem",
        "fingerprint": "fp", "issued_at": time.time(),
    }  # fmt: skip
    return ExecutionCommand(**(fields | overrides))


def make(func: Any) -> Tool:
    return ToolRegistry().tool(name="lookup", effect="read_only", unattended="a unit test")(func)


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        ("connect(password=hunter2, user=bob)", "connect(password=<redacted>, user=bob)"),
        ("{'password': 'two words', 'user': 'bob'}", "{'password': '<redacted>', 'user': 'bob'}"),
        ('{"api_key": "abc123", "n": 1}', '{"api_key": "<redacted>", "n": 1}'),
        ("DB_PASSWORD=topsecret make run", "DB_PASSWORD=<redacted> make run"),
        ("X-Api-Key: k-123456", "X-Api-Key: <redacted>"),
        ("client_secret=abc&grant_type=x", "client_secret=<redacted>&grant_type=x"),
        ("Authorization: Bearer eyJhbGciOi.abc.def", "Authorization: Bearer <redacted>"),
        ("{'Authorization': 'Basic dXNlcjpwYXNz'}", "{'Authorization': '<redacted>'}"),
        ("401: invalid token 9f8e7d6c5b4a3f2e", "401: invalid token <redacted>"),
        (
            "Incorrect API key provided: sk-proj-abcdefghijklmnop1234.",
            "Incorrect API key provided: <redacted>.",
        ),
        ("push refused for ghp_" + "a" * 36, "push refused for <redacted>"),
        ("key AKIAABCDEFGHIJKLMNOP denied", "key <redacted> denied"),
        ("postgres://admin:s3cr3t@db:5432/app", "postgres://admin:<redacted>@db:5432/app"),
    ],
)
def test_the_default_pattern_takes_out_secrets_and_keeps_their_keys(
    text: str, redacted: str
) -> None:
    assert redact_secrets(text, SECRETS) == redacted


@pytest.mark.parametrize(
    "text",
    [
        'File "/app/auth/token.py", line 12, in refresh_token',
        "KeyError: 'api_key'",
        "ValueError: invalid password for user bob",
        "ConnectionRefusedError: [Errno 111] Connection refused",
    ],
)
def test_the_default_pattern_leaves_a_traceback_without_secrets_alone(text: str) -> None:
    assert redact_secrets(text, SECRETS) == text


def test_a_pattern_without_groups_takes_out_the_whole_match() -> None:
    assert redact_secrets("id 4111-1111 and 4222-2222", re.compile(r"\d{4}-\d{4}")) == (
        f"id {SECRET} and {SECRET}"
    )


def test_scanning_a_long_adversarial_text_stays_fast() -> None:
    # A pattern that backtracks over runs of key characters takes seconds on these (9 s on
    # the first, before the key was taken possessively); the default scans each once.
    for text in ("token" * 13_000, "password " * 7_000, "://a" * 16_000, "a." * 30_000):
        began = time.perf_counter()
        redact_secrets(text, SECRETS)
        assert time.perf_counter() - began < 1.0


def test_the_pattern_is_a_setting_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TOOLFLEET_TRACEBACK_REDACT_PATTERN", raising=False)
    assert FailureRecording.of(Settings()).secrets.pattern == TRACEBACK_REDACT_PATTERN  # unset
    monkeypatch.setenv("TOOLFLEET_TRACEBACK_REDACT_PATTERN", r"(?i)card=(\d+)")
    recording = FailureRecording.of(Settings())
    exc = _raised(RuntimeError("declined card=4111111111111111 password=hunter2"))
    failure = recording.failure(exc)
    assert failure.message == "declined card=<redacted> password=hunter2"
    assert "4111111111111111" not in failure.traceback
    monkeypatch.setenv("TOOLFLEET_TRACEBACK_REDACT_PATTERN", "(?!)")  # takes nothing out
    assert FailureRecording.of(Settings()).failure(exc).message == exc.args[0]


def test_a_pattern_that_is_no_regular_expression_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValidationError, match="traceback_redact_pattern"):
        Settings(traceback_redact_pattern="(unclosed")


def test_the_record_takes_out_secrets_and_argument_values_by_default() -> None:
    exc = _raised(PermissionError("GET /v1/items?api_key=k-998877 for Lisbon-7731 refused"))
    failure = ToolFailure.of(exc, {"city": "Lisbon-7731"})
    assert failure.message == "GET /v1/items?api_key=<redacted> for <argument> refused"
    assert "k-998877" not in failure.traceback and "Lisbon-7731" not in failure.traceback


def test_a_long_traceback_keeps_whole_lines_of_its_head_and_tail_and_leaks_no_cut_secret() -> None:
    error: BaseException | None = None
    for step in range(400):  # a chain of exceptions, each message holding a secret
        try:
            raise RuntimeError(f"step {step} password=pw-{step:04d}") from error
        except RuntimeError as raised:
            error = raised
    assert error is not None
    failure = ToolFailure.of(error)
    text = failure.traceback
    assert len(text.encode()) <= TRACEBACK_MAX_BYTES
    assert TRACEBACK_MAX_BYTES == 16_384
    assert text.startswith("Traceback (most recent call last):")
    assert text.rstrip().endswith("RuntimeError: step 399 password=<redacted>")
    cut = re.search(r"\n\[\.\.\. (\d+) bytes cut \.\.\.\]\n", text)
    assert cut is not None
    # The lines on either side of the cut are whole lines of the original.
    original = "".join(__import__("traceback").format_exception(error))
    before = text[: cut.start()].rsplit("\n", 1)[-1]
    after = text[cut.end() :].split("\n", 1)[0]
    assert any(line == before for line in original.split("\n")) or before == ""
    assert re.sub(r"pw-\d{4}", SECRET, after) in [
        re.sub(r"pw-\d{4}", SECRET, line) for line in original.split("\n")
    ]
    assert not re.search(r"pw-\d", text)


def test_a_failure_line_names_the_call_in_full_and_links_to_its_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures = FailureLog(logging.getLogger("test.naming"))
    caplog.set_level(logging.INFO, logger="test.naming")
    exc = _raised(ValueError("boom"))
    cmd = command({})
    failures.report("lookup", ToolFailure.of(exc), exc, command=cmd)
    recording = FailureRecording(console_url="https://console.example/")
    failures.report("lookup", ToolFailure.of(exc), exc, command=cmd, link=recording.link(cmd))
    first, second = caplog.records
    for record in (first, second):
        names = {k: record.__dict__[k] for k in ("tenant_id", "run_id", "call_id", "attempt")}
        assert names == {"tenant_id": "acme", "run_id": "run/7", "call_id": "call_2", "attempt": 3}
    assert first.__dict__["call_view"] == "/calls/acme/call_2?run=run%2F7#attempt-3"
    assert second.__dict__["call_view"] == (
        "https://console.example/calls/acme/call_2?run=run%2F7#attempt-3"
    )


def test_call_view_path_quotes_every_part() -> None:
    assert call_view_path("a b", "r/1", "c#2") == "/calls/a%20b/c%232?run=r%2F1"
    assert call_view_path("t", "r", "c", 2) == "/calls/t/c?run=r#attempt-2"


async def test_run_call_redacts_with_the_workers_pattern_and_names_the_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def lookup(city: str) -> str:
        raise ConnectionError(f"no route to {city}: token=abc-123 rejected")

    kept: list[ToolFailure] = []
    caplog.set_level(logging.INFO, logger="kernel.tools")
    recording = FailureRecording(secrets=re.compile(r"token=(\S+)"), console_url="http://c")
    await run_call(
        make(lookup),
        command({"city": "Atlantis-42"}),
        worker_id="w",
        on_failure=kept.append,
        recording=recording,
    )
    (failure,) = kept
    assert failure.message == "no route to <argument>: token=<redacted> rejected"
    (line,) = [r for r in caplog.records if r.name == "kernel.tools"]
    assert line.__dict__["call_view"] == "http://c/calls/acme/call_2?run=run%2F7#attempt-3"
    assert "abc-123" not in caplog.text and "abc-123" not in (line.exc_text or "")


def _failure(attempt: int, message: str) -> str:
    return CallFailure("ValueError", message, "Traceback ...", attempt, "w1", 1.0).encode()


def test_an_entry_reads_every_failed_attempts_record_in_attempt_order() -> None:
    raw = {
        b"state": b"committed", b"run_id": b"r", b"attempts": b"3",
        b"failure": _failure(3, "third").encode(),
        b"failure:1": _failure(1, "first").encode(),
        b"failure:2": _failure(2, "second").encode(),
        b"failure:9": b"not json",
    }  # fmt: skip
    entry = LedgerEntry.from_hash("acme", "c", raw)
    assert [(f.attempt, f.message) for f in entry.failures] == [
        (1, "first"), (2, "second"), (3, "third"),
    ]  # fmt: skip
    assert entry.failure is not None and entry.failure.attempt == 3


def test_an_entry_written_before_per_attempt_records_reads_its_one_failure() -> None:
    raw = {b"state": b"committed", b"failure": _failure(1, "only").encode()}
    entry = LedgerEntry.from_hash("acme", "c", raw)
    assert [f.message for f in entry.failures] == ["only"]
    assert LedgerEntry.from_hash("acme", "c", {b"state": b"committed"}).failures == ()


async def test_a_failing_compensate_action_is_kept_and_a_failing_probe_is_logged_with_links(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def book(seat: str) -> str:
        return seat

    tool = ToolRegistry().tool(name="lookup", effect="non_idempotent", timeout=5)(book)

    @tool.probe
    async def find(ctx: Any) -> Any:
        raise ConnectionError("probe: password=pw-1 refused")

    @tool.compensate
    async def cancel(ctx: Any, original_output: str) -> str:
        raise RuntimeError("cancel: api_key=k-2 rejected")

    caplog.set_level(logging.INFO, logger="kernel.tools")
    recording = FailureRecording(console_url="https://c")
    answer = await run_probe(tool, command({"seat": "1A"}, kind="probe"), recording=recording)
    assert answer.detail == "probe raised ConnectionError: probe: password=<redacted> refused"
    kept: list[ToolFailure] = []
    compensation = command(
        {"seat": "1A"}, kind="compensate", call_id="call_2#compensate", original_output="1A"
    )
    with pytest.raises(RuntimeError):
        await run_compensate(tool, compensation, recording=recording, on_failure=kept.append)
    assert [f.message for f in kept] == ["cancel: api_key=<redacted> rejected"]
    probe_line, compensate_line = [r for r in caplog.records if r.name == "kernel.tools"]
    # A probe is no attempt: its link is the call's page; a compensation's attempt has one.
    assert probe_line.__dict__["call_view"] == "https://c/calls/acme/call_2?run=run%2F7"
    assert compensate_line.__dict__["call_view"] == (
        "https://c/calls/acme/call_2%23compensate?run=run%2F7#attempt-3"
    )
    assert "pw-1" not in caplog.text and "k-2" not in caplog.text
