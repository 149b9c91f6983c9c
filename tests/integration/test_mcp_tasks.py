"""Durable calls through the MCP door: idempotency keys and tasks (MCP 2025-11-25, SEP-1686).

The door (``toolfleet.app.mcp.create_app``) is served by uvicorn in this process in front of
a real fleet (``InProcessFleet``: Kafka, Redis, planner, worker, aggregator, reconciler), as
in test_mcp_door.py. The client is the ``mcp`` package's own on the 2025-11-25 handshake; it
has no task API, so tasks go through its raw ``send_request``. The tools run in this
process: they count what reached their "upstream" in Redis, and wait on events the test sets,
so a test holds a call where it needs it without sleeping.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from agents import Agent, Runner
from agents.mcp import MCPServerStreamableHttp
from agents.mcp.util import MCPToolMetaContext
from agents.testing import ScriptedModel, assistant_message, function_call
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, SecretStr
from redis.asyncio import Redis

from executors import ProbeResult, ToolContext, ToolRegistry
from kernel.adapters.redis import text
from kernel.rules.mcp import REPUBLISH_AFTER_S, call_fingerprint, run_id_for
from kernel.settings import Settings
from kernel.stores.door import Stores
from kernel.stores.ledger import Ledger
from tests.conftest import wait_for
from tests.integration.mcp_task_tools import release_key, runs_key
from tests.integration.test_mcp_door import free_socket, served, token, tokens_setting
from toolfleet.app.mcp import DoorOptions, TaskLimits, create_app
from toolfleet.app.operations import decide_approval
from toolfleet.testing import InProcessFleet, LocalFleet

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]

TENANT_A, TENANT_B = "door-a", "door-b"
KEY_META = "io.toolfleet/idempotency-key"

SESSION = uuid.uuid4().hex[:8]
"""Names this module's upstream keys, apart from any earlier session's in the same Redis."""

tools = ToolRegistry()
released: dict[str, asyncio.Event] = {}
"""Per test key: set by the test to let a held tool (or probe) answer."""


def gate(key: str) -> asyncio.Event:
    """The event a held tool of ``key`` waits on."""
    return released.setdefault(key, asyncio.Event())


def runs(key: str) -> str:
    """How many times a tool body reached its upstream for ``key``."""
    return f"test:mcp-tasks:{SESSION}:runs:{key}"


def record(idempotency_key: str) -> str:
    """What the upstream holds for a call's idempotency key (the probes read it)."""
    return f"test:mcp-tasks:{SESSION}:record:{idempotency_key}"


def cancelled_key(key: str) -> str:
    """Set when a held tool of ``key`` saw its cancellation."""
    return f"test:mcp-tasks:{SESSION}:cancelled:{key}"


def upstream() -> Redis:
    """The Redis the tools' upstream lives in (the fleet's; ``fleet`` connects it)."""
    return _upstream[0]


_upstream: list[Redis] = []


async def _upstream_applies(ctx: ToolContext, key: str) -> None:
    upstream = _upstream[0]
    await upstream.incr(runs(key))
    await upstream.set(record(ctx.idempotency_key), key, nx=True)


async def _probe(ctx: ToolContext) -> ProbeResult:
    await gate("probe").wait()  # the test lets the probe answer once it saw the probing
    found = await upstream().get(record(ctx.idempotency_key))
    if found is None:
        return ProbeResult.not_applied()
    return ProbeResult.applied(f"found upstream: {text(found)}")


@tools.tool(effect="non_idempotent", timeout=60)
async def hold(ctx: ToolContext, key: str) -> str:
    """Reaches its upstream at once, answers when the test releases it."""
    await _upstream_applies(ctx, key)
    try:
        await gate(key).wait()
    except asyncio.CancelledError:
        await upstream().set(cancelled_key(key), "1")
        raise
    return f"done {key}"


hold.probe(_probe)


@tools.tool(effect="non_idempotent", timeout=60)
async def lose_answer(ctx: ToolContext, key: str) -> str:
    """Reaches its upstream, then its answer is lost (a read timeout): effect unknown."""
    await _upstream_applies(ctx, key)
    raise TimeoutError("the upstream's answer never came")


