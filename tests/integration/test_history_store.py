"""The history store (kernel/stores/history.py) on the real Redis of the session, a single
server or (``make test``'s second pass) the 3-master cluster: pages through more than a
thousand turns of several tenants with nothing skipped or repeated, every facet found, a
decision that reaches its turn whichever comes first, a task's resolution, and retention
trimming on write; and on a private 3-master cluster, tenants spread over the shards."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
from redis.asyncio import Redis

from kernel.adapters.redis import ClusterRedis, connect_redis
from kernel.settings import Settings
from kernel.stores.history import (
    Cursor,
    History,
    HistoryEntry,
    Query,
    decision_entry,
    task_entry,
    turn_entry,
)
from kernel.stores.keys import Keys
from schemas import ApprovalDecision, HumanTask, TaskResolution, TurnResult
from tests.conftest import port_is_free
from toolfleet.app.infra.redis_cluster import start_cluster, stop_cluster

pytestmark = pytest.mark.integration

DAY = 86_400


def _turn(
    tenant: str,
    run: str,
    turn_id: int,
    *,
    status: str = "completed",
    tool: str = "lookup",
    call_status: str = "succeeded",
    effect: str = "applied",
    waiting: str | None = None,
    also_ran: str | None = None,
) -> TurnResult:
    ran = [{"call_id": also_ran, "tool_name": "transfer", "status": "succeeded",
            "effect": "applied", "attempts": 1}] if also_ran else []  # fmt: skip
    return TurnResult.model_validate(
        {
            "tenant_id": tenant,
            "run_id": run,
            "turn_id": turn_id,
            "status": status,
            "outputs": [{"call_id": f"c{turn_id}", "output": f"out {turn_id}"}],
            "calls": [
                {
                    "call_id": f"c{turn_id}", "tool_name": tool, "status": call_status,
                    "effect": effect, "attempts": 1, "started_at": 1.0, "finished_at": 2.0,
                },
                *ran,
            ],
            "interruptions": [
                {"call_id": waiting, "tool_name": "transfer", "arguments": "{}"}
            ] if waiting else [],
        }
    )  # fmt: skip


@pytest.fixture
def ns() -> str:
    """A namespace of this test's own: tenants and runs nobody else writes."""
    return uuid.uuid4().hex[:8]


@pytest.fixture
def history(redis: Redis, keys: Keys) -> History:
    return History(redis, keys, retention_s=DAY)


async def _all_pages(
    history: History, tenants: list[str], query: Query, limit: int
) -> list[HistoryEntry]:
    seen: list[HistoryEntry] = []
    cursor: Cursor | None = None
    while True:
        page = await history.search(tenants, query, cursor=cursor, limit=limit)
        assert len(page.entries) <= limit
        seen += page.entries
        if page.cursor is None:
            return seen
        cursor = Cursor.decode(page.cursor.encode())  # as a client sends it back


