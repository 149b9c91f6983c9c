"""Progress, exactly once, on a fleet of processes: a tool's reports reach
``FleetClient.progress`` in order; duplicates on the topic are not shown again; a worker
SIGKILLed mid-call leaves its attempt's events, and the fleet's retry shows its own, told apart
by their attempt, with no (attempt, sequence) shown twice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from kernel.adapters.bus import KafkaBus
from kernel.settings import Settings
from schemas import ProgressEvent
from tests.conftest import wait_for
from tests.integration.progress_tools import ack_key, holder_key
from tests.integration.test_pipeline import turn
from toolfleet.client import FleetClient, RunProgress
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = pytest.mark.integration

TOOLS = "tests.integration.progress_tools:tools"
WORKERS = 2
ENV = {"TOOLFLEET_PROGRESS_MIN_INTERVAL_S": "0"}  # lockstep: every report is an event anyway


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    # A short lease: a killed worker's call is found lost soon after its group session ends.
    args = ["--lease-s", "2"]
    with LocalFleet(
        settings, tools=TOOLS, workers=WORKERS, worker_args=args, extra_env=ENV
    ) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


class Shown:
    """What a reader of ``FleetClient.progress`` is shown, acknowledging each step to the
    lockstep tool once it was shown."""

    def __init__(self, stream: RunProgress, redis: Redis) -> None:
        self.events: list[ProgressEvent] = []
        self._stream = stream
        self._redis = redis
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for event in self._stream:
            self.events.append(event)
            await self._redis.set(ack_key(event.call_id, event.attempt, int(event.done)), 1)

    @property
    def positions(self) -> list[tuple[int, int]]:
        """(attempt, sequence) of every event shown, in the order shown."""
        return [(e.attempt, e.sequence) for e in self.events]

    async def has(self, position: tuple[int, int]) -> bool:
        """Whether the event at ``position`` was shown (a wait_for probe)."""
        return position in self.positions

    async def stop(self) -> None:
        self._stream.close()
        await self._task


async def test_progress_reaches_the_client_in_order_and_a_duplicate_is_not_shown_again(
    fleet: LocalFleet, client: FleetClient, redis: Redis, bus: KafkaBus
) -> None:
    event = turn(("c", "lockstep", {"steps": 4}))
    call_id = event.function_calls[0].call_id
    async with client.progress(event.run_id, tenant_id="acme") as stream:
        shown = Shown(stream, redis)
        await client.submit(event)
        result = await result_of(fleet, client, event.run_id, within=60)
        assert result.status == "completed", result.model_dump_json()
        await wait_for(lambda: shown.has((1, 4)))
        assert shown.positions == [(1, 1), (1, 2), (1, 3), (1, 4)]
        assert [(e.done, e.total, e.message) for e in shown.events] == [
            (float(n), 4.0, f"step {n} of 4") for n in range(1, 5)
        ]
        assert {(e.tenant_id, e.run_id, e.call_id, e.tool_name) for e in shown.events} == {
            ("acme", event.run_id, call_id, "lockstep")
        }
        # The same four records again on the topic (a producer's retry, a replayed
        # partition), then one new event behind them on the run's partition.
        for again in shown.events[:]:
            await bus.publish_and_wait("progress", event.run_id, again)
        later = shown.events[-1].model_copy(update={"sequence": 5, "done": 5.0})
        await bus.publish_and_wait("progress", event.run_id, later)
        await wait_for(lambda: shown.has((1, 5)))
        await shown.stop()
    assert shown.positions == [(1, 1), (1, 2), (1, 3), (1, 4), (1, 5)]


async def test_a_worker_killed_mid_call_its_retry_is_told_apart_and_nothing_shows_twice(
    fleet: LocalFleet, client: FleetClient, redis: Redis, bus: KafkaBus
) -> None:
    event = turn(("c", "lockstep", {"steps": 4, "stall_after": 2}))
    call_id = event.function_calls[0].call_id
    async with client.progress(event.run_id, tenant_id="acme") as stream:
        shown = Shown(stream, redis)
        await client.submit(event)
        await wait_for(lambda: shown.has((1, 2)), within=60)
        # Attempt 1 holds the call after its second step: kill the worker running it.
        holder = await redis.get(holder_key(call_id))
        assert isinstance(holder, bytes), holder
        victim_pid = int(holder.decode().rsplit("-", 1)[1])
        victim = next(
            f"worker-{n}" for n in range(WORKERS) if fleet.pid(f"worker-{n}") == victim_pid
        )
        fleet.kill(victim)
        fleet.start_worker(int(victim.rsplit("-", 1)[1]))

        # The call was lost with its worker; idempotent without a probe, the fleet runs it
        # again (attempt 2, same idempotency key), and the turn completes.
        result = await result_of(fleet, client, event.run_id, within=120)
        assert result.status == "completed", result.model_dump_json()
        (record,) = result.calls
        assert (record.status, record.effect, record.attempts) == ("succeeded", "applied", 2)
        await wait_for(lambda: shown.has((2, 4)))
        # Attempt 2 counts from 1 again and is shown: told apart by its attempt.
        assert shown.positions == [(1, 1), (1, 2), (2, 1), (2, 2), (2, 3), (2, 4)]
        assert [e.done for e in shown.events] == [1.0, 2.0, 1.0, 2.0, 3.0, 4.0]

        # Attempt 1's events arriving late (a replayed partition) are not shown again, nor is
        # a duplicate of attempt 2's; a new event behind them is.
        for late in shown.events[:]:
            await bus.publish_and_wait("progress", event.run_id, late)
        newer = shown.events[-1].model_copy(update={"sequence": 5, "done": 5.0})
        await bus.publish_and_wait("progress", event.run_id, newer)
        await wait_for(lambda: shown.has((2, 5)))
        await shown.stop()
    assert shown.positions == [(1, 1), (1, 2), (2, 1), (2, 2), (2, 3), (2, 4), (2, 5)]
    assert len(set(shown.positions)) == len(shown.positions)