lose_answer.probe(_probe)


@tools.tool(effect="read_only", timeout=10)
async def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: 21°C, clear"


@tools.tool(effect="non_idempotent", timeout=10)
async def book_trip(city: str) -> str:
    """Books a trip (no probe: every call waits for a person's approval)."""
    return f"booked {city}"


@pytest.fixture(scope="module")
async def fleet(settings: Settings, topics: list[str]) -> AsyncIterator[InProcessFleet]:
    _upstream.append(Redis.from_url(settings.redis_address()))
    try:
        async with InProcessFleet(settings, tools) as running:
            yield running
    finally:
        await _upstream.pop().aclose()


@pytest.fixture(scope="module")
async def door(fleet: InProcessFleet) -> AsyncIterator[str]:
    """The door over the fleet (tasks/list pages of 2), with test_mcp_door's tokens."""
    door_settings = fleet.settings.model_copy(update={"mcp_tokens": SecretStr(tokens_setting())})
    options = DoorOptions(task_limits=TaskLimits(recheck_s=0.2, page_size=2))
    async with served(create_app(door_settings, options), free_socket()) as base:
        yield f"{base}/mcp"


def client_of(url: str, name: str) -> Client:
    """The ``mcp`` client of the door with ``name``'s token, on the 2025-11-25 handshake."""
    headers = {"Authorization": f"Bearer {token(name)}"}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120))
    return Client(streamable_http_client(url, http_client=http), mode="legacy")


class Created(BaseModel):
    """What a task-augmented ``tools/call`` answers (the task, beside a text)."""

    model_config = ConfigDict(extra="allow")
    task: types.Task


async def start_task(
    client: Client, name: str, arguments: dict[str, Any], *, ttl: int | None = None
) -> types.Task:
    """A task-augmented ``tools/call``: its task."""
    params = types.CallToolRequestParams(
        name=name, arguments=arguments, task=types.TaskMetadata(ttl=ttl)
    )
    created = await client.session.send_request(types.CallToolRequest(params=params), Created)
    return created.task


async def get_task(client: Client, task_id: str) -> types.GetTaskResult:
    """``tasks/get``."""
    request = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id))
    return await client.session.send_request(request, types.GetTaskResult)


async def task_result(client: Client, task_id: str) -> types.CallToolResult:
    """``tasks/result``: the call's result once the task is terminal."""
    request = types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task_id))
    return await client.session.send_request(request, types.CallToolResult)


async def list_tasks(client: Client, cursor: str | None = None) -> types.ListTasksResult:
    """``tasks/list``: one page."""
    request = types.ListTasksRequest(params=types.PaginatedRequestParams(cursor=cursor))
    return await client.session.send_request(request, types.ListTasksResult)


async def all_task_ids(client: Client) -> list[str]:
    """Every task ``tasks/list`` shows, page after page."""
    found: list[str] = []
    cursor: str | None = None
    while True:
        page = await list_tasks(client, cursor)
        found += [t.task_id for t in page.tasks]
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


async def cancel_task(client: Client, task_id: str) -> types.CancelTaskResult:
    """``tasks/cancel``."""
    request = types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task_id))
    return await client.session.send_request(request, types.CancelTaskResult)


async def status_becomes(
    client: Client, task_id: str, status: str, within: float = 60
) -> types.GetTaskResult:
    """``tasks/get`` until the task has ``status``; the task then."""
    seen: list[types.GetTaskResult] = []

    async def reached() -> bool:
        seen.append(await get_task(client, task_id))
        return seen[-1].status == status

    await wait_for(reached, within=within)
    return seen[-1]


def text_of(result: types.CallToolResult) -> str:
    """The one text block of a result."""
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def call_meta(result: types.CallToolResult) -> dict[str, Any]:
    """What the fleet recorded for a call, from a result's ``_meta``."""
    meta: dict[str, Any] = (result.meta or {})["io.toolfleet/call"]
    return meta


