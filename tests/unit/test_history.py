"""The history's pure parts (kernel/stores/history.py): entries from the fleet's messages,
the indexes an entry is in, cursors, how a query is planned and checked, and the merge of
several tenants' walks into one page that skips nothing and repeats nothing."""

from __future__ import annotations

import itertools
import random

import pytest

from kernel.errors import UsageError
from kernel.stores.history import (
    Cursor,
    HistoryEntry,
    InvalidCursorError,
    InvalidQueryError,
    Query,
    TenantScan,
    decision_entry,
    member_of,
    merge,
    seq_of,
    task_entry,
    turn_entry,
)
from schemas import ApprovalDecision, HumanTask, TurnResult
from toolfleet.app.console._history_views import query_of, turn_event


def _result(**kw: object) -> TurnResult:
    fields: dict[str, object] = {
        "tenant_id": "acme",
        "run_id": "a-acme-3",
        "turn_id": 2,
        "status": "interrupted",
        "outputs": [{"call_id": "c1", "output": "x" * 5_000}],
        "interruptions": [{"call_id": "c2", "tool_name": "pay", "arguments": "{}"}],
        "calls": [
            {
                "call_id": "c1", "tool_name": "lookup", "status": "succeeded",
                "effect": "applied", "attempts": 2, "started_at": 10.0, "finished_at": 11.5,
            }
        ],
    } | kw  # fmt: skip
    return TurnResult.model_validate(fields)


def test_a_turn_entry_holds_each_call_with_version_timings_and_a_cut_output() -> None:
    entry = turn_entry(
        _result(), at=12.0, versions={"c1": "2"}, traces={"c1": "ab" * 16}, output_max_bytes=100
    )
    assert (entry.kind, entry.ident, entry.status) == ("turn", "a-acme-3\x1f2", "interrupted")
    done, waiting = entry.calls
    assert (done.tool, done.version, done.status, done.effect) == (
        "lookup", "2", "succeeded", "applied",
    )  # fmt: skip
    assert done.details["attempts"] == 2 and done.details["trace_id"] == "ab" * 16
    assert (waiting.call_id, waiting.status, waiting.effect) == (
        "c2", "pending_approval", "not_executed",
    )  # fmt: skip
    assert entry.outputs is not None and len(entry.outputs["c1"].encode()) <= 100
    assert entry.details["started_at"] == 10.0 and entry.details["finished_at"] == 11.5
    assert set(entry.indexes()) == {
        ("kind", "turn"), ("run", "a-acme-3"), ("status", "interrupted"),
        ("call", "c1"), ("tool", "lookup"), ("version", "lookup@2"),
        ("call_status", "succeeded"), ("effect", "applied"),
        ("call", "c2"), ("tool", "pay"), ("call_status", "pending_approval"),
        ("effect", "not_executed"),
    }  # fmt: skip


def test_decisions_and_tasks_are_entries_found_by_their_decider_and_call() -> None:
    decision = ApprovalDecision(
        tenant_id="acme", run_id="r", call_id="c2", tool_name="pay", approve=False,
        decided_by="alice", message="no",
    )  # fmt: skip
    entry = decision_entry(decision, at=5.0)
    assert entry.status == "rejected"
    assert ("decider", "alice") in entry.indexes() and ("call", "c2") in entry.indexes()
    task = HumanTask(
        tenant_id="acme", task_id="task-1", kind="circuit_open", tool_name="pay",
        tool_version="3", reason="failing", calls=["c1", "c2"], created_at=9.0,
    )  # fmt: skip
    found = task_entry(task)
    assert (found.at, found.status, found.run_id) == (9.0, "open", None)
    assert ("version", "pay@3") in found.indexes()


def test_members_sort_by_time_and_seqs_by_timestamp_then_offset() -> None:
    times = [0.001, 9.5, 10.0, 1_700_000_000.123, 99.0]
    ordered = sorted(member_of(t, "turn", "r\x1f0") for t in times)
    assert [int(m[:13]) for m in ordered] == sorted(int(t * 1000) for t in times)
    assert seq_of(1_000, 99) < seq_of(1_000, 100) < seq_of(1_001, 0)


def test_a_cursor_round_trips_and_anything_else_is_refused() -> None:
    cursor = Cursor(member_of(12.0, "turn", "run\x1f0"), "acme")
    assert Cursor.decode(cursor.encode()) == cursor
    for bad in ("", "nope", "eyJ4IjoxfQ", Cursor("123\x1fT\x1fr", "t").encode()):
        with pytest.raises(InvalidCursorError):
            Cursor.decode(bad)


def test_a_query_asks_its_kind_first_and_a_version_goes_with_its_tool() -> None:
    query = Query(run="r", tool="pay", version="2", decider="alice")
    assert query.facets() == [
        ("kind", "turn"), ("run", "r"), ("tool", "pay"), ("version", "pay@2"),
        ("decider", "alice"),
    ]  # fmt: skip
    assert Query(version="pay@2").facets() == [("kind", "turn"), ("tool", "pay"),
                                               ("version", "pay@2")]  # fmt: skip
    with pytest.raises(InvalidQueryError, match="tool"):
        Query(version="2")
    with pytest.raises(InvalidQueryError, match="kind"):
        Query(kind="outcome")  # type: ignore[arg-type]
    with pytest.raises(InvalidQueryError, match="swap"):
        Query(since=10.0, until=5.0)


