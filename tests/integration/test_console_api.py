"""The console's HTTP API against the real Kafka, Redis and fleet: nobody in without
credentials, the live feed, the call page, human tasks and approvals decided as the CLI
decides them and signed for the identity signed in, circuits and versions for admins only,
an operator of one tenant who never sees or touches another's, a trusted proxy, and a
browser session's CSRF token."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from redis.asyncio import Redis

from kernel.rules.auth import DecisionAuth
from kernel.settings import Settings
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger
from kernel.stores.registry import pinned_version
from kernel.stores.tasks import StoredTask, TaskStore
from schemas import ApprovalDecision, ModelResponseEvent, TaskResolution
from tests.conftest import wait_for
from tests.integration.console_support import (
    TRACE_TEMPLATE,
    bearer,
    console_fleet,
    fresh_circuits,
    records,
    served_console,
    tokens_setting,
    turn,
)
from tests.integration.console_tools import runs_key
from toolfleet.app.console import CSRF_HEADER, ConsoleOptions
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]


@pytest.fixture(autouse=True)
async def _fresh_circuits(redis: Redis, settings: Settings) -> None:
    await fresh_circuits(redis, settings)


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
    """API tokens (``console_support.TOKENS``) are the only way in."""
    update = {"trace_url_template": TRACE_TEMPLATE, "console_tokens": SecretStr(tokens_setting())}
    return settings.model_copy(update=update)


@pytest.fixture(scope="module")
async def console(console_settings: Settings, client: FleetClient) -> AsyncIterator[str]:
    """Every tenant; who may see what comes from the caller's token."""
    async with served_console(console_settings) as url:
        yield url


@pytest.fixture(scope="module")
async def acme_console(console_settings: Settings, client: FleetClient) -> AsyncIterator[str]:
    """Tenant acme only, whoever signs in."""
    async with served_console(console_settings, ConsoleOptions(tenant="acme")) as url:
        yield url


@pytest.fixture
async def http(console: str) -> AsyncIterator[httpx.AsyncClient]:
    """The console as alice, an operator of every tenant (by her API token)."""
    async with httpx.AsyncClient(base_url=console, timeout=10, headers=bearer("alice")) as session:
        yield session


@pytest.fixture
async def anonymous(console: str) -> AsyncIterator[httpx.AsyncClient]:
    """The console as nobody."""
    async with httpx.AsyncClient(base_url=console, timeout=10) as session:
        yield session


@pytest.fixture
async def acme(acme_console: str) -> AsyncIterator[httpx.AsyncClient]:
    """The console for acme only, as root (an admin of every tenant)."""
    async with httpx.AsyncClient(
        base_url=acme_console, timeout=10, headers=bearer("root")
    ) as session:
        yield session


def _as(name: str) -> dict[str, str]:
    """Headers of a request by the test token ``name`` (bearer tokens need no CSRF token)."""
    return bearer(name)


async def _published(settings: Settings) -> tuple[int, int]:
    return (
        len(await records(settings, "task-resolutions")),
        len(await records(settings, "approvals")),
    )