async def count(redis: Redis, key: str) -> int:
    """A counter the tools keep (0 when never set)."""
    return int(await redis.get(runs(key)) or 0)


# --- idempotency keys ------------------------------------------------------------------------


async def test_a_keyed_call_retried_after_the_connection_dropped_runs_once(
    door: str, redis: Redis
) -> None:
    key = "retry-1"
    meta: Any = {KEY_META: "agent-run-7:call-1"}
    first = client_of(door, "agent-a")
    await first.__aenter__()
    dropped = asyncio.create_task(first.call_tool("hold", {"key": key}, meta=meta))

    async def reached_upstream() -> bool:
        return await count(redis, key) == 1

    await wait_for(reached_upstream, within=60)
    dropped.cancel()  # the client goes away mid-call, its connection with it
    with pytest.raises(BaseException):  # noqa: B017 - whatever the cancelled call raises
        await dropped
    await first.__aexit__(None, None, None)  # and its HTTP client is closed

    async with client_of(door, "agent-a") as again:
        retried = asyncio.create_task(again.call_tool("hold", {"key": key}, meta=meta))
        gate(key).set()
        result = await retried
    assert result.is_error is False and text_of(result) == f"done {key}"
    assert call_meta(result)["status"] == "succeeded"
    assert await count(redis, key) == 1  # one upstream effect: the retry re-attached

    # Once settled, the same key answers the same result again, and still runs nothing.
    async with client_of(door, "agent-a") as later:
        repeated = await later.call_tool("hold", {"key": key}, meta=meta)
    assert text_of(repeated) == f"done {key}"
    assert call_meta(repeated)["run_id"] == call_meta(result)["run_id"]
    assert await count(redis, key) == 1


async def test_the_same_key_for_another_call_is_an_error_and_runs_nothing(
    door: str, redis: Redis
) -> None:
    meta: Any = {KEY_META: "key-reused"}
    async with client_of(door, "agent-a") as client:
        first = await client.call_tool("weather", {"city": "Oslo"}, meta=meta)
        assert text_of(first) == "Oslo: 21°C, clear"
        with pytest.raises(MCPError) as refused:
            await client.call_tool("weather", {"city": "Rome"}, meta=meta)
        assert refused.value.error.code == types.INVALID_PARAMS
        assert "was used for another call" in refused.value.error.message
        with pytest.raises(MCPError, match="was used for another call"):
            await client.call_tool("hold", {"key": "never"}, meta=meta)
    assert await count(redis, "never") == 0
    # Another tenant's same key is another call of its own.
    async with client_of(door, "agent-b") as other:
        theirs = await other.call_tool("weather", {"city": "Rome"}, meta=meta)
    assert text_of(theirs) == "Rome: 21°C, clear"
    assert call_meta(theirs)["run_id"] != call_meta(first)["run_id"]


async def test_arguments_the_planner_would_refuse_are_an_error_at_once(door: str) -> None:
    """Over TOOLFLEET_MAX_ARGUMENT_BYTES the planner dead-letters a response and no result
    ever comes: the door says so at once, plain or as a task, and records nothing."""
    huge = {"city": "x" * 300_000}
    async with client_of(door, "agent-a") as client:
        before = await all_task_ids(client)
        with pytest.raises(MCPError, match="TOOLFLEET_MAX_ARGUMENT_BYTES") as plain:
            await client.call_tool("weather", huge)
        assert plain.value.error.code == types.INVALID_PARAMS
        with pytest.raises(MCPError, match="TOOLFLEET_MAX_ARGUMENT_BYTES"):
            await start_task(client, "weather", huge)
        assert await all_task_ids(client) == before  # no task recorded


# --- tasks -----------------------------------------------------------------------------------


