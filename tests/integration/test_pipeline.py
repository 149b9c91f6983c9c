"""End to end through the real broker: planner, aggregator and two worker processes."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from kernel.settings import Settings
from schemas import ModelResponseEvent, TurnResult
from tests.conftest import wait_for
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client

pytestmark = pytest.mark.integration

TOOLS = "tests.integration.fleet_tools:tools"


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    with LocalFleet(settings, tools=TOOLS, workers=2) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


def turn(
    *calls: tuple[str, str, Any], run_id: str | None = None, **config: Any
) -> ModelResponseEvent:
    """A model response with one function call per (call_id, tool, arguments)."""
    run = run_id or f"run-{uuid.uuid4().hex[:10]}"
    items = [
        {
            "type": "function_call",
            "call_id": f"{run}-{cid}" if cid else "",
            "name": name,
            "arguments": args if isinstance(args, str) else json.dumps(args),
        }
        for cid, name, args in calls
    ]
    return ModelResponseEvent.model_validate(
        {
            "tenant_id": "acme",
            "run_id": run,
            "turn_id": 0,
            "agent": {"name": "assistant"},
            "response_id": f"resp-{uuid.uuid4().hex[:8]}",
            "items": items,
            "config": config,
        }
    )


def outputs(result: TurnResult) -> list[tuple[str, str]]:
    """(call_id suffix, output) in the order the result lists them."""
    return [(o.call_id.rsplit("-", 1)[-1], o.output) for o in result.outputs]


async def test_outputs_come_back_in_model_order_whatever_the_finish_order(
    client: FleetClient,
) -> None:
    event = turn(
        ("a", "sleep_then_echo", {"text": "first", "ms": 400}),
        ("b", "sleep_then_echo", {"text": "second", "ms": 0}),
        ("c", "sleep_then_echo", {"text": "third", "ms": 200}),
    )
    result = await client.run_turn(event)
    assert result.status == "completed"
    assert outputs(result) == [("a", "first"), ("b", "second"), ("c", "third")]
    assert [c.effect for c in result.calls] == ["applied"] * 3
    assert result.next_tool_choice == "auto"


async def test_a_failed_call_never_discards_a_siblings_output(client: FleetClient) -> None:
    event = turn(("a", "boom", {"message": "x"}), ("b", "add", {"a": 2, "b": 3}))
    result = await client.run_turn(event)
    assert result.status == "completed"
    assert outputs(result) == [
        ("a", "An error occurred while running the tool. Please try again."),
        ("b", "5"),
    ]


async def test_two_runs_of_one_tenant_both_run_their_own_call_0(client: FleetClient) -> None:
    def numbered(a: int, b: int) -> ModelResponseEvent:
        run = f"run-{uuid.uuid4().hex[:10]}"
        return ModelResponseEvent.model_validate({
            "tenant_id": "acme", "run_id": run, "turn_id": 0, "agent": {"name": "assistant"},
            "response_id": f"resp-{run}",
            "items": [{"type": "function_call", "call_id": "call_0", "name": "add",
                       "arguments": json.dumps({"a": a, "b": b})}],
        })  # fmt: skip

    first, second = await asyncio.gather(
        client.run_turn(numbered(1, 2)), client.run_turn(numbered(5, 5))
    )
    assert (first.status, second.status) == ("completed", "completed")
    assert [o.output for o in first.outputs] == ["3"]
    assert [o.output for o in second.outputs] == ["10"]


# --- results reach the one who asked ----------------------------------------------------------
def _empty_turn() -> ModelResponseEvent:
    return turn()


async def test_a_client_that_submitted_nothing_decodes_and_keeps_no_results(
    client: FleetClient, settings: Settings
) -> None:
    async with FleetClient(settings) as idle:
        events = [_empty_turn() for _ in range(1_000)]
        results = await asyncio.gather(*(client.run_turn(e, within=120) for e in events))
        assert [r.run_id for r in results] == [e.run_id for e in events]

        async def read_everything() -> bool:
            return await idle.lag() == 0

        await wait_for(read_everything, within=60)
        # It read every record of turn-results, and decoded and kept none of them.
        assert idle.decoded == 0
        assert idle.held() == (0, 0)
    assert client.held() == (0, 0)  # the busy client handed each result out and kept none


async def test_a_result_nobody_claims_is_dropped_after_the_window(settings: Settings) -> None:
    brief = settings.model_copy(update={"client_result_window_s": 2.0})
    async with FleetClient(brief) as submitter:
        await submitter.submit(_empty_turn())

        async def arrived() -> bool:
            return submitter.held() == (1, 1)

        async def dropped() -> bool:
            return submitter.held() == (0, 0)

        await wait_for(arrived, within=30, interval=0.01)
        await wait_for(dropped, within=30)
        assert submitter.decoded == 1