def test_the_upper_bound_is_the_nearer_of_the_cursor_and_until() -> None:
    cursor = Cursor(member_of(50.0, "turn", "r\x1f0"), "m")
    assert Query().upper(None, "a") == "+"
    assert Query().upper(cursor, "a") == "[" + cursor.member  # sorts before m: included
    assert Query().upper(cursor, "z") == "(" + cursor.member
    assert Query(until=20.0).upper(cursor, "z") == "(" + f"{20_001:013d}"
    assert Query(until=80.0).upper(cursor, "z") == "(" + cursor.member
    assert Query(since=1.5).lower() == "[" + f"{1_500:013d}"


def _entry(tenant: str, ms: int, **doc: object) -> HistoryEntry:
    m = member_of(ms / 1000, "turn", f"r{ms}\x1f0")
    return HistoryEntry(tenant, "turn", m, {"kind": "turn", "at": ms / 1000, **doc})


def test_a_turn_matches_call_facets_only_when_one_call_has_them_all() -> None:
    entry = _entry(
        "acme", 1, run_id="r1", status="completed",
        calls=[{"call_id": "c1", "tool": "pay", "status": "failed", "effect": "unknown"},
               {"call_id": "c2", "tool": "lookup", "status": "succeeded", "effect": "applied"}],
    )  # fmt: skip
    assert Query(tool="pay", effect="unknown").matches(entry)
    assert not Query(tool="pay", effect="applied").matches(entry)  # two calls, not one
    assert Query(run="r1", status="completed").matches(entry)
    assert not Query(kind="decision").matches(entry)
    assert not Query(since=0.002).matches(entry) and Query(until=0.001).matches(entry)


def _walk(
    tenant: str, entries: list[HistoryEntry], after: Cursor | None, limit: int, budget: int
) -> TenantScan:
    """What one tenant's walk finds, as History._scan would: every entry matches."""
    rest = [e for e in entries if after is None or e.position < after]
    rest.sort(key=lambda e: e.position, reverse=True)
    looked = rest[:budget]
    hits = looked[:limit]
    last = hits[-1] if len(hits) == limit else (looked[-1] if looked else None)
    done = len(rest) <= (looked.index(last) + 1 if last else 0)
    return TenantScan(tenant, hits, last.member if last else None, done)


@pytest.mark.parametrize("limit,budget", [(1, 1), (7, 3), (50, 2_000), (10, 10)])
def test_paging_through_several_tenants_skips_nothing_and_repeats_nothing(
    limit: int, budget: int
) -> None:
    rng = random.Random(limit * 1_000 + budget)
    tenants = {t: [_entry(t, rng.randrange(1, 500)) for _ in range(120)] for t in "abc"}
    # Many share a millisecond, across tenants and within one: the order is (member, tenant).
    everything = sorted(
        (e for es in tenants.values() for e in es), key=lambda e: e.position, reverse=True
    )
    everything = list({(e.member, e.tenant_id): e for e in everything}.values())
    for es in tenants.values():
        es[:] = list({e.member: e for e in es}.values())
    seen: list[HistoryEntry] = []
    cursor: Cursor | None = None
    for _ in itertools.count():
        scans = [_walk(t, es, cursor, limit, budget) for t, es in tenants.items()]
        page, cursor = merge(scans, limit)
        assert len(page) <= limit
        seen += page
        if cursor is None:
            break
    assert [e.position for e in seen] == [e.position for e in everything]


def test_the_apis_parameters_become_a_query_and_bad_ones_say_what_to_change() -> None:
    query = query_of(
        {"kind": "task", "status": "open", "since": "2026-12-06T10:00:00Z", "until": "1800000000"}
    )
    assert (query.kind, query.status, query.until) == ("task", "open", 1_800_000_000.0)
    assert query.since == 1_796_551_200.0
    assert query_of({"tool": "pay", "version": "2", "run": ""}).facets() == [
        ("kind", "turn"), ("tool", "pay"), ("version", "pay@2"),
    ]  # fmt: skip
    with pytest.raises(UsageError, match="ISO 8601"):
        query_of({"since": "yesterday"})
    with pytest.raises(UsageError, match="kind"):
        query_of({"kind": "outcome"})


def test_a_history_turn_reads_like_a_live_feed_turn() -> None:
    entry = _entry(
        "acme", 5_000, run_id="r", turn_id=3, status="interrupted", error=None,
        calls=[{"call_id": "c1", "tool": "pay", "status": "succeeded", "effect": "applied",
                "attempts": 2},
               {"call_id": "c2", "tool": "pay", "status": "pending_approval",
                "effect": "not_executed", "reason": "held"}],
    )  # fmt: skip
    event = turn_event(entry)
    assert (event["kind"], event["turn_id"], event["received_at"]) == ("turn", 3, 5.0)
    assert event["calls"] == [{"call_id": "c1", "tool_name": "pay", "status": "succeeded",
                               "effect": "applied", "attempts": 2}]  # fmt: skip
    assert event["interruptions"] == [{"call_id": "c2", "tool_name": "pay", "reason": "held"}]