async def test_a_task_is_created_at_once_then_read_and_its_result_fetched(door: str) -> None:
    async with client_of(door, "agent-a") as client:
        caps = client.session.server_capabilities
        assert caps is not None and caps.tasks is not None
        assert caps.tasks.requests is not None and caps.tasks.list is not None
        task = await start_task(client, "weather", {"city": "Lima"}, ttl=120_000)
        assert task.status == "working" and task.ttl == 120_000
        assert task.poll_interval == 1000
        result = await task_result(client, task.task_id)
        done = await get_task(client, task.task_id)
    assert result.is_error is False and text_of(result) == "Lima: 21°C, clear"
    assert call_meta(result) | {"run_id": None} == {
        "run_id": None, "status": "succeeded", "effect": "applied", "attempts": 1,
        "resolved": True,
    }  # fmt: skip
    assert call_meta(result)["run_id"] == task.task_id  # a task is its call's run
    related = (result.meta or {})["io.modelcontextprotocol/related-task"]
    assert related == {"taskId": task.task_id}
    assert done.status == "completed" and done.poll_interval is None


async def test_a_client_that_went_away_fetches_its_result_on_a_new_connection(
    door: str, redis: Redis
) -> None:
    key = "reconnect"
    async with client_of(door, "agent-a") as client:
        task = await start_task(client, "hold", {"key": key})

    async def reached_upstream() -> bool:
        return await count(redis, key) == 1

    await wait_for(reached_upstream, within=60)
    async with client_of(door, "agent-a") as again:
        assert (await get_task(again, task.task_id)).status_message == "running (attempt 1)"
        waiting = asyncio.create_task(task_result(again, task.task_id))
        gate(key).set()
        result = await waiting
    assert text_of(result) == f"done {key}"
    assert await count(redis, key) == 1


async def test_a_task_its_replica_recorded_but_never_published_is_published_by_a_reader(
    door: str, fleet: InProcessFleet, redis: Redis
) -> None:
    """The one window where a replica's death matters: after it recorded the task, before
    its call was published. The record stays unsubmitted; the next reader publishes the same
    call (same run and call id) once the creator had its time."""
    run_id = run_id_for(TENANT_A, None)
    arguments = {"city": "Bern"}
    store = Stores(redis, fleet.settings).mcp_tasks()
    await store.create(
        TENANT_A,
        run_id,
        tool="weather",
        name="weather",
        namespace=None,
        arguments=json.dumps(arguments),
        fingerprint=call_fingerprint("weather", arguments),
        created_by="token:agent-a",
        task=True,
        ttl_ms=120_000,
        now=time.time() - REPUBLISH_AFTER_S,  # its creator died that long ago
    )
    async with client_of(door, "agent-a") as client:
        assert (await get_task(client, run_id)).status_message == "queued"
        result = await task_result(client, run_id)
    assert text_of(result) == "Bern: 21°C, clear"
    assert (await store.get(TENANT_A, run_id)).submitted_at is not None  # type: ignore[union-attr]
    entry = (await Ledger(redis, fleet.keys).read(TENANT_A, run_id, [run_id]))[run_id]
    assert entry.attempts == 1


async def test_tasks_list_shows_the_callers_tenant_only_a_page_at_a_time(door: str) -> None:
    async with client_of(door, "agent-a") as a, client_of(door, "agent-b") as b:
        mine = [(await start_task(a, "weather", {"city": c})).task_id for c in "XYZ"]
        theirs = (await start_task(b, "weather", {"city": "W"})).task_id
        first = await list_tasks(a)
        assert len(first.tasks) == 2 and first.next_cursor is not None  # pages of 2
        listed_a = await all_task_ids(a)
        listed_b = await all_task_ids(b)
        with pytest.raises(MCPError, match="invalid tasks/list cursor"):
            await list_tasks(a, "not-a-cursor")
    assert listed_a[:3] == mine[::-1]  # newest first
    assert len(listed_a) == len(set(listed_a))  # no task on two pages
    assert theirs not in listed_a
    assert theirs in listed_b and not set(mine) & set(listed_b)


