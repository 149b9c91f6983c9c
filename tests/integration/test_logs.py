"""A worker's log lines about a call carry its tenant, run, call and tool (JSON lines); a
tool's exception is logged with its traceback and kept with the call."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from kernel.settings import Settings
from kernel.tools._failures import TRACEBACKS_PER_TOOL
from tests.integration.test_pipeline import turn
from toolfleet.app import operations
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]

DEFAULT_ERROR = "An error occurred while running the tool. Please try again."


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    with LocalFleet(settings, tools="tests.integration.fleet_tools:tools", workers=1) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


async def test_a_tools_own_log_line_carries_the_calls_ids_and_no_argument(
    fleet: LocalFleet, client: FleetClient
) -> None:
    event = turn(("c", "chatty", {"secret": "hunter2"}))
    result = await client.run_turn(event, within=60)
    assert [o.output for o in result.outputs] == ["said"]
    lines = [json.loads(line) for line in fleet.logs("worker-0").splitlines()
             if line.startswith("{")]  # fmt: skip
    (line,) = [entry for entry in lines if entry.get("msg") == "chatty ran"]
    assert {k: line.get(k) for k in ("tenant_id", "run_id", "call_id", "tool")} == {
        "tenant_id": event.tenant_id,
        "run_id": event.run_id,
        "call_id": event.function_calls[0].call_id,
        "tool": "chatty",
    }
    assert "hunter2" not in fleet.logs("worker-0")


async def test_a_tool_raising_on_many_calls_logs_each_with_its_traceback_up_to_the_limit(
    fleet: LocalFleet, client: FleetClient, settings: Settings, redis: Redis
) -> None:
    # The last release left no line anywhere for a tool that raised ValueError on 59 calls.
    secrets = [f"city-{uuid.uuid4().hex[:12]}" for _ in range(TRACEBACKS_PER_TOOL + 5)]
    event = turn(*((f"c{i}", "boom", {"message": s}) for i, s in enumerate(secrets)))
    result = await client.run_turn(event, within=60)
    assert [o.output for o in result.outputs] == [DEFAULT_ERROR] * len(secrets)
    log = fleet.logs("worker-0")
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    raised = [e for e in lines if e.get("msg") == "tool boom raised ValueError: <argument>"]
    # One line per call, each with its traceback and the call's ids, up to the per-tool limit
    # (the rest are counted in one line when the minute ends).
    assert len(raised) == TRACEBACKS_PER_TOOL
    calls = {c.call_id for c in event.function_calls}
    assert len({e["call_id"] for e in raised}) == TRACEBACKS_PER_TOOL
    for entry in raised:
        assert entry["call_id"] in calls and entry["run_id"] == event.run_id
        assert entry["level"] == "error" and entry["tool"] == "boom"
        assert entry["exc"].startswith("Traceback (most recent call last):")
        assert "in boom" in entry["exc"] and entry["exc"].endswith("ValueError: <argument>\n")
    assert not [s for s in secrets if s in log]  # argument values are never logged
    # Every call keeps what it raised, for the console's call view.
    for call in event.function_calls:
        view = await operations.read_call(redis, settings, "acme", event.run_id, call.call_id)
        failure = view.fields["failure"]
        assert failure["type"] == "ValueError" and failure["message"] == "<argument>"
        assert failure["traceback"].startswith("Traceback (most recent call last):")
        assert "raise ValueError(message)" in failure["traceback"]
        assert len(failure["traceback"].encode()) <= 8192
        assert (failure["attempt"], failure["worker_id"] is not None) == (1, True)
        assert not [s for s in secrets if s in json.dumps(view.fields, default=str)]
