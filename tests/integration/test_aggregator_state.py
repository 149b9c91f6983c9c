"""The aggregator's turn state on the real Redis: a plan and the outcomes right behind it."""

from __future__ import annotations

import uuid

import pytest
from redis.asyncio import Redis

from aggregator.service import Aggregator
from schemas import CallOutcome, PlannedCall, TurnPlan
from toolfleet.settings import Settings

pytestmark = pytest.mark.integration


def _plan(run_id: str) -> TurnPlan:
    calls = [
        PlannedCall(call_id=f"{run_id}-{i}", tool_name="add", index=i, arguments="{}",
                    disposition="dispatch")
        for i in range(2)
    ]  # fmt: skip
    return TurnPlan(
        tenant_id="t", run_id=run_id, turn_id=0, response_id="resp", agent_name="assistant",
        calls=calls, planned_at=1.0,
    )  # fmt: skip


def _outcome(run_id: str, i: int) -> CallOutcome:
    return CallOutcome(
        tenant_id="t", run_id=run_id, turn_id=0, call_id=f"{run_id}-{i}", tool_name="add",
        index=i, attempt=1, fencing_token=1, status="succeeded", effect="applied",
        output=f"out-{i}",
    )  # fmt: skip


async def test_a_plan_with_its_outcomes_in_one_update_emits_what_one_by_one_would(
    redis: Redis, settings: Settings
) -> None:
    aggregator = Aggregator(settings, redis)
    together, apart = f"run-{uuid.uuid4().hex}", f"run-{uuid.uuid4().hex}"
    # Outcomes finish out of model order; the result lists them in model order either way.
    emitted = await aggregator.on_outcomes(
        [(_outcome(together, 1), "o:1"), (_outcome(together, 0), "o:0")],
        plan=(_plan(together), "p:0"),
    )
    assert await aggregator.on_plan(_plan(apart), ["p:1"]) == []
    one_by_one = await aggregator.on_outcomes([(_outcome(apart, 1), "o:3")])
    one_by_one += await aggregator.on_outcomes([(_outcome(apart, 0), "o:2")])
    assert len(emitted) == len(one_by_one) == 1
    result, expected = emitted[0][0], one_by_one[0][0]
    assert result.status == expected.status == "completed"
    assert [o.output for o in result.outputs] == [o.output for o in expected.outputs]
    assert [o.output for o in result.outputs] == ["out-0", "out-1"]
    assert [c.status for c in result.calls] == [c.status for c in expected.calls]
    # The run's turn is listed for cancellations, written in the same round trip.
    assert await redis.smembers(aggregator.keys.turns("t", together)) == {b"0"}
    # A redelivered batch (its transaction never committed) emits again; a duplicate not.
    again = await aggregator.on_outcomes(
        [(_outcome(together, 0), "o:0")], plan=(_plan(together), "p:0")
    )
    assert [r.status for r, _ in again] == ["completed"]
    late = await aggregator.on_outcomes([(_outcome(together, 1), "o:9")])
    assert late == []