async def test_another_tenants_token_never_reads_lists_or_cancels_a_task(
    door: str, redis: Redis
) -> None:
    key = "tenant-guard"
    async with client_of(door, "agent-a") as a, client_of(door, "agent-b") as b:
        task = await start_task(a, "hold", {"key": key})
        for attempt in (get_task, task_result, cancel_task):
            with pytest.raises(MCPError) as refused:
                await attempt(b, task.task_id)
            assert refused.value.error.code == types.INVALID_PARAMS
            assert refused.value.error.message == f"Task not found: {task.task_id}"
        assert task.task_id not in await all_task_ids(b)
        # B's attempts changed nothing: A's task runs on and completes.
        assert (await get_task(a, task.task_id)).status == "working"
        waiting = asyncio.create_task(task_result(a, task.task_id))
        gate(key).set()
        result = await waiting
    assert text_of(result) == f"done {key}" and await count(redis, key) == 1
    # An id that never existed answers the same: no oracle for other tenants' ids.
    async with client_of(door, "agent-b") as b:
        with pytest.raises(MCPError, match="Task not found: mcp-nothing"):
            await get_task(b, "mcp-nothing")


async def test_cancelling_a_running_task_cancels_its_call_on_the_fleet(
    door: str, fleet: InProcessFleet, redis: Redis
) -> None:
    key = "cancel-me"
    async with client_of(door, "agent-a") as client:
        task = await start_task(client, "hold", {"key": key})
        await status_becomes(client, task.task_id, "working")

        async def running() -> bool:
            return (await get_task(client, task.task_id)).status_message == "running (attempt 1)"

        await wait_for(running, within=60)
        cancelled = await cancel_task(client, task.task_id)
        assert cancelled.status == "cancelled"

        async def tool_saw_it() -> bool:
            return await upstream().get(cancelled_key(key)) == b"1"

        await wait_for(tool_saw_it, within=60)  # the tool body was cancelled, tool-locally
        ledger = Ledger(redis, fleet.keys)

        async def settled() -> bool:
            entry = (await ledger.read(TENANT_A, task.task_id, [task.task_id])).get(task.task_id)
            return entry is not None and entry.outcome is not None

        await wait_for(settled, within=60)
        assert (await get_task(client, task.task_id)).status == "cancelled"  # sticky
        result = await task_result(client, task.task_id)
        with pytest.raises(MCPError, match="is cancelled already: nothing to cancel"):
            await cancel_task(client, task.task_id)
    assert result.is_error is True
    assert text_of(result).startswith("cancelled: cancelled through the MCP door by token:agent-a")
    assert call_meta(result)["status"] == "cancelled"
    assert await count(redis, key) == 1


async def test_a_viewer_reads_tasks_but_cannot_cancel_them(door: str) -> None:
    async with client_of(door, "agent-a") as agent:
        task = await start_task(agent, "weather", {"city": "Riga"})
        await task_result(agent, task.task_id)
    async with client_of(door, "watcher-a") as viewer:
        assert (await get_task(viewer, task.task_id)).status == "completed"
        with pytest.raises(MCPError, match="tasks/cancel needs the operator role"):
            await cancel_task(viewer, task.task_id)


async def test_a_task_waiting_for_approval_is_input_required_until_an_operator_decides(
    door: str, fleet: InProcessFleet, redis: Redis
) -> None:
    async with client_of(door, "agent-a") as client:
        task = await start_task(client, "book_trip", {"city": "Cusco"})
        waiting = await status_becomes(client, task.task_id, "input_required")
        assert waiting.status_message is not None
        assert "waiting for approval of book_trip" in waiting.status_message
        result_wait = asyncio.create_task(task_result(client, task.task_id))
        await decide_approval(
            redis,
            fleet.client.bus,
            fleet.settings,
            tenant_id=TENANT_A,
            run_id=task.task_id,
            call_id=task.task_id,
            approve=True,
            decided_by="console:alice",
        )
        result = await result_wait
        assert (await get_task(client, task.task_id)).status == "completed"
    assert result.is_error is False and text_of(result) == "booked Cusco"


