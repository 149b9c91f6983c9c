"""Starting and stopping the systems under test: toolfleet, the raw and durable relays, Celery
(the peers, Temporal and DBOS, are in ``bench.temporal_peer`` and ``bench.dbos_peer``).

Each is an async context manager that gives a running system with its load target, and stops
every process it started on the way out, whatever happened.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

from aiokafka.admin import AIOKafkaAdminClient
from redis.asyncio import Redis

from bench.procs import (
    REPO,
    BenchFleet,
    ProcessGroup,
    child_env,
    latest_assignment,
    progress,
    python_env,
    wait_until,
)
from bench.targets import CeleryTarget, KafkaTarget
from bench.workload import Target
from kernel.adapters.topics import ensure_topics
from kernel.settings import Settings
from kernel.stores.keys import Keys

PARTITIONS = 6
"""Partitions of every bench topic (toolfleet's default)."""

KEEP_LOGS = 5
"""Runs whose service logs stay in bench/results/logs/."""


@dataclass
class RunContext:
    """One bench run: its id, where its logs and results go, what it must clean up."""

    base: Settings
    results: Path
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    redis_max_connections: int | None = None
    """Passed to toolfleet's services in REDIS_URL (``?max_connections=N``) when set."""
    services_redis_url: str | None = None
    """The services' Redis when it is not ``base``'s (bench (f): a local cluster, discarded
    after the run; ``cleanup`` deletes keys on ``base``'s Redis only)."""
    prefixes: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    log_root: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_root = self.results / "logs" / self.run_id
        self.log_root.mkdir(parents=True, exist_ok=True)
        runs = sorted((self.results / "logs").iterdir(), key=lambda p: p.stat().st_mtime)
        for old in runs[:-KEEP_LOGS]:  # the logs of the last few runs are kept (not in git)
            shutil.rmtree(old, ignore_errors=True)

    @property
    def tenant(self) -> str:
        """The tenant of every bench call: all its Redis keys share the ``tf:{tenant}`` tag."""
        return f"bench-{self.run_id}"

    def settings(self, name: str) -> Settings:
        """Settings with a fresh topic prefix for one system of this run."""
        prefix = f"bench-{self.run_id}-{name}."
        update: dict[str, object] = {"topic_prefix": prefix, "partitions": PARTITIONS}
        if self.redis_max_connections is not None:
            parts = urlsplit(self.base.redis_address())
            query = f"max_connections={self.redis_max_connections}"
            update["redis_url"] = urlunsplit(parts._replace(query=query))
        if self.services_redis_url is not None:
            update["redis_url"] = self.services_redis_url
        settings = self.base.model_copy(update=update)
        self.prefixes.append(prefix)
        self.namespaces.append(Keys.of(settings).namespace)
        return settings

    def celery_url(self) -> str:
        """Celery's broker and backend: the same Redis server, database 3 (kept apart)."""
        parts = urlsplit(self.base.redis_address())
        return urlunsplit(parts._replace(path="/3"))

    async def cleanup(self) -> None:
        """Delete this run's topics and its Redis keys (every key of its namespaces, holds)."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self.base.kafka_servers())
        await admin.start()
        try:
            topics = [t for t in await admin.list_topics() if t.startswith(tuple(self.prefixes))]
            if topics:
                await admin.delete_topics(topics)
        finally:
            await admin.close()
        redis = Redis.from_url(self.base.redis_address())
        try:
            for namespace in self.namespaces:
                await delete_keys(redis, f"{namespace}:*")
            await delete_keys(redis, f"bench:hold:{self.run_id}*")
        finally:
            await redis.aclose()


async def delete_keys(redis: Redis, pattern: str) -> int:
    """UNLINK every key matching ``pattern`` (SCAN, so Redis is never blocked)."""
    deleted = 0
    batch: list[bytes] = []
    async for key in redis.scan_iter(match=pattern, count=5000):
        batch.append(key)
        if len(batch) >= 5000:
            deleted += await redis.unlink(*batch)
            batch = []
    if batch:
        deleted += await redis.unlink(*batch)
    return deleted


class Peer(Protocol):
    """A peer system under test (Temporal, DBOS): its load target and its processes."""

    @property
    def target(self) -> Target:
        """Where turns are sent and results come back."""

    def check(self) -> None:
        """Raise (with a log's tail) if one of its processes died."""

    def pids(self) -> dict[str, int]:
        """Its processes by name, for the CPU meter."""

    async def set_workers(self, count: int) -> None:
        """Run ``count`` worker processes; return once they take work."""


# --------------------------------------------------------------------------------- toolfleet


@dataclass
class Toolfleet:
    """A LocalFleet of this run with its load target."""

    settings: Settings
    fleet: BenchFleet
    target: KafkaTarget
    concurrency: int

    def check(self) -> None:
        """Raise (with the log's tail) if a service died."""
        self.fleet.check()

    def pids(self) -> dict[str, int]:
        return self.fleet.pids()

    async def set_workers(self, count: int, concurrency: int | None = None) -> None:
        """Run ``count`` workers with ``--concurrency``; wait until they own every partition."""
        concurrency = concurrency or self.concurrency
        fleet = self.fleet
        running = [n for n in range(max(fleet.workers, count)) if f"worker-{n}" in fleet.pids()]
        restart = concurrency != self.concurrency
        for n in running:
            if restart or n >= count:
                fleet.terminate(f"worker-{n}")
        self.concurrency = concurrency
        fleet.worker_args = ["--concurrency", str(concurrency)]
        fleet.workers = count
        for n in range(count):
            if f"worker-{n}" not in fleet.pids():
                fleet.start_worker(n)
        await fleet.ready(within=120)


@asynccontextmanager
async def toolfleet(
    ctx: RunContext,
    name: str,
    workers: int,
    concurrency: int = 100,
    *,
    profile: dict[str, Path] | None = None,
    root: Path = REPO,
) -> AsyncIterator[Toolfleet]:
    """Planner, aggregator, reconciler and ``workers`` workers serving ``bench.tools``.

    ``profile`` runs the named services under pyinstrument (see ``bench.profiled``);
    ``root`` is the source tree they run (another commit's: ``bench.baseline``).
    """
    settings = ctx.settings(name)
    await ensure_topics(settings)
    log_dir = ctx.log_root / name
    log_dir.mkdir(parents=True, exist_ok=True)
    fleet = BenchFleet(
        settings,
        tools="bench.tools:tools",
        workers=workers,
        worker_args=["--concurrency", str(concurrency)],
        log_dir=log_dir,
        profile=dict(profile or {}),
        root=root,
    )
    target = KafkaTarget(settings, "toolfleet")
    try:
        fleet.__enter__()
        await target.start()
        await fleet.ready(within=120)
        yield Toolfleet(settings, fleet, target, concurrency)
    finally:
        try:
            await target.stop()
        finally:
            if _failing():
                fleet.stop_now()
            else:
                fleet.stop(timeout=60 if profile else 20)  # profilers write on the way out


def _failing() -> bool:
    return sys.exc_info()[0] is not None


# ------------------------------------------------------------------------------------ relay


@dataclass
class Relay:
    """The raw relay's processes (planner, aggregator, N workers) and its load target."""

    settings: Settings
    target: KafkaTarget
    processes: ProcessGroup
    durable: bool = False
    """The durable relay: started and finished written to Redis around each call's body."""

    def start(self, name: str, role: str) -> None:
        argv = [sys.executable, "-m", "bench.relay", role]
        env = child_env(self.settings, BENCH_RELAY_DURABLE="1" if self.durable else "0")
        self.processes.start(name, argv, env)

    def check(self) -> None:
        self.processes.check()

    def pids(self) -> dict[str, int]:
        return self.processes.pids()

    def _ready(self) -> bool:
        log = self.processes.log_text
        if any(latest_assignment(log(name)) is None for name in ("planner", "aggregator")):
            return False
        owned = [latest_assignment(log(n)) for n in self.processes.workers()]
        if any(o is None for o in owned):
            return False
        return sorted(p for o in owned for p in o or []) == list(range(self.settings.partitions))

    async def ready(self) -> None:
        await wait_until(self._ready, within=120, what="relay consumer groups", check=self.check)

    async def set_workers(self, count: int) -> None:
        self.processes.scale(count, lambda n: self.start(f"worker-{n}", "worker"))
        await self.ready()


@asynccontextmanager
async def relay(ctx: RunContext, workers: int, *, durable: bool = False) -> AsyncIterator[Relay]:
    """The raw aiokafka relay over the same hops, in separate processes (``durable``: the
    durable relay, with its two Redis writes per call on the worker hop)."""
    name = "durable" if durable else "relay"
    settings = ctx.settings(name)
    await ensure_topics(settings)
    log_dir = ctx.log_root / name
    log_dir.mkdir(parents=True, exist_ok=True)
    label = "durable relay" if durable else "raw relay"
    processes = ProcessGroup(f"relay ({name})", log_dir, grace_s=10)
    system = Relay(settings, KafkaTarget(settings, label), processes, durable=durable)
    try:
        system.start("planner", "planner")
        system.start("aggregator", "aggregator")
        for n in range(workers):
            system.start(f"worker-{n}", "worker")
        await system.target.start()
        await system.ready()
        yield system
    finally:
        try:
            await system.target.stop()
        finally:
            processes.stop_all()


# ----------------------------------------------------------------------------------- Celery

CELERY_POOL = os.environ.get("BENCH_CELERY_POOL", "threads")
CELERY_CONCURRENCY = int(os.environ.get("BENCH_CELERY_CONCURRENCY", "8"))
"""Each Celery worker process runs 8 threads: a no-op task waits on Redis round trips (the
broker, the result backend, the chord counter), and threads overlap those waits. Override with
BENCH_CELERY_POOL / BENCH_CELERY_CONCURRENCY (e.g. ``solo`` / 1, or ``prefork`` / 2)."""


@dataclass
class CelerySystem:
    """Celery worker processes (threads pool) and the chord-per-turn target."""

    url: str
    queue: str
    target: CeleryTarget
    processes: ProcessGroup

    def start(self, n: int) -> None:
        argv = [
            sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker",
            "--pool", CELERY_POOL, "--concurrency", str(CELERY_CONCURRENCY),
            "--queues", self.queue, "--hostname", f"{self.queue}-{n}@%h",
            "--without-heartbeat", "--without-gossip", "--without-mingle",
            "--loglevel", "WARNING",
        ]  # fmt: skip
        env = python_env(BENCH_CELERY_URL=self.url, BENCH_CELERY_QUEUE=self.queue)
        self.processes.start(f"worker-{n}", argv, env)

    def check(self) -> None:
        self.target.check()
        self.processes.check()

    def pids(self) -> dict[str, int]:
        return self.processes.pids()

    async def set_workers(self, count: int) -> None:
        self.processes.scale(count, self.start)
        await self.ready(count)

    async def ready(self, count: int) -> None:
        """Wait until ``count`` workers have announced ``worker_ready`` (see celery_app)."""
        from bench.celery_app import ready_key

        redis = Redis.from_url(self.url)
        try:
            hosts: set[bytes | str] = set()

            async def poll() -> None:
                hosts.update(await redis.smembers(ready_key(self.queue)))

            alive = {f"{self.queue}-{n}" for n in range(count)}
            deadline = time.monotonic() + 120
            while not alive <= {_text(h).split("@")[0] for h in hosts}:
                self.check()
                if time.monotonic() > deadline:
                    raise TimeoutError("celery workers not ready within 120 s")
                await poll()
                await asyncio.sleep(0.1)  # polling interval of a deadline-bounded wait
        finally:
            await redis.aclose()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@asynccontextmanager
async def celery(ctx: RunContext, workers: int) -> AsyncIterator[CelerySystem]:
    """``workers`` Celery worker processes on their own queue of this run."""
    url = ctx.celery_url()
    queue = f"bench-{ctx.run_id}"
    results_key = f"bench:celery:{ctx.run_id}:results"
    log_dir = ctx.log_root / "celery"
    log_dir.mkdir(parents=True, exist_ok=True)
    target = CeleryTarget(url, queue, results_key, "Celery chord")
    system = CelerySystem(url, queue, target, ProcessGroup("celery", log_dir))
    try:
        for n in range(workers):
            system.start(n)
        await target.start()
        await system.ready(workers)
        yield system
    finally:
        try:
            await target.stop()
        finally:
            system.processes.stop_all()
            redis = Redis.from_url(url)
            try:
                await redis.delete(queue, results_key, f"bench:celery:ready:{queue}")
                await delete_keys(redis, f"_kombu.binding*.{queue}")
                await delete_keys(redis, "celery-taskset-meta-*")
                removed = await delete_keys(redis, "celery-task-meta-*")
                progress(f"celery: removed {removed} stored task results")
            finally:
                await redis.aclose()
