"""A worker's log lines about a call carry its tenant, run, call and tool (JSON lines)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import pytest

from kernel.settings import Settings
from tests.integration.test_pipeline import turn
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]


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