async def test_a_rejected_approval_fails_the_task(
    door: str, fleet: InProcessFleet, redis: Redis
) -> None:
    async with client_of(door, "agent-a") as client:
        task = await start_task(client, "book_trip", {"city": "Nowhere"})
        await status_becomes(client, task.task_id, "input_required")
        await decide_approval(
            redis,
            fleet.client.bus,
            fleet.settings,
            tenant_id=TENANT_A,
            run_id=task.task_id,
            call_id=task.task_id,
            approve=False,
            message="not this week",
            decided_by="console:alice",
        )
        result = await task_result(client, task.task_id)
        failed = await get_task(client, task.task_id)
    assert result.is_error is True and call_meta(result)["effect"] == "not_executed"
    assert failed.status == "failed"


async def test_a_keyed_plain_call_of_a_gated_tool_answers_once_decided(
    door: str, fleet: InProcessFleet, redis: Redis
) -> None:
    meta: Any = {KEY_META: f"gated-{SESSION}"}
    async with client_of(door, "agent-a") as client:
        waiting = await client.call_tool("book_trip", {"city": "Puno"}, meta=meta)
        assert call_meta(waiting)["status"] == "pending_approval"
        assert "with an idempotency key" in text_of(waiting)
        await decide_approval(
            redis,
            fleet.client.bus,
            fleet.settings,
            tenant_id=TENANT_A,
            run_id=call_meta(waiting)["run_id"],
            call_id=call_meta(waiting)["run_id"],
            approve=True,
            decided_by="console:alice",
        )

        async def decided() -> bool:
            entry = await Ledger(redis, fleet.keys).decisions(
                TENANT_A, call_meta(waiting)["run_id"]
            )
            return call_meta(waiting)["run_id"] in entry.per_call

        await wait_for(decided, within=60)  # the planner recorded the operator's decision
        again = await client.call_tool("book_trip", {"city": "Puno"}, meta=meta)
    assert again.is_error is False and text_of(again) == "booked Puno"
    assert call_meta(again)["run_id"] == call_meta(waiting)["run_id"]


async def test_an_unknown_effect_stays_working_while_probed_then_completes(
    door: str, redis: Redis
) -> None:
    key = "probe-me"
    async with client_of(door, "agent-a") as client:
        task = await start_task(client, "lose_answer", {"key": key})

        async def probing() -> bool:
            seen = await get_task(client, task.task_id)
            assert seen.status == "working", seen
            return (seen.status_message or "").startswith("effect unknown: the reconciler")

        await wait_for(probing, within=60)
        gate("probe").set()  # the probe may answer now
        result = await task_result(client, task.task_id)
        done = await get_task(client, task.task_id)
    assert done.status == "completed"
    assert text_of(result) == f"found upstream: {key}"
    assert call_meta(result)["effect"] == "applied" and call_meta(result)["resolved"] is True
    assert await count(redis, key) == 1  # probed, never run again


async def test_tasks_are_not_served_on_the_2026_revision(door: str) -> None:
    headers = {"Authorization": f"Bearer {token('agent-a')}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30)) as http,
        Client(streamable_http_client(door, http_client=http), mode="auto") as client,
    ):
        assert client.session.protocol_version == "2026-07-28"
        with pytest.raises(MCPError, match="served on the 2025-11-25 revision only"):
            await get_task(client, "mcp-anything")


# --- replicas --------------------------------------------------------------------------------


def free_port() -> int:
    """A port of 127.0.0.1 free a moment ago, for a door process to listen on."""
    with free_socket() as sock:
        port: int = sock.getsockname()[1]
    return port


async def door_up(base: str, fleet: LocalFleet, name: str) -> None:
    """Wait until the door process ``name`` answers its health check."""

    async def healthy() -> bool:
        assert fleet.alive(name), fleet.logs(name)[-2000:]
        async with httpx2.AsyncClient(timeout=2) as http:
            try:
                return (await http.get(f"{base}/healthz")).status_code == 200
            except httpx2.TransportError:
                return False

    await wait_for(healthy, within=60)


