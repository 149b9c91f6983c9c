"""Running one service as a process: logging, /metrics, topics, and a clean stop on SIGTERM.

The application builds each service's Kafka bus and Redis connection from ``Settings`` and
hands them in (``make(bus, redis)``); a service never builds its own connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Callable
from typing import Protocol

import uvloop
from aiokafka.admin import AIOKafkaAdminClient
from redis.asyncio import Redis

from kernel.adapters.bus import TRANSIENT_ERRORS, Bus, KafkaBus
from kernel.adapters.health import HEALTH, watch
from kernel.adapters.lag import LAG
from kernel.adapters.logs import configure_logging
from kernel.adapters.metrics import configure_metrics, serve_metrics
from kernel.adapters.redis import connect_redis
from kernel.adapters.security import explain_connection_error, kafka_options, refused
from kernel.adapters.topics import TopicsMissingError, ensure_topics
from kernel.adapters.tracing import configure_tracing
from kernel.errors import CutOffError, InfrastructureError
from kernel.settings import Settings

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
    make: Callable[[Bus, Redis], Service],
    *,
    pools: tuple[str, ...] = ("default",),
) -> None:
    """Run a service in this process until SIGTERM or SIGINT, serving ``/metrics``.

    ``make(bus, redis)`` builds the service over connections made for it; after a cut-off or
    an outage at start it is built again over fresh ones.
    """
    configure_logging(name, settings.log_level)
    tracing = configure_tracing(name, settings)
    configure_metrics(name, tool_label=settings.metrics_tool_label)
    serve_metrics(settings.metrics_port)
    # uvloop: the services spend their time in the event loop's own machinery (tasks,
    # futures, socket writes), which it runs several times faster than asyncio's.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        try:
            runner.run(_main(name, settings, make, pools))
        except InfrastructureError as exc:
            log.error("cannot start: %s", exc)
            raise SystemExit(f"toolfleet {name}: {exc}") from None
        finally:
            if tracing is not None:
                tracing.shutdown()  # exports the spans still queued


async def _main(
    name: str, settings: Settings, make: Callable[[Bus, Redis], Service], pools: tuple[str, ...]
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
    probes = _Probes(settings)
    watcher = asyncio.create_task(watch({"kafka": probes.kafka, "redis": probes.redis}))
    lag = asyncio.create_task(LAG.run())  # toolfleet_consumer_lag of every consumer made
    try:
        await _serve(name, settings, make, pools=pools, stopping=stopping, current=current)
    finally:
        watcher.cancel()
        lag.cancel()
        await probes.close()


async def _serve(
    name: str,
    settings: Settings,
    make: Callable[[Bus, Redis], Service],
    *,
    pools: tuple[str, ...],
    stopping: asyncio.Event,
    current: list[Service],
) -> None:
    """Build the service and run it; after a cut-off or an outage, build it again."""
    while not stopping.is_set():
        HEALTH.set("assigned", False)
        HEALTH.set("serving", True)
        try:
            await check_credentials(settings)
            await ensure_topics(settings, pools)
            redis = connect_redis(settings)
            try:
                current[:] = [make(KafkaBus(settings, service=name), redis)]
                await current[0].run()
            finally:
                await redis.aclose()
            return
        except CutOffError as exc:
            # The service closed its consumers on the way out: the group has rebalanced and
            # healthy peers own its partitions. Come back once both dependencies answer.
            log.error("cut off, giving up its partitions: %s", exc)
        except TopicsMissingError as exc:
            # Topics are created on purpose in this deployment: wait for them (not ready
            # meanwhile), saying which ones and how, rather than restarting in a loop.
            log.error("%s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=TOPICS_RECHECK_S)
            continue
        except Exception as exc:
            if refused(exc):
                # Credentials or TLS: waiting does not fix them. Say which connection and why.
                raise explain_connection_error(exc, settings) from exc
            if not isinstance(exc, _UNREACHABLE):
                raise
            # Started (or restarted) while Kafka or Redis is away: wait instead of exiting,
            # so an outage never turns into a crash loop.
            log.error("Kafka or Redis unreachable at start: %r; waiting for them", exc)
        await wait_until_reachable(settings, stopping)
        if not stopping.is_set():
            log.warning("Kafka and Redis reachable again: rejoining")


class _Probes:
    """The readiness checks of ``/readyz``: Kafka answers a metadata request (for no topic),
    Redis a PING.

    Each keeps one connection of its own, so a check costs one round trip.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._admin: AIOKafkaAdminClient | None = None
        self._redis: Redis | None = None

    async def kafka(self) -> None:
        if self._admin is None:
            admin = AIOKafkaAdminClient(**kafka_options(self.settings), request_timeout_ms=1500)
            try:
                await admin.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    await admin.close()
                raise
            self._admin = admin
        try:
            # A metadata request naming no topic (aiokafka's public describe_topics sends
            # exactly that for an empty list): the broker answers with itself and its peers
            # only. Listing every topic would have each service decode the whole cluster's
            # metadata every few seconds (thousands of partitions on a shared cluster), and
            # naming one topic could auto-create it.
            await self._admin.describe_topics([])
        except BaseException:
            admin, self._admin = self._admin, None
            with contextlib.suppress(Exception):
                await admin.close()
            raise

    async def redis(self) -> None:
        if self._redis is None:
            self._redis = connect_redis(self.settings)
        await self._redis.ping()

    async def close(self) -> None:
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await self._admin.close()
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()


async def check_credentials(settings: Settings) -> None:
    """Connect to a broker and to Redis once, raising at once if either refuses this process.

    aiokafka reports a refused SASL login or an untrusted certificate only in a log line and
    then "Unable to bootstrap", which the services would wait out as an outage; one direct
    connection shows the real reason. Unreachable services are left to the usual waiting.
    """
    from aiokafka.conn import create_conn

    options = kafka_options(settings)
    servers = str(options.pop("bootstrap_servers")).split(",")
    for server in servers:
        host, _, port = server.strip().rpartition(":")
        try:
            conn = await asyncio.wait_for(create_conn(host, int(port), **options), 15)
        except Exception as exc:
            if refused(exc):
                raise explain_connection_error(exc, settings) from exc
            continue
        conn.close()
        break
    redis = connect_redis(settings)
    try:
        await asyncio.wait_for(redis.ping(), 15)
    except Exception as exc:
        if refused(exc):
            raise explain_connection_error(exc, settings) from exc
    finally:
        await redis.aclose()


async def wait_until_reachable(settings: Settings, stopping: asyncio.Event) -> None:
    """Return once Redis answers PING and Kafka lists its topics (or ``stopping`` is set)."""
    delay = 0.5
    while not stopping.is_set():
        redis = connect_redis(settings)
        admin = AIOKafkaAdminClient(**kafka_options(settings))
        try:
            await asyncio.wait_for(redis.ping(), timeout=5)
            await asyncio.wait_for(admin.start(), timeout=10)
            await asyncio.wait_for(admin.list_topics(), timeout=10)
            return
        except _UNREACHABLE:
            pass
        finally:
            await redis.aclose()
            with contextlib.suppress(Exception):
                await admin.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), timeout=delay)
        delay = min(delay * 2, 10.0)


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
