"""Tools that run for hours, on a real fleet (``InProcessFleet``: Kafka, Redis, planner,
workers, aggregator, reconciler): a tool that stops heartbeating is stopped by its heartbeat
timeout, its effect is unknown and its probe settles it; a retry is given the heartbeat
details of the attempt before it; a call that waits past its schedule-to-start timeout behind
a full pool never starts. The upstream of each tool lives in this process and counts what it
did, so each test compares the fleet's record with the upstream's truth."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from redis.asyncio import Redis

from executors import Deferred, ProbeResult, ToolContext, ToolRegistry
from executors.worker import WorkerLimits
from kernel.adapters.redis import text
from kernel.settings import Settings
from kernel.stores.ledger import Ledger
from schemas import AgentRef, ModelResponseEvent
from tests.conftest import wait_for
from toolfleet.testing import InProcessFleet, LocalFleet

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]

TENANT = "long-running"


def one_call(tool: str, arguments: dict[str, Any]) -> ModelResponseEvent:
    """A model response with one call of ``tool``, in a run of its own."""
    run = f"run-{uuid.uuid4().hex[:12]}"
    return ModelResponseEvent(
        tenant_id=TENANT,
        run_id=run,
        turn_id=0,
        agent=AgentRef(name="clerk"),
        response_id=f"resp-{run}",
        items=[
            {"type": "function_call", "call_id": "c1", "name": tool,
             "arguments": json.dumps(arguments)}
        ],
    )  # fmt: skip


class Upstream:
    """What the upstream did: reports exported per idempotency key, bodies started per tool,
    the details each attempt was given, and a latch the blocking tool waits on."""

    def __init__(self) -> None:
        self.reports: dict[str, str] = {}
        self.started: Counter[str] = Counter()
        self.given: list[tuple[int, Any]] = []
        self.holding = asyncio.Event()
        self.release = asyncio.Event()


def registry(upstream: Upstream) -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool(effect="non_idempotent", heartbeat=0.5)
    async def export_report(ctx: ToolContext, rows: int) -> str:
        """Exports a report, then hangs before answering: it stops heartbeating."""
        upstream.started["export_report"] += 1
        upstream.reports[ctx.idempotency_key] = f"R-{len(upstream.reports) + 1}"
        await ctx.heartbeat({"rows_done": rows})
        await asyncio.Event().wait()  # a wedged connection: no heartbeat from here on
        return "never"

    @export_report.probe
    async def find_report(ctx: ToolContext) -> ProbeResult:
        report = upstream.reports.get(ctx.idempotency_key)
        if report is None:
            return ProbeResult.not_applied()
        return ProbeResult.applied(f"exported {report}")

    @tools.tool(effect="idempotent", heartbeat=5)
    async def sync_pages(ctx: ToolContext, pages: int) -> str:
        """Copies pages, resuming where an earlier attempt got to."""
        upstream.started["sync_pages"] += 1
        upstream.given.append((ctx.attempt, ctx.heartbeat_details))
        start = (ctx.heartbeat_details or {}).get("page", 0)
        for page in range(start, pages):
            await ctx.heartbeat({"page": page})
            if ctx.attempt == 1 and page == 3:
                raise ConnectionRefusedError("the target went away")  # never left: transient
        return f"synced pages {start}..{pages - 1} in attempt {ctx.attempt}"

    @tools.tool(effect="read_only")
    async def hold(ctx: ToolContext) -> str:
        """Takes the pool's only slot until the test lets it go."""
        upstream.holding.set()
        await upstream.release.wait()
        return "held"

    @tools.tool(effect="idempotent", schedule_to_start=0.5)
    async def quick(ctx: ToolContext) -> str:
        """Worth doing only soon after it was asked for."""
        upstream.started["quick"] += 1
        return "quick"

    @tools.tool(effect="idempotent", on_unknown="report_now")
    async def hand_over(ctx: ToolContext) -> Deferred:
        """Hands its work to an external system, to complete the call later."""
        upstream.started["hand_over"] += 1
        return Deferred(complete_within_s=600)

    return tools


async def _raw(redis: Redis, fleet: InProcessFleet, run_id: str) -> dict[str, str]:
    entry = await redis.hgetall(fleet.keys.call(TENANT, run_id, "c1"))
    return {text(k): text(v) for k, v in entry.items()}