@pytest.fixture(scope="module")
def replicas(settings: Settings, topics: list[str]) -> Iterator[tuple[LocalFleet, list[str]]]:
    """A fleet of processes (planner, aggregator, reconciler, a worker) and two ``toolfleet
    mcp`` processes in front of it: the fleet and the doors' MCP URLs."""
    env = {"TOOLFLEET_MCP_TOKENS": tokens_setting()}
    with LocalFleet(
        settings, tools="tests.integration.mcp_task_tools:tools", workers=1, extra_env=env
    ) as running:
        ports = [free_port(), free_port()]
        for name, port in zip(("door-1", "door-2"), ports, strict=True):
            running.start(name, ["mcp", "--port", str(port)])
        yield running, [f"http://127.0.0.1:{port}" for port in ports]


async def test_a_replica_killed_after_tools_call_leaves_the_result_to_another(
    replicas: tuple[LocalFleet, list[str]], redis: Redis
) -> None:
    fleet, (first, second) = replicas
    await door_up(first, fleet, "door-1")
    await door_up(second, fleet, "door-2")
    key = f"replica-{SESSION}"
    async with client_of(f"{first}/mcp", "agent-a") as client:
        task = await start_task(client, "held", {"key": key})

    async def reached_upstream() -> bool:
        return int(await redis.get(runs_key(key)) or 0) == 1

    await wait_for(reached_upstream, within=120)
    fleet.kill("door-1")  # SIGKILL: the replica that took the call is gone
    async with client_of(f"{second}/mcp", "agent-a") as client:
        assert (await get_task(client, task.task_id)).status == "working"
        waiting = asyncio.create_task(task_result(client, task.task_id))
        await redis.set(release_key(key), "1")
        result = await waiting
        done = await get_task(client, task.task_id)
    assert result.is_error is False and text_of(result) == f"done {key}"
    assert done.status == "completed"
    assert int(await redis.get(runs_key(key)) or 0) == 1  # the upstream effect happened once


# --- the official TypeScript SDK -------------------------------------------------------------

MCP_TS = Path(__file__).parent / "mcp_ts"
"""The TypeScript SDK's client (``scripts/install-mcp-ts.sh`` installs its packages)."""


