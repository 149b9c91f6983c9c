"""The console's HTTP API against the real Kafka, Redis and fleet: the live feed, the call
page, human tasks and approvals decided as the CLI decides them, circuits and versions, and
a console for one tenant that never shows or touches another's."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from kernel.rules.auth import DecisionAuth
from kernel.settings import Settings
from kernel.stores.keys import Keys
from kernel.stores.registry import pinned_version
from kernel.stores.tasks import StoredTask, TaskStore
from schemas import ApprovalDecision, ModelResponseEvent, TaskResolution
from tests.conftest import wait_for
from tests.integration.console_support import (
    DECIDE,
    TRACE_TEMPLATE,
    console_fleet,
    records,
    served_console,
    turn,
)
from tests.integration.console_tools import runs_key
from toolfleet.app.console import ConsoleOptions
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    with console_fleet(settings) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


@pytest.fixture(scope="module")
def console_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"trace_url_template": TRACE_TEMPLATE})


@pytest.fixture(scope="module")
async def console(console_settings: Settings, client: FleetClient) -> AsyncIterator[str]:
    """Every tenant; the operator comes from the proxy's X-Forwarded-User header."""
    async with served_console(console_settings) as url:
        yield url


@pytest.fixture(scope="module")
async def acme_console(console_settings: Settings, client: FleetClient) -> AsyncIterator[str]:
    """Tenant acme only, with a fixed operator."""
    options = ConsoleOptions(tenant="acme", operator="acme-ops")
    async with served_console(console_settings, options) as url:
        yield url


@pytest.fixture
async def http(console: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=console, timeout=10) as session:
        yield session


@pytest.fixture
async def acme(acme_console: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=acme_console, timeout=10) as session:
        yield session


def _as(operator: str) -> dict[str, str]:
    return {**DECIDE, "X-Forwarded-User": operator}


async def _events(
    http: httpx.AsyncClient, query: str, until: Any, within: float = 20.0
) -> list[tuple[str, dict[str, Any]]]:
    """Server-sent events of ``/events?query`` until one satisfies ``until(kind, data)``."""
    seen: list[tuple[str, dict[str, Any]]] = []
    async with asyncio.timeout(within), http.stream("GET", f"/events?{query}") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        kind = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
                seen.append((kind, data))
                if until(kind, data):
                    return seen
    raise AssertionError(f"the stream ended: {seen}")


async def _task_for(redis: Redis, keys: Keys, call_id: str) -> StoredTask:
    async def find() -> StoredTask | None:
        return next(
            (t for t in await TaskStore(redis, keys).all() if t.task.call_id == call_id), None
        )

    return await wait_for(find, within=60)


async def _submitted(client: FleetClient, event: ModelResponseEvent) -> str:
    await client.submit(event)
    return event.function_calls[0].call_id


async def test_the_console_serves_its_pages_its_script_and_a_health_probe(
    http: httpx.AsyncClient,
) -> None:
    health = await http.get("/healthz")
    assert health.status_code == 200 and health.json()["feed"] == "live"
    for path in ("/", "/tasks", "/circuits", "/calls/acme/call-1?run=r"):
        page = await http.get(path)
        assert page.status_code == 200 and '<script src="/static/console.js"' in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
    script = await http.get("/static/console.js")
    assert script.status_code == 200 and "EventSource" in script.text
    config = (await http.get("/api/config", headers={"X-Forwarded-User": "alice"})).json()
    assert (config["operator"], config["tenant"]) == ("alice", None)
    assert (await http.get("/api/config")).json()["operator"] is None


