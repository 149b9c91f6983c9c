"""A queued call's payload: written by ``waiting_command``, read back by ``queued_command``.

Its format is the one every planner version reads (``pool SEP traceparent SEP command
JSON``): during a rolling upgrade old and new planners admit each other's queued calls."""

from __future__ import annotations

from kernel.stores.admission import SEP, queued_command, waiting_command
from schemas import ExecutionCommand

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _command(**update: object) -> ExecutionCommand:
    command = ExecutionCommand(
        tenant_id="t1",
        run_id="r1",
        turn_id=0,
        call_id="c1",
        tool_name="charge",
        arguments='{"amount": 5}',
        fingerprint="f" * 64,
        idempotency_key="k1",
        index=0,
        attempt=2,
        fencing_token=3,
        issued_at=1796440000.123456,
        pool="payments",
    )
    return command.model_copy(update=update)


def test_a_queued_command_reads_back_with_its_pool_trace_kind_and_issue_time() -> None:
    command = _command()
    queued = queued_command(waiting_command(command, TRACEPARENT).payload)
    assert (queued.pool, queued.traceparent, queued.kind) == ("payments", TRACEPARENT, "execute")
    assert queued.issued_at == command.issued_at  # exactly: the float round-trips
    assert queued.command() == command.model_copy(update={"admitted": True})


def test_a_command_queued_with_an_issue_time_carries_that_time() -> None:
    command = _command()
    queued = queued_command(waiting_command(command, TRACEPARENT, issued_at=1796440001.5).payload)
    assert queued.issued_at == 1796440001.5
    assert queued.command() == command.model_copy(
        update={"admitted": True, "issued_at": 1796440001.5}
    )


def test_a_command_queued_without_trace_context_has_none() -> None:
    queued = queued_command(waiting_command(_command(kind="probe")).payload)
    assert (queued.traceparent, queued.kind) == (None, "probe")


def test_the_payload_keeps_the_format_every_planner_version_reads() -> None:
    command = _command()
    payload = waiting_command(command, TRACEPARENT).payload
    raw = command.model_copy(update={"admitted": True}).encode().decode()
    assert payload == SEP.join(("payments", TRACEPARENT, raw))
    # Queued by a planner that kept no trace context:
    queued = queued_command(SEP.join(("payments", raw)))
    assert (queued.pool, queued.command_json, queued.traceparent) == ("payments", raw, None)
    assert (queued.kind, queued.issued_at) == ("execute", 1796440000.123456)


def test_a_payload_whose_command_cannot_be_read_is_still_handed_out_as_it_is() -> None:
    # Its worker dead-letters the bytes with the reason; the admission metrics must not stop
    # them from being sent.
    for raw in ("{not json", "[]", '{"kind": "execute"}'):
        queued = queued_command(SEP.join(("payments", TRACEPARENT, raw)))
        assert (queued.pool, queued.command_json, queued.traceparent) == (
            "payments",
            raw,
            TRACEPARENT,
        )
        assert (queued.kind, queued.issued_at) == ("unreadable", None)