async def test_paging_through_1200_turns_of_three_tenants_skips_and_repeats_nothing(
    history: History, ns: str
) -> None:
    now = time.time()
    tenants = [f"{ns}-a", f"{ns}-b", f"{ns}-c"]
    turns = [
        (tenant, f"run-{i % 40}", i, now - 3_600 + (i // 3) * 0.5)  # pairs share their ms
        for i in range(1_200)
        for tenant in [tenants[i % 3]]
    ]
    await asyncio.gather(
        *(history.put(turn_entry(_turn(t, run, i), at=at)) for t, run, i, at in turns)
    )
    expected = {(t, run, i) for t, run, i, _ in turns}
    for limit in (100, 7):
        seen = await _all_pages(history, tenants, Query(), limit)
        got = [(e.tenant_id, e.run_id, e.doc["turn_id"]) for e in seen]
        assert len(got) == len(set(got)) == 1_200
        assert [e.position for e in seen] == sorted((e.position for e in seen), reverse=True)
        assert set(got) == expected
    # One tenant and one run: its 10 turns only, newest first.
    page = await history.search([tenants[0]], Query(run="run-3"), limit=50)
    assert [e.doc["turn_id"] for e in page.entries] == list(range(1_083, 0, -120))
    assert page.cursor is None


async def test_every_facet_and_a_time_range_find_the_entries_that_have_it(
    history: History, ns: str
) -> None:
    t, now = f"{ns}-acme", time.time()
    entries = [
        turn_entry(_turn(t, "a-acme-3", 0), at=now - 50, versions={"c0": "2"}),
        turn_entry(
            _turn(t, "a-acme-3", 1, status="failed", tool="quote", call_status="failed",
                  effect="not_executed"),
            at=now - 40, versions={"c1": "1"},
        ),
        turn_entry(_turn(t, "other", 2, tool="quote", effect="unknown"), at=now - 30,
                   versions={"c2": "2"}),
    ]  # fmt: skip
    for entry in entries:
        assert await history.put(entry) == "written"

    async def runs_turns(query: Query) -> list[tuple[str | None, int]]:
        page = await history.search([t], query, limit=50)
        return [(e.run_id, e.doc["turn_id"]) for e in page.entries]

    assert await runs_turns(Query(run="a-acme-3")) == [("a-acme-3", 1), ("a-acme-3", 0)]
    assert await runs_turns(Query(call="c2")) == [("other", 2)]
    assert await runs_turns(Query(tool="quote")) == [("other", 2), ("a-acme-3", 1)]
    assert await runs_turns(Query(tool="quote", version="2")) == [("other", 2)]
    assert await runs_turns(Query(version="lookup@2")) == [("a-acme-3", 0)]
    assert await runs_turns(Query(status="failed")) == [("a-acme-3", 1)]
    assert await runs_turns(Query(call_status="failed")) == [("a-acme-3", 1)]
    assert await runs_turns(Query(effect="unknown")) == [("other", 2)]
    assert await runs_turns(Query(tool="quote", effect="applied")) == []
    assert await runs_turns(Query(since=now - 45, until=now - 35)) == [("a-acme-3", 1)]
    assert await runs_turns(Query(kind="decision")) == []
    page = await history.search([t], Query(run="a-acme-3"), limit=1)
    assert [e.doc["turn_id"] for e in page.entries] == [1] and page.cursor is not None
    rest = await history.search([t], Query(run="a-acme-3"), cursor=page.cursor, limit=1)
    assert [e.doc["turn_id"] for e in rest.entries] == [0]


async def test_a_decision_reaches_its_turn_whether_it_comes_before_or_after_it(
    history: History, ns: str
) -> None:
    t, now = f"{ns}-acme", time.time()

    def decided(run: str, by: str) -> ApprovalDecision:
        return ApprovalDecision(
            tenant_id=t, run_id=run, call_id="pay-1", tool_name="transfer", approve=True,
            decided_by=by,
        )  # fmt: skip

    # The turn first (interrupted), then the decision: it links the turn.
    await history.put(turn_entry(_turn(t, "r1", 0, status="interrupted", waiting="pay-1"),
                                 at=now - 10))  # fmt: skip
    await history.put(decision_entry(decided("r1", "alice"), at=now - 9))
    # The decision first, then the turn's (resumed) result: it takes the decider.
    await history.put(decision_entry(decided("r2", "bob"), at=now - 8))
    await history.put(turn_entry(_turn(t, "r2", 0, waiting="pay-1"), at=now - 7))

    for run, by in (("r1", "alice"), ("r2", "bob")):
        page = await history.search([t], Query(decider=by), limit=10)
        assert [(e.kind, e.run_id) for e in page.entries] == [("turn", run)]
        [call] = [c for c in page.entries[0].calls if c["call_id"] == "pay-1"]
        assert call["decided_by"] == by
        decisions = await history.search([t], Query(kind="decision", decider=by), limit=10)
        assert [e.status for e in decisions.entries] == ["approved"]

    # The resumed turn's result replaces the interrupted one (a later write), decider kept.
    resumed = _turn(t, "r1", 0, also_ran="pay-1")
    await history.put(turn_entry(resumed, at=now - 5, seq="9" * 33))
    page = await history.search([t], Query(run="r1"), limit=10)
    assert [e.status for e in page.entries] == ["completed"]
    [paid] = [c for c in page.entries[0].calls if c["call_id"] == "pay-1"]
    assert (paid["status"], paid["decided_by"]) == ("succeeded", "alice")
    by_alice = await history.search([t], Query(decider="alice", call_status="succeeded"), limit=9)
    assert [e.run_id for e in by_alice.entries] == ["r1"]
    assert (await history.search([t], Query(status="interrupted"), limit=10)).entries == []
    view = await history.run(t, "r1")
    assert [e.kind for e in view.entries] == ["decision", "turn"]
    assert view.entries[1].outputs == {"c0": "out 0"}


async def test_a_task_is_found_open_then_resolved_by_its_decider(history: History, ns: str) -> None:
    t = f"{ns}-acme"
    task = HumanTask(
        tenant_id=t, task_id=f"task-{ns}", tool_name="note", tool_version="1", run_id="r9",
        turn_id=0, call_id="c0", reason="effect unknown", created_at=time.time() - 5,
    )  # fmt: skip
    await history.put(task_entry(task))
    page = await history.search([t], Query(kind="task", status="open"), limit=10)
    assert [e.doc["task_id"] for e in page.entries] == [task.task_id]
    resolution = TaskResolution(
        tenant_id=t, task_id=task.task_id, resolution="applied", decided_by="carol"
    )
    assert await history.resolve_task(resolution, at=time.time()) == "linked"
    assert (await history.search([t], Query(kind="task", status="open"), limit=10)).entries == []
    [found] = (await history.search([t], Query(kind="task", decider="carol"), limit=10)).entries
    assert (found.status, found.doc["resolution"], found.calls[0]["decided_by"]) == (
        "resolved", "applied", "carol",
    )  # fmt: skip
    # A resolution read before its task (another partition): the task takes it when it comes.
    late = task.model_copy(update={"task_id": f"late-{ns}"})
    early = resolution.model_copy(update={"task_id": late.task_id, "decided_by": "dave"})
    assert await history.resolve_task(early, at=time.time()) == "missing"
    await history.put(task_entry(late))
    [found] = (await history.search([t], Query(kind="task", decider="dave"), limit=10)).entries
    assert found.status == "resolved"


async def test_each_write_trims_what_aged_out_of_the_retention_a_bounded_amount(
    redis: Redis, keys: Keys, ns: str
) -> None:
    t, now = f"{ns}-acme", time.time()
    kept_long = History(redis, keys, retention_s=DAY)
    await asyncio.gather(
        *(kept_long.put(turn_entry(_turn(t, f"old-{i}", 0), at=now - 3_600)) for i in range(40))
    )
    index = keys.history(t, "i\x1fk\x1fturn")
    assert await redis.zcard(index) == 40
    short = History(redis, keys, retention_s=600)  # everything above is an hour old
    await short.put(turn_entry(_turn(t, "new-0", 0), at=now))
    assert await redis.zcard(index) == 1 + 40 - 16  # one write: at most 16 trimmed
    await short.put(turn_entry(_turn(t, "new-1", 0), at=now))
    await short.put(turn_entry(_turn(t, "new-2", 0), at=now))
    assert await redis.zcard(index) == 3
    assert 0 < await redis.pttl(keys.history(t, "e\x1fT\x1fnew-0\x1f0")) <= 600_000
    page = await short.search([t], Query(), limit=50)
    assert sorted(e.run_id or "" for e in page.entries) == ["new-0", "new-1", "new-2"]


async def test_the_tenants_with_history_are_listed_for_an_admins_search(
    history: History, ns: str
) -> None:
    now = time.time()
    for tenant in (f"{ns}-x", f"{ns}-y"):
        await history.put(turn_entry(_turn(tenant, "r", 0), at=now))
    listed = await history.tenants()
    assert {f"{ns}-x", f"{ns}-y"} <= set(listed)
    assert not {f"{ns}-x", f"{ns}-y"} & set(await history.tenants(since=now + 3_600))


# --- a private cluster ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    base = next(
        b for b in range(24_100, 25_400, 10)
        if all(port_is_free(p) and port_is_free(p + 10_000) for p in range(b, b + 3))
    )  # fmt: skip
    state: Path = tmp_path_factory.mktemp("history-cluster")
    settings = Settings(state_dir=state, redis_cluster_masters=3, redis_cluster_port=base)
    start_cluster(settings)
    try:
        yield settings.model_copy(
            update={"redis_url": f"redis+cluster://127.0.0.1:{base}/0", "topic_prefix": "h."}
        )
    finally:
        stop_cluster(settings)


@pytest.fixture
async def cluster_client(cluster: Settings) -> AsyncIterator[ClusterRedis]:
    connected = connect_redis(cluster)
    assert isinstance(connected, ClusterRedis)
    yield connected
    await connected.aclose()


@pytest.mark.own_cluster
async def test_on_a_cluster_each_tenant_keeps_to_one_slot_and_tenants_spread_over_shards(
    cluster_client: ClusterRedis, cluster: Settings
) -> None:
    history = History(cluster_client, Keys.of(cluster), retention_s=DAY)
    now = time.time()
    tenants = [f"tenant-{i}" for i in range(12)]
    await asyncio.gather(
        *(
            history.put(turn_entry(_turn(t, f"run-{i % 5}", i), at=now - i))
            for t in tenants
            for i in range(30)
        )
    )
    decision = ApprovalDecision(
        tenant_id="tenant-0", run_id="run-0", call_id="c0", tool_name="transfer", approve=True,
        decided_by="alice",
    )  # fmt: skip
    await history.put(decision_entry(decision, at=now))
    seen = await _all_pages(history, tenants, Query(), 13)
    assert len(seen) == len({(e.tenant_id, e.member) for e in seen}) == 12 * 30
    page = await history.search(["tenant-0"], Query(decider="alice"), limit=10)
    assert [(e.run_id, e.doc["turn_id"]) for e in page.entries] == [("run-0", 0)]
    run = await history.run("tenant-3", "run-2")
    assert sorted(e.doc["turn_id"] for e in run.entries) == [2, 7, 12, 17, 22, 27]
    holding = 0
    for port in range(cluster.redis_cluster_port, cluster.redis_cluster_port + 3):
        node = redis.Redis(port=port)
        try:
            holding += bool(node.keys("*{h.tenant-*"))
        finally:
            node.close()
    assert holding == 3, "every shard holds some tenants' history"