async def test_the_live_feed_streams_turn_results_and_outcomes_filtered_on_the_server(
    http: httpx.AsyncClient, client: FleetClient
) -> None:
    other = turn("globex", ("a", "lookup", {"city": "Oslo"}))
    mine = turn("acme", ("a", "lookup", {"city": "Lisbon"}))

    async def submit() -> None:
        for event in (other, mine):
            await client.submit(event)
            await client.result(event.run_id, 0)

    submitting = asyncio.create_task(submit())
    seen = await _events(
        http,
        "tenant=acme&outcomes=0",
        lambda kind, data: kind == "turn" and data["run_id"] == mine.run_id,
    )
    await submitting
    turns = [data for kind, data in seen if kind == "turn"]
    assert {t["tenant_id"] for t in turns} == {"acme"}
    assert seen[0][0] == "status" and seen[0][1]["state"] == "live"
    [shown] = [t for t in turns if t["run_id"] == mine.run_id]
    assert shown["status"] == "completed"
    assert shown["calls"] == [
        {
            "call_id": f"{mine.run_id}-a",
            "tool_name": "lookup",
            "status": "succeeded",
            "effect": "applied",
            "attempts": 1,
        }
    ]
    assert "Lisbon" not in json.dumps(seen)  # neither arguments nor outputs are streamed

    # A page opened now gets the recent events first: the other tenant's turn, and the
    # outcome of one call, filtered by run and tool.
    recent = (await http.get("/api/recent", params={"tenant": "globex"})).json()["events"]
    assert other.run_id in {e["run_id"] for e in recent}
    seen = await _events(
        http, f"run={mine.run_id}&tool=lookup", lambda kind, _data: kind == "outcome"
    )
    outcomes = [data for kind, data in seen if kind == "outcome"]
    assert outcomes[0]["call_id"] == f"{mine.run_id}-a" and outcomes[0]["effect"] == "applied"
    assert all(data["run_id"] == mine.run_id for kind, data in seen if kind != "status")


async def test_a_task_resolution_is_signed_for_the_operator_and_the_reconciler_carries_it_out(
    *,
    http: httpx.AsyncClient,
    client: FleetClient,
    fleet: LocalFleet,
    redis: Redis,
    keys: Keys,
    settings: Settings,
) -> None:
    event = turn("acme", ("n", "note", {"text": "n1", "mode": "apply_then_drop"}))
    call_id = await _submitted(client, event)
    task = await _task_for(redis, keys, call_id)
    listed = (await http.get("/api/tasks")).json()["tasks"]
    [shown] = [t for t in listed if t["task_id"] == task.task.task_id]
    assert (shown["kind"], shown["status"], shown["call_id"]) == ("unknown_effect", "open", call_id)

    answer = {"resolution": "applied", "output": "noted n1", "note": "seen upstream"}
    sent = await http.post(
        f"/api/tasks/{task.task.task_id}/resolve", json=answer, headers=_as("alice")
    )
    assert sent.status_code == 202, sent.text
    assert sent.json()["sent"]["decided_by"] == "alice"

    result = await result_of(fleet, client, event.run_id)
    assert (result.status, result.outputs[0].output) == ("completed", "noted n1")
    published = [
        TaskResolution.decode(raw)
        for raw in await records(settings, "task-resolutions")
        if task.task.task_id.encode() in raw
    ]
    assert [r.decided_by for r in published] == ["alice"]
    DecisionAuth.of(settings).verify(published[0])  # signed with the tenant's key
    everything = (await http.get("/api/tasks", params={"all": "1"})).json()["tasks"]
    [done] = [t for t in everything if t["task_id"] == task.task.task_id]
    assert done["status"] == "resolved" and done["resolution"]["decided_by"] == "alice"
    assert "signature" not in done["resolution"]
    page = (await http.get(f"/api/calls/acme/{call_id}", params={"run": event.run_id})).json()
    [verdict] = [e for e in page["audit"] if e["event"] == "human_resolution"]
    assert (verdict["by"], verdict["resolution"], verdict["note"]) == (
        "alice", "applied", "seen upstream",
    )  # fmt: skip


