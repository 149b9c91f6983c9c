"""The console's history against the real Kafka, Redis and fleet: the recorder inside the
console fills it from real turns, decisions, tasks and cancellations; the search finds each
facet (the run ``a-acme-3`` among them); the run view has every turn's calls, outputs,
decisions and tasks in order; 1,200 turns page with nothing skipped or repeated, through
``/api/history`` and ``/api/recent`` alike; a tenant-scoped viewer never reads another
tenant's history, whatever she sends; bad records are dead-lettered by the console."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from redis.asyncio import Redis

from kernel.adapters.bus import KafkaBus
from kernel.errors import InvalidMessageError
from kernel.settings import Settings
from kernel.stores.keys import Keys
from schemas import CancelRequest, DeadLetter, ModelResponseEvent, TurnResult
from tests.conftest import wait_for
from tests.integration.console_support import (
    FLEET_ENV,
    TOKENS,
    TRACE_TEMPLATE,
    bearer,
    records,
    served_console,
    tokens_setting,
    turn,
)
from toolfleet.app.console._history import HistoryRecorder
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]

VIEWER_TOKENS = TOKENS | {"acme-viewer": ("viewer", ["acme"])}


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    """The console's fleet, serving tools of this module's own (``history_tools``)."""
    with LocalFleet(
        settings, tools="tests.integration.history_tools:tools", workers=1, extra_env=FLEET_ENV
    ) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


@pytest.fixture(scope="module")
async def console(settings: Settings, client: FleetClient) -> AsyncIterator[str]:
    """A console for every tenant, recording the history; API tokens are the only way in."""
    update = {
        "trace_url_template": TRACE_TEMPLATE,
        "console_tokens": SecretStr(tokens_setting(VIEWER_TOKENS)),
    }
    async with served_console(settings.model_copy(update=update)) as url:
        yield url


@pytest.fixture
async def http(console: str) -> AsyncIterator[httpx.AsyncClient]:
    """The console as alice, an operator of every tenant."""
    async with httpx.AsyncClient(base_url=console, timeout=10, headers=bearer("alice")) as session:
        yield session


async def _entries(http: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    """One page (up to 500) of ``/api/history`` with ``params``."""
    answer = await http.get("/api/history", params={"limit": 500, **params})
    assert answer.status_code == 200, answer.text
    return list(answer.json()["entries"])


async def _until(http: httpx.AsyncClient, count: int, **params: Any) -> list[dict[str, Any]]:
    """The first page of ``params`` once it holds ``count`` entries (the recorder is behind
    the topics by the time a record takes)."""

    async def enough() -> list[dict[str, Any]] | None:
        found = await _entries(http, **params)
        return found if len(found) >= count else None

    found = await wait_for(enough, within=60)
    assert found is not None
    return found


def _turns(entries: list[dict[str, Any]]) -> list[int]:
    return [e["turn_id"] for e in entries]


async def _run_turn(client: FleetClient, event: ModelResponseEvent) -> TurnResult:
    return await client.run_turn(event, within=60)


async def test_the_recorder_fills_the_history_and_the_search_finds_every_facet(
    http: httpx.AsyncClient, client: FleetClient, fleet: LocalFleet
) -> None:
    run, since = "a-acme-3", time.time()
    lookup = turn("acme", ("a", "h_lookup", {"city": "Lisbon"}), run_id=run, turn_id=0)
    failing = turn("acme", ("q", "h_quote", {"fail": True}), run_id=run, turn_id=1)
    approval = turn("acme", ("t", "h_transfer", {"amount": 5, "to": "x"}), run_id=run, turn_id=2)
    for event in (lookup, failing):
        assert (await _run_turn(client, event)).status == "completed"
    assert (await _run_turn(client, approval)).status == "interrupted"
    # The interrupted turn is in the history, waiting; bob approves it on the console.
    [waiting] = await _until(http, tenant="acme", count=1, run=run, status="interrupted")
    assert waiting["calls"][0]["status"] == "pending_approval"
    decision = {"tenant_id": "acme", "run_id": run, "call_id": f"{run}-t", "approve": True}
    sent = await http.post("/api/approvals/decide", json=decision, headers=bearer("bob"))
    assert sent.status_code == 202, sent.text
    await _until(
        http, tenant="acme", count=1, run=run, decider="token:bob"
    )  # the decision reached its turn
    assert (await _run_turn(client, approval.model_copy(update={"resume": True}))).status == (
        "completed"
    )
    # A lost response: an operator settles it from a human task.
    lost = turn("acme", ("n", "h_note", {"text": "h1", "mode": "apply_then_drop"}), run_id=run,
                turn_id=3)  # fmt: skip
    await client.submit(lost)
    [task] = await _until(http, tenant="acme", count=1, kind="task", run=run)
    assert (task["status"], task["task_kind"], task["calls"][0]["call_id"]) == (
        "open", "unknown_effect", f"{run}-n",
    )  # fmt: skip
    answer = {"resolution": "applied", "output": "noted h1"}
    resolved = await http.post(f"/api/tasks/{task['task_id']}/resolve", json=answer)
    assert resolved.status_code == 202, resolved.text
    assert (await result_of(fleet, client, run, 3)).status == "completed"
    cancelled = f"cancel-{uuid.uuid4().hex[:8]}"
    await client.cancel(
        CancelRequest(tenant_id="acme", run_id=cancelled, reason="test", decided_by="carol")
    )

    # Every turn of the run, newest first; the resumed turn once, completed.
    found = await _until(http, tenant="acme", count=4, run=run, status="completed")
    assert _turns(found) == [3, 2, 1, 0]
    assert _turns(await _entries(http, tenant="acme", run=run)) == [3, 2, 1, 0]
    assert _turns(await _entries(http, tenant="acme", call=f"{run}-q")) == [1]
    assert _turns(await _entries(http, tenant="acme", run=run, tool="h_quote")) == [1]
    [quoted] = await _entries(http, tenant="acme", run=run, tool="h_quote", version="2")
    assert (quoted["calls"][0]["version"], quoted["calls"][0]["status"]) == ("2", "failed")
    assert quoted["calls"][0]["error"]["message"] == "quote v2 is broken"
    assert await _entries(http, tenant="acme", run=run, version="h_quote@1") == []
    assert _turns(await _entries(http, tenant="acme", run=run, call_status="failed")) == [1]
    assert _turns(await _entries(http, tenant="acme", run=run, effect="applied")) == [3, 2, 0]
    assert (
        _turns(await _entries(http, tenant="acme", run=run, tool="h_quote", effect="applied")) == []
    )
    assert _turns(await _entries(http, tenant="acme", run=run, decider="token:bob")) == [2]
    assert _turns(await _entries(http, tenant="acme", run=run, since=since, until=time.time())) == [
        3,
        2,
        1,
        0,
    ]
    assert await _entries(http, tenant="acme", run=run, until=since - 1) == []
    [approved] = await _entries(http, tenant="acme", kind="decision", run=run)
    assert (approved["status"], approved["calls"][0]["decided_by"]) == ("approved", "token:bob")
    [done] = await _until(http, tenant="acme", count=1, kind="task", run=run, status="resolved")
    assert (done["resolution"], done["calls"][0]["decided_by"]) == ("applied", "token:alice")
    [cancel] = await _until(
        http, tenant="acme", count=1, kind="cancellation", decider="carol", run=cancelled
    )
    assert (cancel["status"], cancel["whole_run"]) == ("cancelled", True)
    # The live console's recent turns come from the history too.
    recent = (
        await http.get("/api/recent", params={"tenant": "acme", "run": run, "outcomes": "0"})
    ).json()
    assert [e["turn_id"] for e in recent["events"]] == [0, 1, 2, 3]  # oldest first
    assert {e["source"] for e in recent["events"]} == {"history"}


async def test_the_run_view_has_every_turn_in_order_with_its_calls_decisions_and_tasks(
    http: httpx.AsyncClient, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    run = f"view-{uuid.uuid4().hex[:8]}"
    await _run_turn(client, turn("acme", ("a", "h_lookup", {"city": "Porto"}), run_id=run))
    waits = turn("acme", ("t", "h_transfer", {"amount": 9, "to": "y"}), run_id=run, turn_id=1)
    assert (await _run_turn(client, waits)).status == "interrupted"
    decision = {"tenant_id": "acme", "run_id": run, "call_id": f"{run}-t", "approve": False,
                "message": "Not this one."}  # fmt: skip
    assert (await http.post("/api/approvals/decide", json=decision)).status_code == 202
    await _until(http, 1, kind="decision", run=run)
    assert (await _run_turn(client, waits.model_copy(update={"resume": True}))).status == (
        "completed"
    )
    await _until(http, 1, run=run, status="completed", call_status="rejected")

    view = (await http.get(f"/api/runs/acme/{run}")).json()
    assert (view["tenant_id"], view["run_id"], view["cursor"]) == ("acme", run, None)
    first, second = view["turns"]
    assert (first["turn_id"], second["turn_id"]) == (0, 1)
    [looked_up] = first["calls"]
    assert (looked_up["tool"], looked_up["status"], looked_up["effect"]) == (
        "h_lookup", "succeeded", "applied",
    )  # fmt: skip
    assert looked_up["attempts"] == 1 and looked_up["output"] == "Porto: sunny"
    assert looked_up["duration_s"] is not None and looked_up["duration_s"] >= 0
    assert looked_up["version"] == "1"
    stored = await redis.hget(keys.call("acme", run, f"{run}-a"), "trace_id")
    trace_id = stored.decode() if isinstance(stored, bytes) else ""
    assert looked_up["trace"] == (
        {"id": trace_id, "url": TRACE_TEMPLATE.format(trace_id=trace_id)} if trace_id else None
    )
    [refused] = second["calls"]
    assert (refused["status"], refused["output"]) == ("rejected", "Not this one.")
    assert refused["decision"]["status"] == "rejected"
    assert refused["decision"]["decided_by"] == "token:alice"
    assert [d["status"] for d in view["decisions"]] == ["rejected"]


async def test_1200_turns_page_through_the_api_with_nothing_skipped_or_repeated(
    http: httpx.AsyncClient, settings: Settings, bus: KafkaBus
) -> None:
    tenant = f"pager-{uuid.uuid4().hex[:6]}"
    results = [
        TurnResult(tenant_id=tenant, run_id=f"run-{i % 50}", turn_id=i, status="completed")
        for i in range(1_200)
    ]
    sent = [await bus.publish("turn-results", r.run_id, r) for r in results]
    await asyncio.gather(*sent)

    async def pages(path: str, key: str, limit: int) -> list[tuple[str, int]]:
        seen: list[tuple[str, int]] = []
        cursor = None
        while True:
            params: dict[str, str | int] = {"tenant": tenant, "limit": limit, "outcomes": "0"}
            if cursor:
                params["cursor"] = cursor
            answer = await http.get(path, params=params)
            body = answer.json()
            seen += [(e["run_id"], e["turn_id"]) for e in body[key]]
            cursor = body["cursor"]
            if cursor is None:
                return seen

    async def complete() -> list[tuple[str, int]] | None:
        found = await pages("/api/history", "entries", 100)
        return found if len(found) >= 1_200 else None

    found = await wait_for(complete, within=60)
    assert found is not None
    assert len(found) == len(set(found)) == 1_200
    assert {turn_id for _, turn_id in found} == set(range(1_200))
    # /api/recent pages the same turns (the page asked for more than 500 says it gave 500).
    first = (await http.get("/api/recent", params={"tenant": tenant, "limit": 100_000})).json()
    assert first["limit"] == 500 and len(first["events"]) == 500 and first["cursor"]
    recent = await pages("/api/recent", "events", 500)
    assert sorted(recent) == sorted(found)


async def test_a_tenant_scoped_viewer_never_reads_another_tenants_history(
    console: str, client: FleetClient
) -> None:
    run = f"shared-{uuid.uuid4().hex[:8]}"
    for tenant, turn_id in (("globex", 0), ("acme", 1)):
        await _run_turn(
            client, turn(tenant, ("a", "h_lookup", {"city": "Oslo"}), run_id=run, turn_id=turn_id)
        )
    async with (
        httpx.AsyncClient(base_url=console, timeout=10, headers=bearer("root")) as root,
        httpx.AsyncClient(base_url=console, timeout=10, headers=bearer("acme-viewer")) as vera,
    ):
        both = await _until(root, 2, run=run)
        assert {e["tenant_id"] for e in both} == {"acme", "globex"}
        mine = await _entries(vera, run=run)
        assert [(e["tenant_id"], e["turn_id"]) for e in mine] == [("acme", 1)]
        for path, params in (
            ("/api/history", {"tenant": "globex"}),
            ("/api/history", {"tenant": "globex", "run": run}),
            ("/api/recent", {"tenant": "globex"}),
            (f"/api/runs/globex/{run}", {}),
        ):
            refused = await vera.get(path, params=params)
            assert refused.status_code == 403, (path, refused.text)
            assert "globex" in refused.json()["error"]
        # A cursor from an admin's page of both tenants positions a page; it widens nothing.
        root_page = (await root.get("/api/history", params={"run": run, "limit": 1})).json()
        forged = await vera.get(
            "/api/history", params={"run": run, "cursor": root_page["cursor"], "kind": "turn"}
        )
        assert {e["tenant_id"] for e in forged.json()["entries"]} <= {"acme"}
        # A filter given twice is refused, not read one way or the other.
        twice = await vera.get("/api/history", params=[("tenant", "acme"), ("tenant", "globex")])
        assert twice.status_code == 400 and "once" in twice.json()["error"]
        assert (await vera.get(f"/api/runs/acme/{run}")).json()["turns"][0]["tenant_id"] == "acme"
        assert (await vera.get("/api/history", params={"cursor": "garbage"})).status_code == 400


@dataclass
class _Record:
    """A consumed record as the consume loop hands it to the recorder."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: Sequence[tuple[str, bytes]] = ()


