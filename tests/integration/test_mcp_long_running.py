"""Tools that run for hours, through the MCP door: a task-augmented call of a tool that stops
heartbeating stays ``working`` while the reconciler probes its unknown effect, then ends
with the probe's verdict; a task-augmented call of a tool that defers stays ``working`` after
the worker that started it exited, and a signed completion on ``completions`` settles it
for a client that connects afresh. Each upstream effect happens once.

The fleet is processes (``LocalFleet``: planner, aggregator, reconciler and two workers
serving ``tests.integration.mcp_long_tools``), so a worker can be stopped for real; the door
is served by uvicorn in this process over the same Kafka and Redis, as in
test_mcp_progress.py. The client is the ``mcp`` package's own on the 2025-11-25 handshake,
tasks through its raw ``send_request`` (test_mcp_tasks.py's helpers).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pydantic import SecretStr
from redis.asyncio import Redis

from kernel.adapters.bus import KafkaBus
from kernel.rules.mcp import call_id_of
from kernel.rules.texts import HEARTBEAT_TIMEOUT
from kernel.settings import Settings
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger
from schemas import CompletionMessage
from tests.conftest import wait_for
from tests.integration.deferred_tools import handed_key
from tests.integration.mcp_long_tools import probe_release_key, runs_key
from tests.integration.test_mcp_door import TENANT_A, free_socket, served, tokens_setting
from tests.integration.test_mcp_tasks import (
    call_meta,
    client_of,
    get_task,
    start_task,
    task_result,
    text_of,
)
from toolfleet.app.mcp import DoorOptions, TaskLimits, create_app
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]

TOOLS = "tests.integration.mcp_long_tools:tools"
WORKERS = ("worker-0", "worker-1")
SESSION = uuid.uuid4().hex[:8]
"""Names this module's jobs, apart from any earlier session's in the same Redis."""

PROBING = "effect unknown: the reconciler is probing it"
DEFERRED = "handed over to another system: waiting for its completion"


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    with LocalFleet(settings, tools=TOOLS, workers=len(WORKERS)) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


@pytest.fixture(scope="module")
async def door(client: FleetClient, settings: Settings) -> AsyncIterator[str]:
    """The door over the fleet (which serves its tools by now), with test_mcp_door's tokens;
    its MCP endpoint's URL."""
    door_settings = settings.model_copy(update={"mcp_tokens": SecretStr(tokens_setting())})
    options = DoorOptions(task_limits=TaskLimits(recheck_s=0.2))
    async with served(create_app(door_settings, options), free_socket()) as base:
        yield f"{base}/mcp"


async def runs(redis: Redis, job: str) -> int:
    """How many times a tool reached its upstream for ``job``."""
    return int(await redis.get(runs_key(job)) or 0)


async def events_of(ledger: Ledger, task_id: str) -> list[dict[str, Any]]:
    """The audit chain of a task's call."""
    return await ledger.audit(TENANT_A, task_id, call_id_of(task_id))


async def test_a_task_whose_tool_stops_heartbeating_is_probed_and_ends_with_the_verdict(
    door: str, redis: Redis, settings: Settings
) -> None:
    job = f"report-{SESSION}"
    ledger = Ledger(redis, Keys.of(settings))
    async with client_of(door, "agent-a") as mcp:
        task = await start_task(mcp, "export_report", {"job": job})

        async def probing() -> bool:
            seen = await get_task(mcp, task.task_id)
            assert seen.status == "working", seen  # never an answer while the effect is open
            return (seen.status_message or "").startswith(PROBING)

        # The tool heartbeats once and hangs: 0.5 s later its heartbeat timeout stops it,
        # with its effect unknown, and the probe holds until the test saw the probing.
        await wait_for(probing, within=90)
        assert await runs(redis, job) == 1
        chain = await events_of(ledger, task.task_id)
        finished = next(e for e in chain if e["event"] == "finished")
        assert (finished["status"], finished["effect"]) == ("timed_out", "unknown"), chain
        call_id = call_id_of(task.task_id)
        entry = (await ledger.read(TENANT_A, task.task_id, [call_id]))[call_id]
        error = entry.outcome.error if entry.outcome is not None else None
        assert error is not None and error.type == "HeartbeatTimeoutError", entry.outcome
        assert error.message == HEARTBEAT_TIMEOUT.format(name="export_report", seconds=0.5)
        assert json.loads(entry.heartbeat_details or "null") == {"exported": job}

        await redis.set(probe_release_key(job), "1")  # the probe may answer now
        result = await task_result(mcp, task.task_id)
        done = await get_task(mcp, task.task_id)
    assert done.status == "completed", done
    assert result.is_error is False and text_of(result) == f"exported {job}"
    meta = call_meta(result)
    assert (meta["status"], meta["effect"], meta["resolved"]) == ("succeeded", "applied", True)
    assert meta["run_id"] == task.task_id
    assert await runs(redis, job) == 1  # probed, never run again
    events = [e["event"] for e in await events_of(ledger, task.task_id)]
    assert events.count("started") == 1 and any("probe" in e for e in events), events


async def test_a_deferred_task_is_completed_after_the_worker_that_started_it_exited(
    door: str, fleet: LocalFleet, redis: Redis, bus: KafkaBus, settings: Settings
) -> None:
    job = f"job-{SESSION}"
    ledger = Ledger(redis, Keys.of(settings))
    async with client_of(door, "agent-a") as mcp:
        task = await start_task(mcp, "dispatch_job", {"job": job})

        async def deferred() -> bool:
            seen = await get_task(mcp, task.task_id)
            assert seen.status == "working", seen
            return seen.status_message == DEFERRED

        await wait_for(deferred, within=90)
    handed = json.loads(await redis.get(handed_key(call_id_of(task.task_id))) or "{}")
    starter = next(n for n in WORKERS if fleet.pid(n) == handed["pid"])
    # SIGTERM: the worker exits cleanly, since it holds no call any more (the call's slot
    # was freed when it deferred). Waited for off the loop: the door serves from it.
    assert await asyncio.to_thread(fleet.terminate, starter) == 0
    assert not fleet.alive(starter)

    async with client_of(door, "agent-a") as mcp:
        waiting = await get_task(mcp, task.task_id)
    assert (waiting.status, waiting.status_message) == ("working", DEFERRED)

    # The external system finishes the job and completes the call with its signed handle;
    # the worker left in the pool takes the completion.
    done = CompletionMessage(
        tenant_id=TENANT_A, handle=handed["handle"], output=f"finished {job}",
        completed_by="job-runner",
    )  # fmt: skip
    await bus.publish_and_wait("completions", task.task_id, done)
    async with client_of(door, "agent-a") as fresh:
        result = await task_result(fresh, task.task_id)
        finished = await get_task(fresh, task.task_id)
    assert finished.status == "completed", finished
    assert result.is_error is False and text_of(result) == f"finished {job}"
    meta = call_meta(result)
    assert (meta["status"], meta["effect"]) == ("succeeded", "applied"), meta
    assert await runs(redis, job) == 1  # the job was handed over once
    events = [e["event"] for e in await events_of(ledger, task.task_id)]
    assert events.count("started") == 1 and events.count("completed") == 1, events
    assert events.index("deferred") < events.index("completed"), events
