"""An InProcessFleet shares its event loop, and so the ``asyncio`` module, with the tests it
serves: a test may monkeypatch ``asyncio.wait_for`` (the Agents SDK's own suite does, to fire a
tool's deadline at once) while the fleet's background loops run. Those loops must come out of
it as they went in; a background task that dies anyway must stop its service loudly, never
leave it half-alive.

What each test shows is observed where the fleet keeps it: the workers' capacity registrations
in Redis (``{adm}:workers``), a turn's result, ``fleet.check()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from redis.asyncio import Redis

from executors import ToolRegistry
from executors.worker import Worker
from kernel.adapters.redis import text
from kernel.errors import UnavailableError
from kernel.settings import Settings
from schemas import AgentRef, ModelResponseEvent
from tests.conftest import wait_for
from toolfleet.testing import InProcessFleet

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]

TENANT = "patched"
TTL_S = 3.0
"""The workers' capacity TTL here: they register every second (a third of it)."""

tools = ToolRegistry()


@tools.tool(effect="read_only")
async def echo(text: str) -> str:
    """Says it back."""
    return text


def turn() -> ModelResponseEvent:
    """A model response with one call of ``echo``, in a run of its own."""
    run = f"run-{uuid.uuid4().hex[:12]}"
    return ModelResponseEvent(
        tenant_id=TENANT,
        run_id=run,
        turn_id=0,
        agent=AgentRef(name="tester"),
        response_id=f"resp-{run}",
        items=[
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "echo",
                "arguments": json.dumps({"text": "still here"}),
            }
        ],
    )


@pytest.fixture
async def fleet(settings: Settings) -> AsyncIterator[InProcessFleet]:
    """Two workers whose capacity lives TTL_S after they last registered it."""
    quick = settings.model_copy(update={"worker_capacity_ttl_s": TTL_S})
    async with InProcessFleet(quick, echo, workers=2) as running:
        yield running


async def registered_at(fleet: InProcessFleet, redis: Redis) -> dict[str, float]:
    """When each worker of the fleet last registered its capacity (its entry's expiry less
    the TTL), by worker."""
    entries = await redis.zrange(fleet.keys.admission("workers"), 0, -1, withscores=True)
    return {text(member): float(score) - TTL_S for member, score in cast(list[Any], entries)}


async def test_workers_keep_their_capacity_through_a_patched_asyncio_wait_for(
    fleet: InProcessFleet, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK's test_runner_validates_only_user_output_after_late_tool_timeout, as written:
    # its wait_for never times out. A loop that waited through it would wait for good.
    async def wait_for_after_task_finishes(
        future: asyncio.Future[Any],
        timeout: float | None = None,  # noqa: ASYNC109 - asyncio.wait_for's own signature
    ) -> Any:
        await future
        raise TimeoutError  # the SDK's test raises asyncio.TimeoutError: the same class

    async def both_registered() -> set[str]:
        at = await registered_at(fleet, redis)
        return set(at) if len(at) == 2 else set()

    workers = await wait_for(both_registered)
    patched_at = time.time()
    with monkeypatch.context() as patch:
        patch.setattr(asyncio, "wait_for", wait_for_after_task_finishes)

        # Every worker registers again a period and a half after the patch: a registrar
        # that went into the patched wait_for would have registered once at most.
        async def registered_through_it() -> bool:
            at = await registered_at(fleet, redis)
            return set(at) == workers and min(at.values()) > patched_at + 1.5 * TTL_S / 3

        await wait_for(registered_through_it, within=5 * TTL_S)

    # Well past the TTL of a registration made during the patch: calls are still admitted.
    async def registered_since() -> bool:
        at = await registered_at(fleet, redis)
        return set(at) == workers and min(at.values()) > patched_at + 1.5 * TTL_S

    await wait_for(registered_since, within=5 * TTL_S)
    result = await fleet.client.run_turn(turn(), within=30)
    assert result.status == "completed"
    assert [o.output for o in result.outputs] == ["still here"]
    fleet.check()


async def test_a_worker_that_loses_a_background_loop_stops_and_the_fleet_says_why(
    settings: Settings, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whatever ends it (a bug; a patch no loop survives), a worker that lost its lease
    # renewal would let its calls' leases lapse while they run: it must not go on that way.
    broken = asyncio.Event()

    async def renewal_that_breaks(self: Worker) -> None:
        await broken.wait()
        raise RuntimeError("lease renewal broke")

    monkeypatch.setattr(Worker, "_renew_leases", renewal_that_breaks)
    quick = settings.model_copy(update={"worker_capacity_ttl_s": TTL_S})
    fleet = InProcessFleet(quick, echo, workers=1)
    await fleet.start()
    try:
        result = await fleet.client.run_turn(turn(), within=30)
        assert result.status == "completed"
        fleet.check()

        broken.set()

        async def said() -> UnavailableError | None:
            try:
                fleet.check()
            except UnavailableError as error:
                return error
            return None

        error = await wait_for(said, within=10)
        assert error is not None
        assert "worker-0 lost its lease renewal" in str(error)
        assert isinstance(error.__cause__, RuntimeError)
        assert str(error.__cause__) == "lease renewal broke"

        # The worker stopped: its slots left the pool's capacity at once (no half-alive
        # worker whose calls' leases lapse).
        async def unregistered() -> bool:
            return await registered_at(fleet, redis) == {}

        await wait_for(unregistered, within=10)
    except BaseException:
        with contextlib.suppress(Exception):  # the test's own failure comes first
            await fleet.stop()
        raise
    with pytest.raises(UnavailableError, match="worker-0 stopped on an error") as stopped:
        await fleet.stop()
    assert isinstance(stopped.value.__cause__, RuntimeError)