async def test_a_redelivered_record_rewrites_its_entry_and_a_later_result_replaces_it(
    http: httpx.AsyncClient, settings: Settings, redis: Redis
) -> None:
    recorder = HistoryRecorder(settings, redis)  # its handler alone, as its loop calls it
    tenant, ms = f"redo-{uuid.uuid4().hex[:6]}", int(time.time() * 1000)
    waiting = TurnResult(
        tenant_id=tenant, run_id="r", turn_id=0, status="interrupted",
        interruptions=[{"call_id": "c1", "tool_name": "h_transfer", "arguments": "{}"}],
    )  # fmt: skip
    done = waiting.model_copy(update={"status": "completed", "interruptions": []})
    topic = settings.topic("turn-results")
    first = _Record(topic, 0, 7, b"r", waiting.encode(), ms)
    for _ in range(3):  # delivered, and delivered again after a rebalance
        await recorder.handle(first)
    [entry] = await _entries(http, tenant=tenant)
    assert (entry["status"], entry["calls"][0]["status"]) == ("interrupted", "pending_approval")
    await recorder.handle(_Record(topic, 0, 9, b"r", done.encode(), ms + 5))
    await recorder.handle(first)  # the earlier result once more: the later one stays
    assert [(e["turn_id"], e["status"]) for e in await _entries(http, tenant=tenant)] == [
        (0, "completed")
    ]
    assert await _entries(http, tenant=tenant, status="interrupted") == []
    with pytest.raises(InvalidMessageError):  # the consume loop dead-letters it
        await recorder.handle(_Record(topic, 0, 10, b"r", b'{"tenant_id": "x"}', ms))


async def test_a_record_that_does_not_decode_is_dead_lettered_by_the_console(
    http: httpx.AsyncClient, settings: Settings, bus: KafkaBus
) -> None:
    marker = uuid.uuid4().hex.encode()
    await bus.publish_and_wait("approvals", b"r", b'{"not": "a decision", "x": "' + marker + b'"}')

    async def dead_lettered() -> list[DeadLetter]:
        letters = [
            DeadLetter.model_validate_json(raw) for raw in await records(settings, "dead-letter")
        ]
        return [d for d in letters if marker in (d.value or b"") and d.service == "console"]

    [letter] = await wait_for(dead_lettered, within=60)
    assert letter.original_topic == settings.topic("approvals")
    assert "ApprovalDecision" in letter.reason