async def _events(
    http: httpx.AsyncClient,
    query: str,
    until: Any,
    within: float = 20.0,
    headers: dict[str, str] | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """Server-sent events of ``/events?query`` until one satisfies ``until(kind, data)``."""
    seen: list[tuple[str, dict[str, Any]]] = []
    stream = http.stream("GET", f"/events?{query}", headers=headers)
    async with asyncio.timeout(within), stream as response:
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
    config = (await http.get("/api/config")).json()
    assert (config["operator"], config["role"], config["tenant"]) == (
        "token:alice",
        "operator",
        None,
    )
    assert (config["tenants"], config["can_decide"], config["fleet_wide"]) == (None, True, False)
    assert config["csrf"] is None  # a bearer token is no browser session: no CSRF token needed
    viewer = (await http.get("/api/config", headers=_as("vera"))).json()
    assert (viewer["operator"], viewer["role"], viewer["can_decide"]) == (
        "token:vera",
        "viewer",
        False,
    )
    root = (await http.get("/api/config", headers=_as("root"))).json()
    assert (root["role"], root["fleet_wide"]) == ("admin", True)


async def test_nobody_reads_or_decides_without_credentials_and_a_forwarded_user_counts_for_nothing(
    anonymous: httpx.AsyncClient, settings: Settings
) -> None:
    before = await _published(settings)
    # The reproduction: a decision naming boss@corp in a header anyone can send.
    forged = await anonymous.post(
        "/api/approvals/decide",
        json={"tenant_id": "acme", "run_id": "r", "call_id": "c", "approve": True},
        headers={"X-Toolfleet-Console": "1", "X-Forwarded-User": "boss@corp"},
    )
    assert forged.status_code == 401, forged.text
    assert "not signed in" in forged.json()["error"]
    assert forged.headers["www-authenticate"].startswith("Bearer")
    reads = [
        "/api/config", "/api/recent", "/api/tasks", "/api/approvals", "/api/circuits",
        "/api/calls/acme/call-1?run=r", "/events",
    ]  # fmt: skip
    for path in reads:
        for headers in ({}, {"X-Forwarded-User": "boss@corp"}):
            refused = await anonymous.get(path, headers=headers)
            assert refused.status_code == 401, (path, refused.text)
            assert "Authorization: Bearer" in refused.json()["error"]
    for path in ("/", "/tasks", "/circuits", "/calls/acme/call-1?run=r"):
        page = await anonymous.get(path)
        assert page.status_code == 401 and "Not signed in" in page.text
        assert "/static/console.js" not in page.text
    posts = [
        "/api/tasks/t/resolve", "/api/circuits/quote@2/resume", "/api/tools/quote/rollback",
        "/api/tools/quote/unpin",
    ]  # fmt: skip
    for path in posts:
        assert (await anonymous.post(path, json={})).status_code == 401
    wrong = await anonymous.get("/api/tasks", headers={"Authorization": "Bearer secret-nobody"})
    assert wrong.status_code == 401 and "TOOLFLEET_CONSOLE_TOKENS" in wrong.json()["error"]
    basic = await anonymous.get("/api/tasks", headers={"Authorization": "Basic YTpi"})
    assert basic.status_code == 401 and "Bearer" in basic.json()["error"]
    # Open: the health probe, and the page's script and style (no data in them).
    assert (await anonymous.get("/healthz")).status_code == 200
    assert (await anonymous.get("/static/console.css")).status_code == 200
    assert await _published(settings) == before  # nothing was signed or sent


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
    sent = await http.post(f"/api/tasks/{task.task.task_id}/resolve", json=answer)
    assert sent.status_code == 202, sent.text
    assert sent.json()["sent"]["decided_by"] == "token:alice"

    result = await result_of(fleet, client, event.run_id)
    assert (result.status, result.outputs[0].output) == ("completed", "noted n1")
    published = [
        TaskResolution.decode(raw)
        for raw in await records(settings, "task-resolutions")
        if task.task.task_id.encode() in raw
    ]
    assert [r.decided_by for r in published] == ["token:alice"]
    DecisionAuth.of(settings).verify(published[0])  # signed with the tenant's key
    everything = (await http.get("/api/tasks", params={"all": "1"})).json()["tasks"]
    [done] = [t for t in everything if t["task_id"] == task.task.task_id]
    assert done["status"] == "resolved" and done["resolution"]["decided_by"] == "token:alice"
    assert "signature" not in done["resolution"]
    page = (await http.get(f"/api/calls/acme/{call_id}", params={"run": event.run_id})).json()
    [verdict] = [e for e in page["audit"] if e["event"] == "human_resolution"]
    assert (verdict["by"], verdict["resolution"], verdict["note"]) == (
        "token:alice", "applied", "seen upstream",
    )  # fmt: skip


async def test_a_viewer_reads_but_every_decision_of_hers_is_refused_naming_the_role(
    http: httpx.AsyncClient, settings: Settings
) -> None:
    before = await _published(settings)
    viewer = _as("vera")
    for path in ("/api/tasks", "/api/approvals", "/api/circuits", "/api/recent"):
        assert (await http.get(path, headers=viewer)).status_code == 200, path
    answer = {"resolution": "not_applied"}
    refused = [
        await http.post("/api/tasks/task-x/resolve", json=answer, headers=viewer),
        await http.post(
            "/api/approvals/decide",
            json={"tenant_id": "acme", "run_id": "r", "call_id": "c", "approve": True},
            headers=viewer,
        ),
    ]
    for response in refused:
        assert response.status_code == 403
        assert "needs the operator role; token:vera has the viewer role" in response.json()["error"]
    fleet_wide = await http.post("/api/circuits/quote@2/resume", json={}, headers=viewer)
    assert fleet_wide.status_code == 403 and "needs the admin role" in fleet_wide.json()["error"]
    assert await _published(settings) == before


async def test_decisions_that_are_not_json_or_name_nothing_are_refused_unsent(
    http: httpx.AsyncClient, settings: Settings
) -> None:
    before = await _published(settings)
    answer = {"resolution": "not_applied"}
    form = await http.post("/api/approvals/decide", data={"approve": "true"})
    assert form.status_code == 403 and "application/json" in form.json()["error"]
    assert (await http.get("/api/tasks/task-x/resolve")).status_code == 405
    missing = await http.post("/api/tasks/task-x/resolve", json=answer)
    assert missing.status_code == 404 and "no task task-x" in missing.json()["error"]
    bad = await http.post("/api/tasks/task-x/resolve", json={"resolution": "?"})
    assert bad.status_code == 400
    assert await _published(settings) == before  # nothing was published


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
    # The session's approvals topic is shared: other modules publish there too (the hostile
    # inputs' fuzz among them), so only the records naming this test's runs are decoded.
    ours = (approve.run_id.encode(), reject.run_id.encode())
    published = [
        ApprovalDecision.decode(raw)
        for raw in await records(settings, "approvals")
        if any(run in raw for run in ours)
    ]
    mine = {d.call_id: d for d in published if d.call_id in (a.call_id, r.call_id)}
    assert (mine[a.call_id].decided_by, mine[a.call_id].approve) == ("token:bob", True)
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
    assert decided[a.call_id]["decision"]["by"] == "token:bob"
    assert decided[a.call_id]["decision"]["approve"] is True
    # The planner's audit chain names who decided: the identity signed in, not a header.
    page = (await http.get(f"/api/calls/acme/{a.call_id}", params={"run": approve.run_id})).json()
    [verdict] = [e for e in page["audit"] if e["event"] == "approval_decision"]
    assert (verdict["by"], verdict["approve"]) == ("token:bob", True)

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
    view = (await http.get("/api/circuits", headers=_as("root"))).json()
    assert [c["ref"] for c in view["circuits"]] == ["quote@2"] and view["actions"] is True
    # A circuit or a pin touches every tenant: operators see them, only admins act.
    assert (await http.get("/api/circuits")).json()["actions"] is False
    operator = await http.post("/api/tools/quote/rollback", json={"version": "1"})
    assert operator.status_code == 403
    assert "needs the admin role; token:alice has the operator role" in operator.json()["error"]
    assert await pinned_version(redis, keys, "quote") is None
    [quote] = [t for t in view["tools"] if t["name"] == "quote"]
    assert quote["new_calls"]["version"] == "1" and quote["new_calls"]["route"] == "rolled_back"
    assert [v["version"] for v in quote["versions"]] == ["2", "1"]
    assert quote["versions"][0]["circuit"]["failed"] == 3

    root = _as("root")
    pinned = await http.post("/api/tools/quote/rollback", json={"version": "1"}, headers=root)
    assert pinned.status_code == 200 and "new calls go to quote@1" in pinned.json()["message"]
    assert await pinned_version(redis, keys, "quote") == "1"
    not_live = await http.post("/api/tools/quote/rollback", json={"version": "9"}, headers=root)
    assert not_live.status_code == 400 and "quote@9 is not live" in not_live.json()["error"]
    assert (await http.post("/api/tools/quote/unpin", json={}, headers=root)).json() == {
        "name": "quote",
        "unpinned": True,
    }
    assert await pinned_version(redis, keys, "quote") is None

    resumed = await http.post("/api/circuits/quote@2/resume", json={}, headers=root)
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
    config = (await acme.get("/api/config")).json()
    assert (config["tenant"], config["tenants"], config["fleet_wide"]) == ("acme", ["acme"], False)
    assert (await acme.get("/api/recent", params={"tenant": "globex"})).status_code == 403
    assert (await acme.get("/events", params={"tenant": "globex"})).status_code == 403
    call_page = await acme.get(f"/api/calls/globex/{other_call}", params={"run": other.run_id})
    assert call_page.status_code == 403
    tasks = (await acme.get("/api/tasks", params={"all": "1"})).json()["tasks"]
    assert {t["tenant_id"] for t in tasks} <= {"acme"}
    assert all(t["kind"] != "circuit_open" for t in tasks)  # they list every tenant's calls

    answer = {"resolution": "applied", "output": "x"}
    refused = await acme.post(f"/api/tasks/{other_task.task.task_id}/resolve", json=answer)
    assert refused.status_code == 403 and "another tenant" in refused.json()["error"]
    decision = {
        "tenant_id": "globex",
        "run_id": other.run_id,
        "call_id": other_call,
        "approve": True,
    }
    assert (await acme.post("/api/approvals/decide", json=decision)).status_code == 403
    fleet_wide = [
        await acme.post("/api/circuits/quote@2/resume", json={}),
        await acme.post("/api/tools/quote/rollback", json={"version": "1"}),
        await acme.post("/api/tools/quote/unpin", json={}),
    ]
    assert [r.status_code for r in fleet_wide] == [403, 403, 403]
    assert (await acme.get("/api/circuits")).json()["actions"] is False
    stored = await TaskStore(redis, keys).get(other_task.task.task_id)
    assert stored is not None and stored.status == "open"

    # The console for every tenant settles it.
    sent = await http.post(f"/api/tasks/{other_task.task.task_id}/resolve", json=answer)
    assert sent.status_code == 202
    assert (await result_of(fleet, client, other.run_id)).status == "completed"


async def test_an_operator_of_one_tenant_never_reads_or_decides_anything_of_another(
    *,
    http: httpx.AsyncClient,
    client: FleetClient,
    fleet: LocalFleet,
    redis: Redis,
    keys: Keys,
    settings: Settings,
) -> None:
    ops = _as("acme-ops")  # an operator of tenant acme only, on the console for every tenant
    run = f"shared-{time.monotonic_ns()}"
    theirs = turn("globex", ("g", "lookup", {"city": "Oslo"}), run_id=run)
    ours = turn("acme", ("a", "lookup", {"city": "Porto"}), run_id=run, turn_id=1)
    for event in (theirs, ours):
        await client.run_turn(event)
    waiting = turn("globex", ("t", "transfer", {"amount": 7, "to": "x"}))
    assert (await client.run_turn(waiting)).status == "interrupted"
    waiting_call = waiting.function_calls[0].call_id
    task_run = turn("globex", ("g", "memo", {"text": "g2", "mode": "apply_then_drop"}))
    task_call = await _submitted(client, task_run)
    task = await _task_for(redis, keys, task_call)
    before = await _published(settings)

    async def shown() -> list[dict[str, Any]]:
        events = (await http.get("/api/recent", params={"run": run}, headers=ops)).json()
        return [e for e in events["events"] if e["kind"] == "turn"]

    assert {e["tenant_id"] for e in await wait_for(shown)} == {"acme"}
    # The live stream carries acme's turns only, the other tenant's never.
    seen = await _events(
        http,
        f"run={run}",
        lambda kind, data: kind == "turn" and data["tenant_id"] == "acme",
        headers=ops,
    )
    assert {d["tenant_id"] for k, d in seen if k == "turn"} == {"acme"}
    for path, params in (
        ("/api/recent", {"tenant": "globex"}),
        ("/events", {"tenant": "globex"}),
        (f"/api/calls/globex/{waiting_call}", {"run": waiting.run_id}),
    ):
        refused = await http.get(path, params=params, headers=ops)
        assert refused.status_code == 403, path
        assert "tenant globex is not in the scope of token:acme-ops" in refused.json()["error"]
    tasks = (await http.get("/api/tasks", params={"all": "1"}, headers=ops)).json()["tasks"]
    assert {t["tenant_id"] for t in tasks} <= {"acme"}
    approvals = (await http.get("/api/approvals", headers=ops)).json()["approvals"]
    assert waiting_call not in {a["call_id"] for a in approvals}
    assert waiting_call in {
        a["call_id"] for a in (await http.get("/api/approvals")).json()["approvals"]
    }

    decision = {
        "tenant_id": "globex",
        "run_id": waiting.run_id,
        "call_id": waiting_call,
        "approve": True,
    }
    refused = await http.post("/api/approvals/decide", json=decision, headers=ops)
    assert refused.status_code == 403 and "tenant globex" in refused.json()["error"]
    answer = {"resolution": "not_applied"}
    refused = await http.post(f"/api/tasks/{task.task.task_id}/resolve", json=answer, headers=ops)
    assert refused.status_code == 403 and "another tenant" in refused.json()["error"]
    # An admin of acme only is no admin of the fleet: circuits and pins touch every tenant.
    fleet_wide = await http.post("/api/tools/quote/unpin", json={}, headers=_as("acme-admin"))
    assert fleet_wide.status_code == 403 and "touches every tenant" in fleet_wide.json()["error"]
    assert await _published(settings) == before  # nothing was signed or sent

    # An operator of every tenant settles both.
    assert (await http.post("/api/approvals/decide", json=decision)).status_code == 202
    sent = await http.post(f"/api/tasks/{task.task.task_id}/resolve", json=answer)
    assert sent.status_code == 202


PROXY_SECRET = "proxy-secret-of-this-test-0123456789"


@pytest.fixture(scope="module")
async def proxied_console(settings: Settings, client: FleetClient) -> AsyncIterator[str]:
    """A console behind a trusted proxy: identity headers count only with the proxy secret."""
    update = {"console_proxy_secret": SecretStr(PROXY_SECRET)}
    async with served_console(settings.model_copy(update=update)) as url:
        yield url


async def test_a_proxy_names_the_person_only_with_the_shared_secret_and_its_decisions_need_csrf(
    proxied_console: str, client: FleetClient, redis: Redis, keys: Keys, settings: Settings
) -> None:
    person = {
        "X-Forwarded-User": "bob@corp",
        "X-Forwarded-Roles": "viewer, operator",
        "X-Forwarded-Tenants": "acme",
    }
    trusted = {**person, "X-Toolfleet-Proxy-Secret": PROXY_SECRET}
    event = turn("acme", ("t", "transfer", {"amount": 3, "to": "x"}))
    assert (await client.run_turn(event)).status == "interrupted"
    call_id = event.function_calls[0].call_id
    body = {"tenant_id": "acme", "run_id": event.run_id, "call_id": call_id, "approve": False}
    async with httpx.AsyncClient(base_url=proxied_console, timeout=10) as proxy:
        before = await _published(settings)
        # Headers from a client that does not know the secret are ignored: nobody.
        ignored = await proxy.get("/api/config", headers=person)
        assert ignored.status_code == 401
        wrong = await proxy.get(
            "/api/config", headers={**person, "X-Toolfleet-Proxy-Secret": "guess-guess-guess"}
        )
        assert wrong.status_code == 401 and "proxy secret" in wrong.json()["error"]
        no_role = await proxy.get("/api/config", headers={**trusted, "X-Forwarded-Roles": "reader"})
        assert no_role.status_code == 403 and "no console role" in no_role.json()["error"]
        assert (
            await proxy.post("/api/approvals/decide", json=body, headers=person)
        ).status_code == 401

        config = (await proxy.get("/api/config", headers=trusted)).json()
        assert (config["operator"], config["role"], config["tenants"]) == (
            "proxy:bob@corp", "operator", ["acme"],
        )  # fmt: skip
        # A browser behind the proxy sends the proxy's cookie with any request: decisions
        # carry the CSRF token the page read from /api/config.
        no_csrf = await proxy.post("/api/approvals/decide", json=body, headers=trusted)
        assert no_csrf.status_code == 403 and CSRF_HEADER in no_csrf.json()["error"]
        assert await _published(settings) == before
        sent = await proxy.post(
            "/api/approvals/decide", json=body, headers={**trusted, CSRF_HEADER: config["csrf"]}
        )
        assert sent.status_code == 202, sent.text
        assert sent.json()["sent"]["decided_by"] == "proxy:bob@corp"

        async def recorded() -> dict[str, Any] | None:
            page = (
                await proxy.get(
                    f"/api/calls/acme/{call_id}", params={"run": event.run_id}, headers=trusted
                )
            ).json()
            return next((e for e in page["audit"] if e["event"] == "approval_decision"), None)

        verdict = await wait_for(recorded)
        assert (verdict["by"], verdict["approve"]) == ("proxy:bob@corp", False)
        other = await proxy.get("/api/recent", params={"tenant": "globex"}, headers=trusted)
        assert other.status_code == 403


LOCAL_TOKEN = "local-token-of-this-test-0123456789"


@pytest.fixture(scope="module")
async def local_console(settings: Settings, client: FleetClient) -> AsyncIterator[str]:
    """A console on one's own machine: no sign-in configured, a login token for the process."""
    async with served_console(settings, ConsoleOptions(local_token=LOCAL_TOKEN)) as url:
        yield url


async def test_a_browser_session_from_the_local_login_url_needs_its_csrf_token_to_decide(
    local_console: str, settings: Settings
) -> None:
    async with httpx.AsyncClient(base_url=local_console, timeout=10) as browser:
        assert (await browser.get("/api/config")).status_code == 401
        wrong = await browser.get("/", params={"token": "not-the-token"})
        assert wrong.status_code == 401 and "login URL" in wrong.text
        login = await browser.get("/tasks", params={"token": LOCAL_TOKEN, "x": "1"})
        assert login.status_code == 303 and login.headers["location"] == "/tasks?x=1"
        cookie = login.headers["set-cookie"].lower()
        assert cookie.startswith("toolfleet_console=")
        assert "httponly" in cookie and "samesite=lax" in cookie and "secure" not in cookie
        config = (await browser.get("/api/config")).json()
        assert config["operator"].startswith("local:") and config["role"] == "admin"
        assert config["tenants"] is None and config["session"] is True and config["csrf"]

        before = await _published(settings)
        answer = {"resolution": "not_applied"}
        for headers in ({}, {CSRF_HEADER: "forged"}):
            refused = await browser.post("/api/tasks/task-x/resolve", json=answer, headers=headers)
            assert refused.status_code == 403 and CSRF_HEADER in refused.json()["error"]
        passed = await browser.post(
            "/api/tasks/task-x/resolve", json=answer, headers={CSRF_HEADER: config["csrf"]}
        )
        assert passed.status_code == 404  # past the CSRF check: there is no such task
        assert await _published(settings) == before

        assert (await browser.post("/auth/logout")).status_code == 403  # no CSRF token
        out = await browser.post("/auth/logout", headers={CSRF_HEADER: config["csrf"]})
        assert out.json() == {"redirect": "/auth/signed-out"}
        assert (await browser.get("/api/config")).status_code == 401
    # A script on the same machine: the same token as a bearer token, no CSRF token needed.
    async with httpx.AsyncClient(base_url=local_console, timeout=10) as script:
        local = {"Authorization": f"Bearer {LOCAL_TOKEN}"}
        assert (await script.get("/api/config", headers=local)).json()["role"] == "admin"


def test_a_console_without_sign_in_refuses_to_listen_beyond_this_machine(
    fleet: LocalFleet,
) -> None:
    env = {k: v for k, v in fleet.env().items() if not k.startswith("TOOLFLEET_CONSOLE_")}
    refused = subprocess.run(
        [sys.executable, "-m", "toolfleet", "console", "--host", "0.0.0.0", "--port", "0"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 2, refused
    message = " ".join(refused.stderr.split())
    assert "no sign-in is configured" in message
    for setting in ("OIDC_ISSUER", "TOKENS", "PROXY_SECRET"):
        assert f"TOOLFLEET_CONSOLE_{setting}" in message
    assert refused.stdout == ""  # no URL: it never listened


async def test_pools_workers_and_tenants_are_shown_and_limits_change_for_admins_only(
    *,
    fleet: LocalFleet,
    http: httpx.AsyncClient,
    acme: httpx.AsyncClient,
    client: FleetClient,
    redis: Redis,
    keys: Keys,
) -> None:
    await client.run_turn(turn("acme", ("p", "lookup", {"city": "Oslo"})))

    async def default_pool() -> dict[str, Any] | None:
        pools = (await http.get("/api/pools")).json()["pools"]
        # The lag is known once the console reaches the broker (it connects in the background).
        return next((p for p in pools if p["name"] == "default" and p["lag"] is not None), None)

    pool = await wait_for(default_pool)
    live = [w for w in pool["workers"] if w["live"]]
    assert len(live) == fleet.workers and pool["capacity"] == sum(w["slots"] for w in live) > 0
    assert pool["lag"] >= 0  # from the broker's committed offsets
    assert all(w["build"] and w["in_flight"] is not None and "lookup" in w["tools"] for w in live)

    root, tenant = _as("root"), f"limits-{time.monotonic_ns()}"
    body = {"max_concurrency": 5, "weight": 2, "rate": 2.5}
    refused = {
        who: await http.post(f"/api/limits/tenants/{tenant}", json=body, headers=_as(who))
        for who in ("vera", "alice", "acme-admin")
    }
    assert [r.status_code for r in refused.values()] == [403, 403, 403]
    assert "touches every tenant" in refused["acme-admin"].json()["error"]
    assert (await acme.post(f"/api/limits/tenants/{tenant}", json=body)).status_code == 403
    assert await redis.hget(keys.admission("tenants"), tenant) is None

    changed = await http.post(f"/api/limits/tenants/{tenant}", json=body, headers=root)
    assert changed.json()["limits"] == {"max_concurrency": 5, "weight": 2, "rate": 2.5}
    kept = await http.post(f"/api/limits/tenants/{tenant}", json={"burst": 3}, headers=root)
    assert kept.json()["limits"] == {"max_concurrency": 5, "weight": 2, "rate": 2.5, "burst": 3}
    view = (await http.get("/api/tenants")).json()
    [row] = [t for t in view["tenants"] if t["tenant_id"] == tenant]
    assert (row["weight"], row["running"], row["waiting"], row["fair_share"]) == (2, 0, 0, None)
    assert view["actions"] is False  # alice, an operator: sees, does not change
    assert (await http.get("/api/tenants", headers=root)).json()["actions"] is True
    # A console for one tenant lists that tenant only.
    assert {t["tenant_id"] for t in (await acme.get("/api/tenants")).json()["tenants"]} <= {"acme"}

    wrong = await http.post(f"/api/limits/tenants/{tenant}", json={"tenant_rate": 1}, headers=root)
    assert wrong.status_code == 400 and "tenant limits have no tenant_rate" in wrong.json()["error"]
    negative = await http.post("/api/limits/tools/lookup", json={"rate": -1}, headers=root)
    assert (
        negative.status_code == 400 and "rate must be a number above 0" in negative.json()["error"]
    )
    tool = await http.post("/api/limits/tools/lookup", json={"tenant_rate": 50}, headers=root)
    assert tool.json()["limits"] == {"tenant_rate": 50}
    listed = (await http.get("/api/tenants")).json()["tools"]
    assert {"name": "lookup", "limits": {"tenant_rate": 50}} in listed
    cleared = await http.post("/api/limits/tools/lookup", json={"clear": True}, headers=root)
    assert cleared.json()["limits"] == {}
    await http.post(f"/api/limits/tenants/{tenant}", json={"clear": True}, headers=root)
    assert await redis.hget(keys.admission("tenants"), tenant) is None


async def _audit_events(redis: Redis, keys: Keys, tenant: str, run: str, call: str) -> list[Any]:
    return await Ledger(redis, keys).audit(tenant, run, call)


async def test_bulk_actions_show_what_they_touch_act_once_confirmed_and_land_in_each_audit(
    *,
    http: httpx.AsyncClient,
    client: FleetClient,
    fleet: LocalFleet,
    redis: Redis,
    keys: Keys,
) -> None:
    waiting = turn("acme", *((f"b{i}", "transfer", {"amount": i, "to": "x"}) for i in range(3)))
    assert (await client.run_turn(waiting)).status == "interrupted"
    calls = [c.call_id for c in waiting.function_calls]
    reject = {
        "action": "reject",
        "selection": {"tenant": "acme", "tool": "transfer", "run": waiting.run_id},
        "note": "not today",
    }
    viewer = await http.post("/api/bulk/plan", json=reject, headers=_as("vera"))
    assert viewer.status_code == 403 and "needs the operator role" in viewer.json()["error"]
    other = await http.post("/api/bulk/plan", json=reject, headers=_as("acme-ops"))
    assert other.status_code == 200  # acme's operator: acme's calls
    planned = (await http.post("/api/bulk/plan", json=reject)).json()
    assert (planned["count"], planned["calls"]) == (3, 3)
    assert sorted(t["call_id"] for t in planned["targets"]) == sorted(calls)
    stale = await http.post("/api/bulk/apply", json=reject | {"digest": "0" * 32})
    assert stale.status_code == 409 and "look at it again" in stale.json()["error"]
    done = await http.post("/api/bulk/apply", json=reject | {"digest": planned["digest"]})
    assert done.status_code == 202, done.text
    result = done.json()
    assert (result["done"], result["failed"]) == (3, 0)

    async def decided(call: str) -> list[Any]:
        chain = await _audit_events(redis, keys, "acme", waiting.run_id, call)
        names = [e["event"] for e in chain]
        return chain if "approval_decision" in names else []

    for call in calls:
        chain = await wait_for(lambda call=call: decided(call))
        [bulk_entry] = [e for e in chain if e["event"] == "bulk_action"]
        assert bulk_entry["bulk"] == result["bulk_id"] and bulk_entry["by"] == "token:alice"
        [decision] = [e for e in chain if e["event"] == "approval_decision"]
        assert (decision["approve"], decision["by"]) == (False, "token:alice")
    again = (await http.post("/api/bulk/plan", json=reject)).json()
    assert again["count"] == 0  # decided: nothing left to touch


async def test_human_tasks_resolved_in_bulk_are_carried_out_by_the_reconciler(
    *,
    http: httpx.AsyncClient,
    client: FleetClient,
    fleet: LocalFleet,
    redis: Redis,
    keys: Keys,
) -> None:
    lost = turn("acme", ("n", "note", {"text": "bulk", "mode": "apply_then_drop"}))
    lost_call = await _submitted(client, lost)
    task = await _task_for(redis, keys, lost_call)
    resolve = {
        "action": "resolve",
        "selection": {"task_ids": [task.task.task_id]},
        "resolution": "applied",
        "output": "noted",
    }
    planned = (await http.post("/api/bulk/plan", json=resolve)).json()
    assert [t["task_id"] for t in planned["targets"]] == [task.task.task_id]
    done = await http.post("/api/bulk/apply", json=resolve | {"digest": planned["digest"]})
    assert done.json()["done"] == 1
    assert (await result_of(fleet, client, lost.run_id)).status == "completed"
    chain = await _audit_events(redis, keys, "acme", lost.run_id, lost_call)
    assert [e["bulk"] for e in chain if e["event"] == "bulk_action"] == [done.json()["bulk_id"]]


async def test_runs_cancelled_in_bulk_are_marked_and_their_calls_chains_say_so(
    *, http: httpx.AsyncClient, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    held = turn("acme", ("h", "transfer", {"amount": 1, "to": "y"}))
    assert (await client.run_turn(held)).status == "interrupted"
    cancel = {"action": "cancel", "selection": {"tenant": "acme", "runs": [held.run_id]}}

    async def plan_with_its_call() -> dict[str, Any] | None:
        # The run's calls come from the history, which records its turn as it ends.
        shown = (await http.post("/api/bulk/plan", json=cancel)).json()
        return shown if shown["calls"] == 1 else None

    planned = await wait_for(plan_with_its_call)
    assert planned["count"] == 1
    done = await http.post("/api/bulk/apply", json=cancel | {"digest": planned["digest"]})
    assert done.json()["done"] == 1
    chain = await _audit_events(redis, keys, "acme", held.run_id, held.function_calls[0].call_id)
    assert [(e["action"], e["bulk"]) for e in chain if e["event"] == "bulk_action"] == [
        ("cancel", done.json()["bulk_id"])
    ]

    async def cancelled() -> bool:
        return await redis.exists(keys.cancelled("acme", held.run_id)) == 1

    await wait_for(cancelled)
    elsewhere = {"action": "cancel", "selection": {"tenant": "globex", "runs": ["r"]}}
    refused = await http.post("/api/bulk/plan", json=elsewhere, headers=_as("acme-ops"))
    assert refused.status_code == 403


async def test_the_overview_counts_calls_and_turn_latency_and_samples_the_pools(
    *, http: httpx.AsyncClient, acme: httpx.AsyncClient, client: FleetClient
) -> None:
    def calls_in(data: dict[str, Any]) -> int:
        rates = (sum(v) for k, v in data["calls"].items() if k.startswith("status:"))
        return round(sum(rates) * data["width"])

    before = (await http.get("/api/overview", params={"span": "15m"})).json()
    counted = calls_in(before)
    events = [turn("acme", ("o", "lookup", {"city": f"C{i}"})) for i in range(5)]
    for event in events:
        assert (await client.run_turn(event)).status == "completed"

    async def folded() -> dict[str, Any] | None:
        data = (await http.get("/api/overview", params={"span": "15m"})).json()
        seconds = data["width"]
        done = round(
            sum(sum(v) * seconds for k, v in data["calls"].items() if k.startswith("status:"))
        )
        sampled = any(k.startswith("pool.capacity|") for k in data["gauges"])
        return data if done >= counted + 5 and sampled else None

    data = await wait_for(folded, within=60)
    assert data["job"]["state"] == "folding"
    assert len(data["starts"]) == 15 and data["width"] == 60
    assert any(p is not None and p > 0 for p in data["latency_p50_s"])
    assert data["tenants"]["acme"] >= 5
    assert any(v for v in data["gauges"]["pool.capacity|default"] if v)
    hours = (await http.get("/api/overview", params={"span": "24h"})).json()
    assert (len(hours["starts"]), hours["width"]) == (24, 3600)
    bad = await http.get("/api/overview", params={"span": "1y"})
    assert bad.status_code == 400 and "span must be one of" in bad.json()["error"]
    # The overview counts every tenant's calls: a console for one tenant has none to show.
    assert (await acme.get("/api/overview")).status_code == 403
    scoped = await http.get("/api/overview", headers=_as("acme-ops"))
    assert scoped.status_code == 403 and "identity of every tenant" in scoped.json()["error"]


async def test_tools_pinned_in_bulk_stay_where_their_calls_go_and_only_admins_pin(
    *, http: httpx.AsyncClient, redis: Redis, keys: Keys
) -> None:
    pin = {"action": "pin", "selection": {"tools": ["quote", "lookup"]}}
    refused = await http.post("/api/bulk/plan", json=pin)  # alice: an operator
    assert refused.status_code == 403 and "needs the admin role" in refused.json()["error"]
    root = _as("root")
    planned = (await http.post("/api/bulk/plan", json=pin, headers=root)).json()
    assert {(t["tool"], t["version"]) for t in planned["targets"]} == {
        ("lookup", "1"),
        ("quote", "2"),
    }
    only_rolled_back = pin | {"selection": {"tools": ["quote", "lookup"], "rolled_back": True}}
    assert (await http.post("/api/bulk/plan", json=only_rolled_back, headers=root)).json()[
        "count"
    ] == 0  # no circuit is open: nothing was rolled back
    done = await http.post(
        "/api/bulk/apply", json=pin | {"digest": planned["digest"]}, headers=root
    )
    assert done.json()["done"] == 2, done.text
    try:
        assert await pinned_version(redis, keys, "quote") == "2"
        assert await pinned_version(redis, keys, "lookup") == "1"
    finally:
        for name in ("quote", "lookup"):
            await http.post(f"/api/tools/{name}/unpin", json={}, headers=root)


async def test_human_tasks_are_assigned_one_by_one_or_in_bulk_and_their_calls_say_so(
    *, http: httpx.AsyncClient, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    lost = [
        turn("acme", ("a", "note", {"text": f"a{i}", "mode": "apply_then_drop"})) for i in range(2)
    ]
    tasks = [await _task_for(redis, keys, await _submitted(client, e)) for e in lost]
    first = tasks[0].task.task_id
    viewer = await http.post(f"/api/tasks/{first}/assign", json={"to": "x"}, headers=_as("vera"))
    assert viewer.status_code == 403
    other = await http.post(f"/api/tasks/{first}/assign", json={"to": "x"}, headers=_as("acme-ops"))
    assert other.status_code == 200  # acme's operator: acme's task
    mine = await http.post(f"/api/tasks/{first}/assign", json={"to": "bob"})
    assert mine.json()["task"]["assignee"]["to"] == "bob"
    assert mine.json()["task"]["assignee"]["by"] == "token:alice"
    listed = {t["task_id"]: t for t in (await http.get("/api/tasks")).json()["tasks"]}
    assert listed[first]["assignee"]["to"] == "bob"

    ids = [t.task.task_id for t in tasks]
    bulk = {"action": "assign", "selection": {"task_ids": ids}, "assignee": "carol"}
    planned = (await http.post("/api/bulk/plan", json=bulk)).json()
    assert sorted(t["task_id"] for t in planned["targets"]) == sorted(ids)
    done = await http.post("/api/bulk/apply", json=bulk | {"digest": planned["digest"]})
    assert done.json()["done"] == 2
    listed = {t["task_id"]: t for t in (await http.get("/api/tasks")).json()["tasks"]}
    assert [listed[i]["assignee"]["to"] for i in ids] == ["carol", "carol"]
    chain = await _audit_events(redis, keys, "acme", lost[0].run_id, tasks[0].task.call_id or "")
    assigned = [(e["to"], e["by"]) for e in chain if e["event"] == "task_assigned"]
    assert assigned == [("x", "token:acme-ops"), ("bob", "token:alice"), ("carol", "token:alice")]
    for task_id in ids:  # leave nothing open for the module's other tests
        answer = {"resolution": "applied", "output": "x"}
        assert (await http.post(f"/api/tasks/{task_id}/resolve", json=answer)).status_code == 202