@pytest.fixture(scope="module")
async def ts_installed() -> None:
    """The TypeScript SDK installed as its lock file pins it (at once when it is)."""
    assert shutil.which("node"), "node is missing: install Node.js 20 or later"
    install = await asyncio.to_thread(
        subprocess.run,
        ["sh", str(MCP_TS.parents[2] / "scripts" / "install-mcp-ts.sh")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, f"npm ci failed: {install.stderr}"


async def ts_client(url: str, name: str, *step: str) -> dict[str, Any]:
    """One step of ``mcp_ts/client.mjs`` (its own connection, ``name``'s token): its JSON."""
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(MCP_TS / "client.mjs"),
        url,
        token(name),
        *step,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, err.decode()[-2000:]
    answer: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    assert "error" not in answer, answer
    return answer


async def test_the_typescript_sdk_calls_runs_a_task_lists_and_cancels(
    door: str, ts_installed: None
) -> None:
    plain = await ts_client(door, "agent-a", "plain", "weather", '{"city": "Tbilisi"}')
    assert plain["isError"] is False and plain["text"] == "Tbilisi: 21°C, clear"
    assert plain["meta"]["io.toolfleet/call"]["status"] == "succeeded"

    streamed = (await ts_client(door, "agent-a", "stream", "weather", '{"city": "Baku"}'))[
        "messages"
    ]
    assert streamed[0]["type"] == "taskCreated" and streamed[-1]["type"] == "result"
    assert streamed[-1]["text"] == "Baku: 21°C, clear"
    assert streamed[-1]["meta"]["io.toolfleet/call"]["effect"] == "applied"
    done_id = streamed[0]["taskId"]
    assert (await ts_client(door, "agent-a", "get", done_id))["task"]["status"] == "completed"

    gated = (await ts_client(door, "agent-a", "create", "book_trip", '{"city": "Riga"}'))["task"]
    gated_id = gated["taskId"]

    async def input_required() -> bool:
        seen = await ts_client(door, "agent-a", "get", gated_id)
        return bool(seen["task"]["status"] == "input_required")

    await wait_for(input_required, within=60)
    listed = {t["taskId"] for t in (await ts_client(door, "agent-a", "list"))["tasks"]}
    assert {done_id, gated_id} <= listed  # the first page: the newest two
    cancelled = await ts_client(door, "agent-a", "cancel", gated_id)
    assert cancelled["task"]["status"] == "cancelled"
    result = await ts_client(door, "agent-a", "result", gated_id)
    assert result["isError"] is True and result["text"].startswith("cancelled: ")
    assert result["meta"]["io.toolfleet/call"]["effect"] == "not_executed"
    theirs = {t["taskId"] for t in (await ts_client(door, "agent-b", "list"))["tasks"]}
    assert not {done_id, gated_id} & theirs


# --- the Agents SDK's MCP client -------------------------------------------------------------


async def test_the_agents_sdk_sends_an_idempotency_key_per_model_tool_call(
    door: str, fleet: InProcessFleet, redis: Redis
) -> None:
    """docs/mcp.md's recipe: ``tool_meta_resolver`` names each call by the model's tool call
    id, so the SDK's own retries (``max_retry_attempts``) find the first call."""
    run_key = f"sdk-run-{SESSION}"

    def idempotency_key(context: MCPToolMetaContext) -> dict[str, Any]:
        call_id = getattr(context.run_context, "tool_call_id", None)
        return {KEY_META: f"{run_key}:{call_id}"} if call_id else {}

    model = ScriptedModel(
        [[function_call("weather", {"city": "Lima"}, call_id="w1")], [assistant_message("done")]]
    )
    async with MCPServerStreamableHttp(
        {"url": door, "headers": {"Authorization": f"Bearer {token('agent-a')}"}},
        name="fleet",
        client_session_timeout_seconds=60,
        max_retry_attempts=3,
        tool_meta_resolver=idempotency_key,
    ) as server:
        agent = Agent(name="traveller", model=model, mcp_servers=[server])
        result = await Runner.run(agent, "How is the weather in Lima?")
    assert result.final_output == "done"
    run = run_id_for(TENANT_A, f"{run_key}:w1")  # the call ran as the key's run
    entry = (await Ledger(redis, fleet.keys).read(TENANT_A, run, [run]))[run]
    assert entry.outcome is not None and entry.outcome.output == "Lima: 21°C, clear"


async def test_a_waiting_tasks_result_streams_the_tasks_status_changes(
    door: str, fleet: InProcessFleet, redis: Redis
) -> None:
    async with client_of(door, "agent-a") as client:
        task = await start_task(client, "book_trip", {"city": "Tartu"})
        await status_becomes(client, task.task_id, "input_required")
    body = {"jsonrpc": "2.0", "id": 9, "method": "tasks/result",
            "params": {"taskId": task.task_id}}  # fmt: skip
    headers = {
        "Authorization": f"Bearer {token('agent-a')}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-11-25",
    }
    events: list[dict[str, Any]] = []
    async with (
        httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=120)) as http,
        http.stream("POST", door, json=body, headers=headers) as answer,
    ):
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        # Only a reader of the task resumes it after the decision: this request is the only
        # one, so it sees the task waiting first, whenever it starts, and every change after.
        await decide_approval(
            redis,
            fleet.client.bus,
            fleet.settings,
            tenant_id=TENANT_A,
            run_id=task.task_id,
            call_id=task.task_id,
            approve=True,
            decided_by="console:alice",
        )
        async for line in answer.aiter_lines():
            if line.startswith("data:") and line[5:].strip():
                events.append(json.loads(line[5:]))
                if "id" in events[-1]:
                    break  # the response: nothing follows on this stream
    statuses = [e["params"] for e in events if e.get("method") == "notifications/tasks/status"]
    assert statuses and statuses[-1]["status"] == "completed"
    assert {s["status"] for s in statuses} <= {"working", "completed"}
    assert all(s["taskId"] == task.task_id for s in statuses)
    changes = [(s["status"], s.get("statusMessage")) for s in statuses]
    assert len(changes) == len(set(changes))  # each change once
    assert events[-1]["id"] == 9 and events[-1]["result"]["content"][0]["text"] == "booked Tartu"
