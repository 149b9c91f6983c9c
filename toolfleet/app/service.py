"""Running one service as a process: logging, /metrics, topics, and a clean stop on SIGTERM.

The application builds each service's Kafka bus and Redis connection from ``Settings`` and
hands them in (``make(bus, stores)``: the stores over that connection, ``kernel.stores.door``);
a service never builds its own connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Callable
from typing import Protocol

import uvloop

from kernel.adapters.backoff import DEPENDENCY, Interrupted, nap, retrying
from kernel.adapters.bus import TRANSIENT_ERRORS, Bus, KafkaBus
from kernel.adapters.dependencies import (
    DEPENDENCIES,
    DependencyUnavailable,
    Probes,
    StartRefused,
    check_dependencies,
    what_was_seen,
)
from kernel.adapters.health import HEALTH, watch
from kernel.adapters.lag import LAG
from kernel.adapters.logs import configure_logging
from kernel.adapters.metrics import configure_metrics, serve_metrics
from kernel.adapters.redis import connect_redis
from kernel.adapters.security import explain_connection_error, refused
from kernel.adapters.topics import TopicsMissingError, ensure_topics
from kernel.adapters.tracing import configure_tracing
from kernel.errors import ConfigurationError, CutOffError, InfrastructureError
from kernel.settings import Settings
from kernel.stores.door import Stores

log = logging.getLogger(__name__)

TOPICS_RECHECK_S = 5.0
"""How often a service that waits for its topics looks again."""

_UNREACHABLE: tuple[type[BaseException], ...] = (*TRANSIENT_ERRORS, OSError)


class Service(Protocol):
    """What every long-running toolfleet service offers."""

    async def run(self) -> None:
        """Serve until ``stop`` is called."""

    def stop(self) -> None:
        """Ask ``run`` to finish its current work and return."""


def run_service(
    name: str,
    settings: Settings,
    make: Callable[[Bus, Stores], Service],
    *,
    pools: tuple[str, ...] = ("default",),
) -> None:
    """Run a service in this process until SIGTERM or SIGINT, serving ``/metrics``.

    ``make(bus, stores)`` builds the service over connections made for it; after a cut-off or
    an outage at start it is built again over fresh ones. Kafka and Redis are checked first:
    while one does not answer, the service says so once and waits (backoff); when one refuses
    it (credentials, a certificate, a cluster node named as one server) it says what to change
    and exits with status 78 (EX_CONFIG).
    """
    configure_logging(name, settings.log_level)
    DEPENDENCIES.configure(settings)
    tracing = configure_tracing(name, settings)
    configure_metrics(name, tool_label=settings.metrics_tool_label)
    serve_metrics(settings.metrics_port)
    # uvloop: the services spend their time in the event loop's own machinery (tasks,
    # futures, socket writes), which it runs several times faster than asyncio's.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        try:
            runner.run(_main(name, settings, make, pools))
        except StartRefused:
            raise SystemExit(EXIT_CONFIG) from None  # the monitor said why, in one line
        except (ConfigurationError, InfrastructureError) as exc:
            log.error("cannot start: %s", exc)
            raise SystemExit(EXIT_CONFIG) from None
        finally:
            if tracing is not None:
                tracing.shutdown()  # exports the spans still queued


EXIT_CONFIG = 78
"""The exit status of a service whose configuration cannot work (sysexits' EX_CONFIG)."""


async def _main(
    name: str, settings: Settings, make: Callable[[Bus, Stores], Service], pools: tuple[str, ...]
) -> None:
    tune_gc(settings.gc_thresholds)
    stopping = asyncio.Event()
    current: list[Service] = []

    def stop() -> None:
        HEALTH.set("serving", False)  # /readyz: 503 at once, so no new traffic is routed here
        stopping.set()
        for service in current:
            service.stop()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    probes = Probes(settings)
    DEPENDENCIES.watching = True  # aiokafka's and redis-py's records become check details
    started = asyncio.Event()

    def report(check: str, error: BaseException | None) -> None:
        # The start-up check speaks first (it may refuse to start); then the watcher.
        if started.is_set() and check in ("kafka", "redis"):
            DEPENDENCIES.checked(check, error)  # type: ignore[arg-type]

    watcher = asyncio.create_task(
        watch(
            {"kafka": probes.kafka, "redis": probes.redis},
            report=report,
            nudged=DEPENDENCIES.nudged(),
        )
    )
    lag = asyncio.create_task(LAG.run())  # toolfleet_consumer_lag of every consumer made
    try:
        await _serve(
            name, settings, make, pools=pools, stopping=stopping, current=current, started=started
        )
    finally:
        DEPENDENCIES.watching = False
        watcher.cancel()
        lag.cancel()
        await probes.close()


async def _serve(
    name: str,
    settings: Settings,
    make: Callable[[Bus, Stores], Service],
    *,
    pools: tuple[str, ...],
    stopping: asyncio.Event,
    current: list[Service],
    started: asyncio.Event,
) -> None:
    """Build the service and run it; after a cut-off or an outage, build it again."""
    cut_off = False
    failures = 0
    while not stopping.is_set():
        HEALTH.set("assigned", False)
        HEALTH.set("serving", True)
        try:
            await wait_until_reachable(settings, stopping, started=started)
            if stopping.is_set():
                return
            if cut_off:
                log.warning("Kafka and Redis reachable again: rejoining")
                cut_off = False
            await ensure_topics(settings, pools)
            redis = connect_redis(settings)
            began = time.monotonic()
            try:
                stores = Stores(redis, settings)
                # State of a version this release does not read stops it before it reads any.
                await stores.schema().check_start(name)
                current[:] = [make(KafkaBus(settings, service=name), stores)]
                await current[0].run()
            finally:
                await redis.aclose()
                if time.monotonic() - began > RAN_WELL_S:
                    failures = 0
            return
        except CutOffError as exc:
            # The service closed its consumers on the way out: the group has rebalanced and
            # healthy peers own its partitions. Come back once both dependencies answer.
            log.error("cut off, giving up its partitions: %s", exc)
            cut_off = True
            continue
        except TopicsMissingError as exc:
            # Topics are created on purpose in this deployment: wait for them (not ready
            # meanwhile), saying which ones and how, rather than restarting in a loop.
            log.error("%s", exc)
            with contextlib.suppress(Interrupted):
                await nap(TOPICS_RECHECK_S, until=stopping)
            continue
        except StartRefused:
            raise
        except Exception as exc:
            if refused(exc):
                # Credentials or TLS: waiting does not fix them. Say which connection and why.
                raise explain_connection_error(exc, settings) from exc
            if not isinstance(exc, _UNREACHABLE):
                raise
            # Kafka or Redis went away while the service started or ran: the dependency
            # monitor says which (once); the next round waits for both, with backoff.
            DEPENDENCIES.failed(exc)
            failures += 1
            if failures == 1:  # once: an outage's own line comes from the monitor
                log.warning(
                    "stopped by Kafka or Redis (%s); starting again once both answer",
                    what_was_seen(exc),
                )
            else:
                log.debug("stopped again", extra={"error": repr(exc)})
        with contextlib.suppress(Interrupted):
            await nap(DEPENDENCY.delay(failures), until=stopping, wake=DEPENDENCIES.back)


RAN_WELL_S = 60.0
"""A service that ran this long before an outage stopped it starts again at once (its
backoff starts over)."""


async def wait_until_reachable(
    settings: Settings, stopping: asyncio.Event, *, started: asyncio.Event | None = None
) -> None:
    """Return once Kafka and Redis both answer (or ``stopping`` is set), checking with the
    project's dependency backoff; the monitor says once which one is away and why.

    Raises ``StartRefused`` when one refuses this process (said once, in one line).
    """
    attempts = retrying(DEPENDENCY, DependencyUnavailable, until=stopping, wake=DEPENDENCIES.back)
    try:
        async for attempt in attempts:
            with attempt:
                try:
                    await check_dependencies(settings, DEPENDENCIES)
                finally:
                    if started is not None:
                        started.set()
    except Interrupted:
        return


def tune_gc(thresholds: tuple[int, int, int]) -> None:
    """Collect garbage the way a long-running, allocation-heavy service wants it.

    Everything allocated so far (modules, classes, the service itself) is frozen out of the
    collector's view: it lives as long as the process and would be traversed by every full
    collection. Reference counting frees almost everything at once; the collector is only
    needed for cycles, so it can run far less often than CPython's default, which is tuned
    for small heaps: a worker with 1,600 calls in flight spent 43% of its CPU collecting.
    """
    gc.freeze()
    gc.set_threshold(*thresholds)
