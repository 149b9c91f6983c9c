"""A tool's exception on a real worker: one log line per call with its traceback, up to the
per-tool limit, never an argument value; and the call's ledger entry keeps type, message and
traceback for the console's call view (on a single Redis and on a Redis Cluster: both passes).

Seen before: a tool that raised ValueError on 59 calls left no log line anywhere, and its
traceback was lost.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from kernel.settings import Settings
from kernel.tools._failures import TRACEBACK_MAX_BYTES, TRACEBACKS_PER_TOOL
from tests.integration.test_pipeline import turn
from toolfleet.app import operations
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client

pytestmark = [pytest.mark.integration]

DEFAULT_ERROR = "An error occurred while running the tool. Please try again."


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    with LocalFleet(settings, tools="tests.integration.fleet_tools:tools", workers=1) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


async def test_a_tool_raising_on_many_calls_logs_each_with_its_traceback_up_to_the_limit(
    fleet: LocalFleet, client: FleetClient, settings: Settings, redis: Redis
) -> None:
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
        assert len(failure["traceback"].encode()) <= TRACEBACK_MAX_BYTES
        assert (failure["attempt"], failure["worker_id"] is not None) == (1, True)
        assert not [s for s in secrets if s in json.dumps(view.fields, default=str)]


async def test_a_call_that_succeeds_keeps_no_failure(
    client: FleetClient, settings: Settings, redis: Redis
) -> None:
    event = turn(("a", "add", {"a": 2, "b": 2}))
    result = await client.run_turn(event, within=60)
    assert [o.output for o in result.outputs] == ["4"]
    call = event.function_calls[0].call_id
    view = await operations.read_call(redis, settings, "acme", event.run_id, call)
    assert view.fields["failure"] is None
