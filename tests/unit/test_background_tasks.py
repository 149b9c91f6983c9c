"""A service's background loops (kernel.adapters.background): one that ends while the service
runs stops the service and is raised from its ``run``; ending because the service stops is
no failure."""

from __future__ import annotations

import asyncio
import logging

import pytest

from kernel.adapters.background import BackgroundTaskEnded, BackgroundTasks


class Service:
    """Stands for a service: what ``stop`` was asked, and its stopping event."""

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self.stops = 0

    def stop(self) -> None:
        self.stops += 1
        self.stopping.set()


async def test_a_loop_that_raises_stops_the_service_and_its_error_is_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = Service()
    background = BackgroundTasks("worker w1", service.stop, stopping=service.stopping)
    broken = asyncio.Event()

    async def registration() -> None:
        await broken.wait()
        raise RuntimeError("registration broke")

    async def renewal() -> None:
        await asyncio.Event().wait()

    background.start("capacity registration", registration())
    renewal_task = background.start("lease renewal", renewal())
    assert background.failure is None
    with caplog.at_level(logging.ERROR, logger="kernel.adapters.background"):
        broken.set()
        await service.stopping.wait()  # set by the failure, through the service's stop

    assert service.stops == 1
    assert background.failure is not None
    name, error = background.failure
    assert name == "capacity registration"
    assert isinstance(error, RuntimeError) and str(error) == "registration broke"
    assert any("worker w1's capacity registration" in n for n in error.__notes__)
    [record] = caplog.records
    assert record.getMessage() == (
        "worker w1's capacity registration ended; stopping the worker w1"
    )
    assert record.exc_info is not None and record.exc_info[1] is error

    await background.close()
    assert renewal_task.cancelled()
    with pytest.raises(RuntimeError, match="registration broke"):
        background.raise_failure()


async def test_a_loop_that_returns_while_the_service_runs_is_a_failure_too() -> None:
    service = Service()
    background = BackgroundTasks("planner", service.stop)

    async def tick() -> None:
        return None

    background.start("admission tick", tick())
    await service.stopping.wait()
    await background.close()
    with pytest.raises(BackgroundTaskEnded, match="planner's admission tick returned"):
        background.raise_failure()


async def test_ending_because_the_service_stops_or_cancelled_on_close_is_no_failure() -> None:
    service = Service()
    background = BackgroundTasks("reconciler", service.stop, stopping=service.stopping)

    async def tick() -> None:
        await service.stopping.wait()  # returns once its service stops

    async def forever() -> None:
        await asyncio.Event().wait()

    ticking = background.start("tick", tick())
    waiting = background.start("listener", forever())
    service.stop()
    await asyncio.wait([ticking])
    await background.close()

    assert ticking.done() and not ticking.cancelled()
    assert waiting.cancelled()
    assert background.failure is None
    assert service.stops == 1  # its own stop, not one asked by a failure
    background.raise_failure()  # nothing to raise
