"""Running one service as a process: logging, /metrics, topics, and a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Protocol

import uvloop

from toolfleet.logs import configure_logging
from toolfleet.metrics import serve_metrics
from toolfleet.settings import Settings
from toolfleet.topics import ensure_topics


class Service(Protocol):
    """What every long-running toolfleet service offers."""

    async def run(self) -> None:
        """Serve until ``stop`` is called."""

    def stop(self) -> None:
        """Ask ``run`` to finish its current work and return."""


def run_service(
    name: str,
    settings: Settings,
    make: Callable[[], Service],
    *,
    pools: tuple[str, ...] = ("default",),
) -> None:
    """Run a service in this process until SIGTERM or SIGINT, serving ``/metrics``."""
    configure_logging(name)
    serve_metrics(settings.metrics_port)
    # uvloop: the services spend their time in the event loop's own machinery (tasks,
    # futures, socket writes), which it runs several times faster than asyncio's.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_main(settings, make, pools))


async def _main(settings: Settings, make: Callable[[], Service], pools: tuple[str, ...]) -> None:
    await ensure_topics(settings, pools)
    service = make()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.stop)
    await service.run()