async def test_decisions_without_an_operator_or_from_another_page_are_refused_unsent(
    http: httpx.AsyncClient, settings: Settings
) -> None:
    before = (
        len(await records(settings, "task-resolutions")),
        len(await records(settings, "approvals")),
    )
    answer = {"resolution": "not_applied"}
    nobody = await http.post("/api/tasks/task-x/resolve", json=answer, headers=DECIDE)
    assert nobody.status_code == 403
    assert "X-Forwarded-User" in nobody.json()["error"]
    assert "--operator" in nobody.json()["error"]
    no_header = await http.post(
        "/api/tasks/task-x/resolve", json=answer, headers={"X-Forwarded-User": "mallory"}
    )
    assert no_header.status_code == 403 and "X-Toolfleet-Console" in no_header.json()["error"]
    form = await http.post(
        "/api/approvals/decide", data={"approve": "true"}, headers=_as("mallory")
    )
    assert form.status_code == 403 and "application/json" in form.json()["error"]
    assert (await http.get("/api/tasks/task-x/resolve")).status_code == 405
    missing = await http.post("/api/tasks/task-x/resolve", json=answer, headers=_as("ops"))
    assert missing.status_code == 404 and "no task task-x" in missing.json()["error"]
    bad = await http.post("/api/tasks/task-x/resolve", json={"resolution": "?"}, headers=_as("o"))
    assert bad.status_code == 400
    after = (
        len(await records(settings, "task-resolutions")),
        len(await records(settings, "approvals")),
    )
    assert after == before  # nothing was published


async def test_a_pending_approval_is_listed_and_decided_for_the_operator_like_the_cli_decides(
    *,
    http: httpx.AsyncClient,
    client: FleetClient,
    fleet: LocalFleet,
    redis: Redis,
    keys: Keys,
    settings: Settings,
) -> None:
    approve = turn("acme", ("t", "transfer", {"amount": 41, "to": "secret-iban-1"}))
    reject = turn("acme", ("t", "transfer", {"amount": 99, "to": "secret-iban-2"}))
    for event in (approve, reject):
        first = await client.run_turn(event)
        assert first.status == "interrupted"
    a, r = approve.function_calls[0], reject.function_calls[0]

    listing = await http.get("/api/approvals")
    assert "secret-iban" not in listing.text  # the arguments' digest, never their values
    pending = {p["call_id"]: p for p in listing.json()["approvals"]}
    assert (
        pending[a.call_id]["arguments_digest"] == hashlib.sha256(a.arguments.encode()).hexdigest()
    )
    assert pending[a.call_id]["decision"] is None and pending[a.call_id]["tool_name"] == "transfer"
    assert a.call_id in fleet.cli("approvals", "list", "--tenant", "acme").stdout

    body = {"tenant_id": "acme", "run_id": approve.run_id, "call_id": a.call_id, "approve": True}
    sent = await http.post("/api/approvals/decide", json=body, headers=_as("bob"))
    assert sent.status_code == 202, sent.text
    # The other one is rejected from the CLI: the same operation, the same signature.
    fleet.cli(
        "approvals", "reject", r.call_id, "--tenant", "acme", "--run", reject.run_id,
        "--by", "carol", "--message", "Not today.",
    )  # fmt: skip
    published = [ApprovalDecision.decode(raw) for raw in await records(settings, "approvals")]
    mine = {d.call_id: d for d in published if d.call_id in (a.call_id, r.call_id)}
    assert (mine[a.call_id].decided_by, mine[a.call_id].approve) == ("bob", True)
    assert (mine[r.call_id].decided_by, mine[r.call_id].approve) == ("carol", False)
    for decision in mine.values():
        DecisionAuth.of(settings).verify(decision)

    async def recorded() -> bool:  # the planner stored both decisions
        return all(
            await asyncio.gather(
                redis.hexists(keys.approvals("acme", approve.run_id), f"call:{a.call_id}"),
                redis.hexists(keys.approvals("acme", reject.run_id), f"call:{r.call_id}"),
            )
        )

    await wait_for(recorded)
    decided = {p["call_id"]: p for p in (await http.get("/api/approvals")).json()["approvals"]}
    assert decided[a.call_id]["decision"]["by"] == "bob"
    assert decided[a.call_id]["decision"]["approve"] is True

    # The agent runtime resumes the turns: the approved call runs, the rejected one never.
    done = await client.run_turn(approve.model_copy(update={"resume": True}))
    assert (done.status, done.outputs[0].output) == ("completed", "transferred 41")
    refused = await client.run_turn(reject.model_copy(update={"resume": True}))
    assert refused.outputs[0].output == "Not today."
    assert int(await redis.get(runs_key(a.call_id)) or 0) == 1
    assert int(await redis.get(runs_key(r.call_id)) or 0) == 0
    after = {p["call_id"] for p in (await http.get("/api/approvals")).json()["approvals"]}
    assert not after & {a.call_id, r.call_id}
    again = await http.post("/api/approvals/decide", json=body, headers=_as("bob"))
    assert again.status_code == 409 and "already" in again.json()["error"]