async def test_a_tool_that_stops_heartbeating_is_stopped_and_its_probe_finds_the_effect(
    settings: Settings, redis: Redis
) -> None:
    upstream = Upstream()
    async with InProcessFleet(settings, registry(upstream)) as fleet:
        ledger = Ledger(redis, fleet.keys)
        event = one_call("export_report", {"rows": 1200})
        result = await fleet.client.run_turn(event, within=60)
        # The body was cancelled 0.5 s after its last heartbeat; it had exported the report,
        # so its probe finds it, and the model is given the probe's answer.
        (call,) = result.calls
        assert (call.status, call.effect) == ("succeeded", "applied"), call
        assert result.outputs[0].output == "exported R-1"
        assert upstream.started["export_report"] == 1  # never re-run blindly

        entry = (await ledger.read(TENANT, event.run_id, ["c1"]))["c1"]
        assert entry.heartbeat_details is not None
        assert json.loads(entry.heartbeat_details) == {"rows_done": 1200}
        chain = await ledger.audit(TENANT, event.run_id, "c1")
        finished = next(e for e in chain if e["event"] == "finished")
        assert (finished["status"], finished["effect"]) == ("timed_out", "unknown")
        assert any("probe" in e["event"] for e in chain), chain

        described = await asyncio.to_thread(_describe, fleet.settings, "export_report")
        assert "timeouts: schedule-to-start none, start-to-close none, heartbeat 0.5 s" in (
            described
        )
        rows = {line.strip().split(":")[0]: line.split(" | ") for line in described.splitlines()}
        assert rows["heartbeat timeout"][1:3] == ["unknown", "maybe"]
        assert rows["schedule-to-start timeout"][1:3] == ["not_executed", "no"]


def _describe(settings: Settings, tool: str) -> str:
    """``toolfleet tools describe TOOL`` on the fleet's namespace, as an operator runs it."""
    env = LocalFleet(settings, tools="tests.integration.fleet_tools:tools").env()
    done = subprocess.run(
        [sys.executable, "-m", "toolfleet", "tools", "describe", tool],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return done.stdout


async def test_a_retry_is_given_the_heartbeat_details_of_the_attempt_before_it(
    settings: Settings, redis: Redis
) -> None:
    upstream = Upstream()
    async with InProcessFleet(settings, registry(upstream)) as fleet:
        event = one_call("sync_pages", {"pages": 6})
        result = await fleet.client.run_turn(event, within=60)
        (call,) = result.calls
        assert (call.status, call.effect, call.attempts) == ("succeeded", "applied", 2), call
        assert result.outputs[0].output == "synced pages 3..5 in attempt 2"
        # Attempt 1 started from nothing; attempt 2 from attempt 1's last heartbeat.
        assert upstream.given == [(1, None), (2, {"page": 3})]
        raw = await _raw(redis, fleet, event.run_id)
        assert json.loads(raw["heartbeat"]) == {"page": 5}  # attempt 2's own, newest


async def test_a_call_past_its_schedule_to_start_behind_a_full_pool_never_starts(
    settings: Settings, redis: Redis
) -> None:
    upstream = Upstream()
    one_slot = WorkerLimits(per_worker=1)
    async with InProcessFleet(settings, registry(upstream), limits=one_slot) as fleet:
        ledger = Ledger(redis, fleet.keys)
        holding = one_call("hold", {})
        held = asyncio.create_task(fleet.client.run_turn(holding, within=60))
        async with asyncio.timeout(30):
            await upstream.holding.wait()  # the pool's one slot is taken
        late = one_call("quick", {})
        waiting = asyncio.create_task(fleet.client.run_turn(late, within=60))

        async def waited_past_its_schedule_to_start() -> bool:
            raw = await _raw(redis, fleet, late.run_id)
            issued = float(raw.get("dispatched_at") or "inf")
            return raw.get("state") == "dispatched" and time.time() > issued + 0.5

        await wait_for(waited_past_its_schedule_to_start, within=30)
        upstream.release.set()  # the slot frees: the command reaches a worker, too late
        assert (await held).calls[0].status == "succeeded"
        result = await waiting
        (call,) = result.calls
        assert (call.status, call.effect, call.started_at) == ("timed_out", "not_executed", None)
        assert result.outputs[0].output == (
            "Tool 'quick' was not started within 0.5 seconds of the call (its "
            "schedule-to-start timeout). It had no effect."
        )
        assert upstream.started["quick"] == 0
        raw = await _raw(redis, fleet, late.run_id)
        assert "started_at" not in raw  # the ledger never went started
        chain = await ledger.audit(TENANT, late.run_id, "c1")
        events = [e["event"] for e in chain]
        assert "started" not in events and "not_started_in_time" in events
        # In time, the same tool starts as usual.
        prompt = await fleet.client.run_turn(one_call("quick", {}), within=60)
        assert prompt.calls[0].status == "succeeded" and upstream.started["quick"] == 1
