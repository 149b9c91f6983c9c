"""State versions: what a service does at start, what it writes, what ``toolfleet migrate``
does (kernel.rules.state_versions, pure)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from kernel.rules.state_versions import (
    FEATURES,
    OLDEST_READ,
    STATE_VERSION,
    VERSIONS,
    Marker,
    carries,
    client_id,
    for_readers,
    newer_record,
    on_start,
    plan,
    record_version,
    refusal,
    spec_for_readers,
    version_of_client,
)
from schemas import ExecutionCommand, RunContextCopy, ToolSpec

BASELINE = Path(__file__).resolve().parents[2] / "kernel" / "stores" / "baseline.toml"


def test_the_baseline_is_recorded_by_its_full_commit_id_as_state_version_1() -> None:
    with BASELINE.open("rb") as f:
        recorded = tomllib.load(f)
    assert len(recorded["commit"]) == 40 and int(recorded["commit"], 16) >= 0
    assert recorded["state_version"] == 1 == OLDEST_READ


def test_every_version_up_to_this_releases_says_what_it_brought() -> None:
    assert sorted(VERSIONS) == list(range(1, STATE_VERSION + 1))
    assert all(1 < v <= STATE_VERSION for v in FEATURES.values())


# --- the marker -----------------------------------------------------------------------------
def test_a_marker_round_trips_through_its_hash_fields() -> None:
    marker = Marker(2, by="toolfleet migrate --finish", at=1_700_000_000.5)
    assert Marker.decode(marker.fields()) == marker


def test_no_version_field_is_no_marker() -> None:
    assert Marker.decode({}) is None
    assert Marker.decode({"by": "someone"}) is None


@pytest.mark.parametrize("raw", ["", "two", "-1", "0", "1.5"])
def test_a_marker_that_holds_no_version_is_refused_with_what_to_do(raw: str) -> None:
    with pytest.raises(ValueError, match="no state version: fix it by hand"):
        Marker.decode({"version": raw})


# --- one record ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "version"),
    [(None, 1), ("", 1), ("1", 1), ("2", 2), (3, 3), ("x", 10**9), ("0", 10**9), ("-2", 10**9)],
)
def test_a_records_version_field_absent_is_the_baselines_and_garbage_is_never_read(
    raw: str | int | None, version: int
) -> None:
    assert record_version(raw) == version


def test_a_record_newer_than_this_release_is_refused_naming_what_to_run() -> None:
    assert newer_record("ledger entry", STATE_VERSION) is None
    why = newer_record("ledger entry", STATE_VERSION + 1)
    assert why is not None
    assert why.startswith(f"a ledger entry of state version {STATE_VERSION + 1} was written")
    assert "unreadable" in (newer_record("human task", 10**9) or "")


# --- a service starting ---------------------------------------------------------------------
def test_fresh_state_records_this_releases_version() -> None:
    decision = on_start(None, used=False)
    assert (decision.in_force, decision.record, decision.refuse) == (
        STATE_VERSION, STATE_VERSION, None,
    )  # fmt: skip


def test_state_that_has_run_without_a_marker_is_the_baselines() -> None:
    decision = on_start(None, used=True)
    assert (decision.in_force, decision.record, decision.refuse) == (1, None, None)


@pytest.mark.parametrize("version", range(OLDEST_READ, STATE_VERSION + 1))
def test_every_version_this_release_reads_lets_it_start(version: int) -> None:
    decision = on_start(Marker(version), used=True)
    assert (decision.in_force, decision.record, decision.refuse) == (version, None, None)


def test_state_of_a_newer_release_refuses_the_start_and_says_what_to_run() -> None:
    decision = on_start(Marker(STATE_VERSION + 1), used=True)
    assert decision.refuse is not None
    assert f"at version {STATE_VERSION + 1}, written by a newer toolfleet" in decision.refuse
    assert "Run the release that raised it" in decision.refuse


def test_state_older_than_this_release_reads_refuses_and_says_to_upgrade_in_steps() -> None:
    assert refusal(OLDEST_READ - 1) is not None
    assert "Upgrade through the releases in between" in (refusal(OLDEST_READ - 1) or "")
    assert refusal(OLDEST_READ) is None and refusal(STATE_VERSION) is None


# --- what services write --------------------------------------------------------------------
def _command(**fields: object) -> ExecutionCommand:
    return ExecutionCommand.model_validate(
        {
            "tenant_id": "acme", "run_id": "r", "turn_id": 0, "call_id": "c", "tool_name": "t",
            "arguments": "{}", "index": 0, "pool": "default", "attempt": 1,
            "fencing_token": 1, "idempotency_key": "k", "fingerprint": "f", "issued_at": 1.0,
            **fields,
        }
    )  # fmt: skip


def test_a_run_context_travels_only_once_version_2_is_in_force() -> None:
    assert not carries(1, "run_context")
    assert carries(2, "run_context")
    assert carries(STATE_VERSION + 5, "run_context")  # never more than this release writes


def test_commands_for_version_1_workers_leave_out_the_run_context_and_the_call_item() -> None:
    rich = _command(
        run_context=RunContextCopy(agent="a", value='{"x": 1}'), tool_call={"id": "fc_1"}
    )
    plain = for_readers(rich, 1)
    assert (plain.run_context, plain.tool_call) == (None, None)
    assert plain.model_copy(update={"run_context": rich.run_context}) != rich  # only those two
    assert b"run_context" not in plain.encode() and b"tool_call" not in plain.encode()
    assert for_readers(rich, 2) is rich


def test_a_command_without_them_is_passed_as_it_is() -> None:
    command = _command()
    assert for_readers(command, 1) is command


def test_a_services_kafka_client_id_names_its_state_version() -> None:
    assert client_id("planner") == f"toolfleet-planner.state{STATE_VERSION}"
    assert version_of_client(client_id("worker-default")) == STATE_VERSION
    assert version_of_client("toolfleet-planner") == 1  # the baseline's
    assert version_of_client("toolfleet-console.state7") == 7


# --- toolfleet migrate ----------------------------------------------------------------------
def test_migrate_on_fresh_state_puts_this_releases_version_in_force() -> None:
    decided = plan(None, used=False, finish=False)
    assert (decided.current, decided.target, decided.refuse) == (None, STATE_VERSION, None)


def test_migrate_before_the_upgrade_records_the_baselines_version_and_keeps_it_in_force() -> None:
    decided = plan(None, used=True, finish=False)
    assert (decided.current, decided.target, decided.refuse) == (None, 1, None)
    assert decided.steps[0] == "no version marker: the baseline's state, version 1, recorded"
    assert "toolfleet migrate --finish" in decided.steps[-1]


def test_migrate_again_writes_nothing() -> None:
    decided = plan(Marker(1), used=True, finish=False)
    assert (decided.current, decided.target, decided.refuse) == (1, None, None)
    done = plan(Marker(STATE_VERSION), used=True, finish=True)
    assert (done.target, done.refuse) == (None, None)
    assert done.steps[-1] == f"version {STATE_VERSION} already in force"


def test_finish_waits_while_a_service_of_an_earlier_release_runs() -> None:
    decided = plan(
        Marker(1), used=True, finish=True, earlier=["planner: toolfleet-planner", "aggregator: x"]
    )
    assert decided.target is None
    assert decided.refuse is not None and "finish the rollout first" in decided.refuse
    assert decided.waiting_for == ["aggregator: x", "planner: toolfleet-planner"]


def test_finish_once_every_service_runs_this_release_raises_the_version_in_force() -> None:
    decided = plan(Marker(1), used=True, finish=True)
    assert (decided.current, decided.target, decided.refuse) == (1, STATE_VERSION, None)
    assert decided.steps[-1].startswith(f"version {STATE_VERSION} in force: ")


def test_finish_without_a_marker_records_and_raises_in_one_go() -> None:
    decided = plan(None, used=True, finish=True)
    assert (decided.current, decided.target) == (None, STATE_VERSION)


@pytest.mark.parametrize("version", [OLDEST_READ - 1, STATE_VERSION + 1])
def test_migrate_refuses_state_this_release_does_not_read(version: int) -> None:
    for finish in (False, True):
        decided = plan(Marker(version), used=True, finish=finish)
        assert decided.target is None and decided.refuse == refusal(version)


# --- version 3: tools that run for hours -----------------------------------------------------


def _retry(**fields: object) -> ExecutionCommand:
    return _command(attempt=2, heartbeat_details='{"page": 7}', **fields)


def test_heartbeat_details_travel_only_once_version_3_is_in_force() -> None:
    assert STATE_VERSION >= 3 and FEATURES["long_running"] == 3 and 3 in VERSIONS
    assert not carries(2, "long_running") and carries(3, "long_running")
    retried = _retry()
    assert for_readers(retried, 3) is retried
    assert for_readers(retried, 2).heartbeat_details is None
    assert b"heartbeat_details" not in for_readers(retried, 2).encode()
    plain = _command()
    assert for_readers(plain, 2) is plain  # nothing to leave out: the same command


def test_version_1_readers_lose_both_the_run_context_and_the_details() -> None:
    both = _retry(run_context=RunContextCopy(value='{"user": "u"}'), tool_call={"id": "fc_1"})
    for_v1 = for_readers(both, 1)
    assert (for_v1.run_context, for_v1.tool_call, for_v1.heartbeat_details) == (None, None, None)
    for_v2 = for_readers(both, 2)
    assert for_v2.run_context is not None and for_v2.heartbeat_details is None


def test_a_spec_with_the_new_timeouts_is_published_as_version_2_reads_it() -> None:
    spec = ToolSpec(
        name="t", pool="default", parameters={}, timeout_s=5, schedule_to_start_s=30,
        heartbeat_timeout_s=2,
    )  # fmt: skip
    old = spec_for_readers(spec, 2)
    raw = json.loads(old.model_dump_json())
    assert "schedule_to_start_s" not in raw and "heartbeat_timeout_s" not in raw
    assert raw["timeout_s"] == 5
    new = json.loads(spec_for_readers(spec, 3).model_dump_json())
    assert (new["schedule_to_start_s"], new["heartbeat_timeout_s"]) == (30, 2)
    # A version-2 reader's model is this one without the new fields: it reads what we write.
    assert ToolSpec.model_validate_json(old.model_dump_json()) == old