async def test_the_call_page_has_the_ledger_entry_audit_chain_upstream_ref_and_trace_link(
    http: httpx.AsyncClient, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    event = turn("acme", ("b", "book", {"seat": "seat-secret-9"}))
    result = await client.run_turn(event)
    assert result.status == "completed"
    call_id = event.function_calls[0].call_id
    ledger_key = keys.call("acme", event.run_id, call_id)
    trace_id = (await redis.hget(ledger_key, "trace_id") or b"").decode()
    if not trace_id:  # until the planner records traces: as it would
        trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
        await redis.hset(ledger_key, "trace_id", trace_id)

    page = await http.get(f"/api/calls/acme/{call_id}", params={"run": event.run_id})
    assert page.status_code == 200
    assert "seat-secret-9" not in page.text  # the arguments' values are never shown
    view = page.json()
    entry = view["entry"]
    assert "arguments" not in entry
    digest = hashlib.sha256(event.function_calls[0].arguments.encode()).hexdigest()
    assert entry["arguments_digest"] == digest
    assert (entry["tool_name"], entry["state"], entry["attempts"]) == ("book", "committed", 1)
    assert view["upstream_ref"] == "B-77"
    assert view["outcome"]["effect"] == "applied" and view["outcome"]["output"] == "booked"
    events = [e["event"] for e in view["audit"]]
    assert events[0] == "planned" and "finished" in events
    assert view["trace"] == {"id": trace_id, "url": TRACE_TEMPLATE.format(trace_id=trace_id)}

    missing = await http.get("/api/calls/acme/no-such-call", params={"run": event.run_id})
    assert missing.status_code == 404


async def test_circuits_and_versions_are_listed_resumed_and_rolled_back(
    http: httpx.AsyncClient,
    client: FleetClient,
    redis: Redis,
    keys: Keys,
) -> None:
    failing = turn(
        "acme", *((f"q{i}", "quote", {"fail": True}) for i in range(3)),
        config={"max_concurrency": 1},
    )  # fmt: skip
    result = await client.run_turn(failing)
    assert [c.status for c in result.calls] == ["failed"] * 3
    view = (await http.get("/api/circuits")).json()
    assert [c["ref"] for c in view["circuits"]] == ["quote@2"] and view["actions"] is True
    [quote] = [t for t in view["tools"] if t["name"] == "quote"]
    assert quote["new_calls"]["version"] == "1" and quote["new_calls"]["route"] == "rolled_back"
    assert [v["version"] for v in quote["versions"]] == ["2", "1"]
    assert quote["versions"][0]["circuit"]["failed"] == 3

    pinned = await http.post("/api/tools/quote/rollback", json={"version": "1"}, headers=_as("o"))
    assert pinned.status_code == 200 and "new calls go to quote@1" in pinned.json()["message"]
    assert await pinned_version(redis, keys, "quote") == "1"
    not_live = await http.post("/api/tools/quote/rollback", json={"version": "9"}, headers=_as("o"))
    assert not_live.status_code == 400 and "quote@9 is not live" in not_live.json()["error"]
    assert (await http.post("/api/tools/quote/unpin", json={}, headers=_as("o"))).json() == {
        "name": "quote",
        "unpinned": True,
    }
    assert await pinned_version(redis, keys, "quote") is None

    resumed = await http.post("/api/circuits/quote@2/resume", json={}, headers=_as("o"))
    assert resumed.json() == {"ref": "quote@2", "closed": True}
    assert await redis.get(keys.circuit("state", "quote@2")) is None
    assert (await http.get("/api/circuits")).json()["circuits"] == []


async def test_a_console_for_one_tenant_never_shows_or_acts_on_another_tenants_data(
    *,
    acme: httpx.AsyncClient,
    http: httpx.AsyncClient,
    client: FleetClient,
    fleet: LocalFleet,
    redis: Redis,
    keys: Keys,
) -> None:
    # Two tenants on one run id: one partition, so the other tenant's result comes first.
    run = f"shared-{time.monotonic_ns()}"
    await client.run_turn(turn("globex", ("g", "lookup", {"city": "Oslo"}), run_id=run))
    await client.run_turn(turn("acme", ("a", "lookup", {"city": "Porto"}), run_id=run, turn_id=1))
    other = turn("globex", ("g", "note", {"text": "g1", "mode": "apply_then_drop"}))
    other_call = await _submitted(client, other)
    other_task = await _task_for(redis, keys, other_call)

    async def shown() -> list[dict[str, Any]]:
        events = (await acme.get("/api/recent", params={"run": run})).json()["events"]
        return [e for e in events if e["kind"] == "turn"]

    assert {e["tenant_id"] for e in await wait_for(shown)} == {"acme"}
    assert (await acme.get("/api/config")).json()["tenant"] == "acme"
    assert (await acme.get("/api/recent", params={"tenant": "globex"})).status_code == 403
    assert (await acme.get("/events", params={"tenant": "globex"})).status_code == 403
    call_page = await acme.get(f"/api/calls/globex/{other_call}", params={"run": other.run_id})
    assert call_page.status_code == 403
    tasks = (await acme.get("/api/tasks", params={"all": "1"})).json()["tasks"]
    assert {t["tenant_id"] for t in tasks} <= {"acme"}
    assert all(t["kind"] != "circuit_open" for t in tasks)  # they list every tenant's calls

    answer = {"resolution": "applied", "output": "x"}
    refused = await acme.post(
        f"/api/tasks/{other_task.task.task_id}/resolve", json=answer, headers=DECIDE
    )
    assert refused.status_code == 403 and "another tenant" in refused.json()["error"]
    decision = {
        "tenant_id": "globex",
        "run_id": other.run_id,
        "call_id": other_call,
        "approve": True,
    }
    assert (
        await acme.post("/api/approvals/decide", json=decision, headers=DECIDE)
    ).status_code == 403
    fleet_wide = [
        await acme.post("/api/circuits/quote@2/resume", json={}, headers=DECIDE),
        await acme.post("/api/tools/quote/rollback", json={"version": "1"}, headers=DECIDE),
        await acme.post("/api/tools/quote/unpin", json={}, headers=DECIDE),
    ]
    assert [r.status_code for r in fleet_wide] == [403, 403, 403]
    assert (await acme.get("/api/circuits")).json()["actions"] is False
    stored = await TaskStore(redis, keys).get(other_task.task.task_id)
    assert stored is not None and stored.status == "open"

    # The unscoped console settles it (and the fixed operator is not needed there).
    sent = await http.post(
        f"/api/tasks/{other_task.task.task_id}/resolve", json=answer, headers=_as("dora")
    )
    assert sent.status_code == 202
    assert (await result_of(fleet, client, other.run_id)).status == "completed"
