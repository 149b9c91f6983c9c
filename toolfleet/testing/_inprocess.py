"""A whole fleet on the test's event loop, serving tool objects the test makes at run time.

``InProcessFleet`` runs the real planner, aggregator, reconciler and workers as tasks of the
running event loop, against the real Kafka broker and Redis named by the ``Settings`` it is
given, under a topic prefix (and so a Redis namespace) of its own. Unlike ``LocalFleet``,
whose worker processes import their tools from a ``module:attribute``, its workers serve
whatever objects the test hands it: ``await fleet.serve(tool)`` with an Agents SDK
``FunctionTool`` or a toolfleet ``Tool`` defined anywhere. With ``auto_serve=True`` it is also
the process's tool server (``toolfleet.serving``): a runner that follows that contract serves
each function tool it is about to call, so an application's own agent tests run on fleet
semantics unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from types import TracebackType
from typing import Any, Self, Unpack

from aiokafka.admin import AIOKafkaAdminClient
from redis.asyncio import Redis

from aggregator.service import Aggregator
from executors.worker import Worker, WorkerLimits
from kernel.adapters.background import BackgroundTasks
from kernel.adapters.bus import KafkaBus
from kernel.adapters.redis import connect_redis
from kernel.adapters.security import kafka_options
from kernel.adapters.topics import command_topic, ensure_topics
from kernel.errors import UnavailableError, UsageError
from kernel.rules.state_versions import spec_for_readers
from kernel.settings import Settings
from kernel.stores.door import Stores
from kernel.stores.keys import Keys
from kernel.stores.registry import announce_tools, replace_tool
from kernel.tools import CallHooks, Tool, ToolRegistry
from planner.service import Planner
from reconciler.service import Reconciler
from schemas import AgentRef, ModelResponseEvent
from toolfleet import serving
from toolfleet.client import FleetClient
from toolfleet.testing._quiet import until_quiet
from toolfleet.testing._served import Served, ServeOptions, build, expand, lookup_key_of

log = logging.getLogger(__name__)

_Service = Planner | Aggregator | Reconciler | Worker


class InProcessFleet:
    """Planner, aggregator, reconciler and ``workers`` workers on this event loop.

    ``settings`` names the broker and Redis (and every other setting); the fleet runs under
    ``settings.topic_prefix`` + ``inproc-<8 hex>.``, its own topics and Redis namespace, which
    ``stop`` deletes unless ``cleanup=False``. ``fleet.settings`` is that copy: a
    ``FleetClient`` of the fleet's must use it (``fleet.client`` is one, started with the
    fleet). ``tools`` are served from the start; ``hooks`` are the workers' lifecycle hooks.
    """

    def __init__(
        self,
        settings: Settings,
        *tools: object,
        workers: int = 1,
        pool: str = "default",
        auto_serve: bool = False,
        hooks: CallHooks | None = None,
        limits: WorkerLimits | None = None,
        cleanup: bool = True,
        ready_within: float = 60.0,
        quiet_within: float = 5.0,
    ) -> None:
        if workers < 1:
            raise UsageError("an in-process fleet needs at least one worker (workers >= 1)")
        prefix = f"{settings.topic_prefix}inproc-{uuid.uuid4().hex[:8]}."
        self.settings = settings.model_copy(update={"topic_prefix": prefix})
        """The fleet's settings: the ones given, under the fleet's own topic prefix."""
        self.pool = pool
        self.workers = workers
        self.auto_serve = auto_serve
        """Whether the fleet is the process's tool server while it runs (``toolfleet.serving``)."""
        self.cleanup = cleanup
        self.ready_within = ready_within
        """Seconds ``start`` waits for the fleet to serve."""
        self.quiet_within = quiet_within
        """Seconds ``stop`` first waits for every record on the fleet's topics to be handled
        and committed by the services that read it (0: stop at once)."""
        self.keys = Keys.of(self.settings)
        """The Redis key layout of the fleet's namespace (its ledger, registry...)."""
        self.registry = ToolRegistry(hooks=hooks)
        """What every worker of the fleet serves: the objects served, one per lookup key."""
        self.started_in_s: float | None = None
        """Seconds ``start`` took, until the fleet served (topics, services, a first turn)."""
        self.stopped_in_s: float | None = None
        """Seconds ``stop`` took (services, connections and clean-up)."""
        self._limits = limits or WorkerLimits()
        self._initial = expand(tools)
        self._served: dict[str, Served] = {}
        self._generation: dict[str, int] = {}
        self._lock = asyncio.Lock()
        self._redis: Redis | None = None
        self._client: FleetClient | None = None
        self._planner: Planner | None = None
        self._reconciler: Reconciler | None = None
        self._workers: list[Worker] = []
        self._services: list[_Service] = []
        self._connections: list[Redis] = []
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._backgrounds: dict[str, BackgroundTasks] = {}
        """Each service's background loops, by service (``check`` reports one that ends)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False

    # --- serving ---------------------------------------------------------------------------
    async def serve(self, *tools: object, **options: Unpack[ServeOptions]) -> list[Tool]:
        """Serve these objects from now on; the Tools the workers run for them.

        Each is an Agents SDK ``FunctionTool``, a toolfleet ``Tool`` or a ``ToolRegistry``
        (every tool it declares), defined anywhere. An object served under a lookup key that
        already serves another object replaces it: calls submitted from now on are planned with
        the new object's spec (release gate, effect class) and run its body. ``options`` are
        toolfleet's options of an SDK function tool (``ServeOptions``: ``effect``, ``probe``...,
        as ``ToolRegistry.add_function_tool`` takes them); a toolfleet Tool declares its own.
        Serving an object already served, with the same options, changes nothing.
        """
        self.check()
        self._on_its_loop()
        served = []
        async with self._lock:
            for obj in expand(tools):
                served.append(await self._serve_one(obj, dict(options)))
        return served

    async def ensure_served(self, tool: object) -> None:
        """The tool-server contract (``toolfleet.serving``): serve ``tool`` unless it is the
        object served under its lookup key already (then return at once)."""
        current = self._served.get(lookup_key_of(tool))
        if current is not None and current.original is tool:
            return
        self.check()
        self._on_its_loop()
        async with self._lock:
            await self._serve_one(tool, None)

    def gated(self, tool: object) -> bool:
        """The tool-server contract's release gate (``toolfleet.serving.GatingToolServer``):
        whether the planner holds every call of ``tool``'s lookup key for a person, as the
        object served under it now is specified (its registry spec says ``always``).
        UsageError when nothing is served under that key."""
        needs = self.served(lookup_key_of(tool)).needs_approval
        return not callable(needs) and bool(needs)

    def served(self, lookup_key: str) -> Tool:
        """The Tool the workers run for ``lookup_key`` now; UsageError when none is served."""
        found = self._served.get(lookup_key)
        if found is None:
            raise UsageError(
                f"this in-process fleet serves no tool {lookup_key!r}; serve it first "
                "(await fleet.serve(tool)), or start the fleet with auto_serve=True"
            )
        return found.tool

    async def _serve_one(self, obj: object, options: dict[str, Any] | None) -> Tool:
        """Serve one object (the lock held). ``options`` None: as it is served already, if it
        is; else with none."""
        key = lookup_key_of(obj)
        current = self._served.get(key)
        if current is not None and current.original is obj and options in (None, current.options):
            return current.tool
        generation = self._generation.get(key, 0) + 1
        tool = build(obj, str(generation), self.pool, options or {})
        self._generation[key] = generation
        self._served[key] = Served(obj, tool, options or {})
        self.registry.replace(tool)
        if self._redis is not None:
            await self._publish(tool)
        return tool

    async def _publish(self, tool: Tool) -> None:
        """The registry in Redis names the new object's spec as the tool's only live version,
        and the services that cache it read it again on their next turn; clients learn it from
        the tools topic (its version is newer than any before it)."""
        assert self._redis is not None
        # As a worker publishes it: what the services of the version in force read.
        in_force = await Stores(self._redis, self.settings).schema().in_force(fresh_read=True)
        spec = spec_for_readers(tool.spec(self.pool), in_force)
        await replace_tool(self._redis, self.keys, spec)
        if self._client is not None:  # before it, the starting workers announce what is served
            await announce_tools(self._client.bus, [spec])
        for service in (self._planner, self._reconciler):
            if service is not None:
                service.tools.forget()

    # --- life cycle -----------------------------------------------------------------------
    @property
    def client(self) -> FleetClient:
        """A started FleetClient of this fleet (for ``FleetRunner``, or turns by hand)."""
        if self._client is None:
            raise UsageError("the in-process fleet is not running: await fleet.start() first")
        return self._client

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the fleet's services run on (the one ``start`` was awaited on): its
        calls must be made there, and a synchronous entry point (``Runner.run_sync``) can run
        its coroutine there with ``loop.run_until_complete`` while the loop is idle."""
        if self._loop is None:
            raise UsageError("the in-process fleet is not running: await fleet.start() first")
        return self._loop

    def _on_its_loop(self) -> None:
        if self._loop is not None and asyncio.get_running_loop() is not self._loop:
            raise UsageError(
                "this in-process fleet runs on another event loop than the caller's: run the "
                "tests on the loop the fleet was started on (with pytest-asyncio, a "
                'session-scoped fleet and asyncio_default_test_loop_scope = "session")'
            )

    @property
    def running(self) -> bool:
        """Whether the fleet was started and not stopped."""
        return bool(self._tasks) and not self._stopping

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Create the topics, start every service and a client, and return once a first turn
        went through and the workers own every partition of their pool's command topic."""
        if self._tasks or self._stopping:
            raise UsageError("an in-process fleet starts once; make a new one to start again")
        began = time.monotonic()
        settings = self.settings
        self._loop = asyncio.get_running_loop()
        try:
            await ensure_topics(settings, pools=(self.pool,))
            self._redis = connect_redis(settings)
            # As each service process does at start: on fresh state, this release's version
            # is recorded (so its services write all it has); newer state is refused.
            await Stores(self._redis, settings).schema().check_start("in-process fleet")
            for obj in self._initial:
                await self._serve_one(obj, {})
            self._planner = Planner(settings, bus=self._bus("planner"), stores=self._stores())
            self._reconciler = Reconciler(
                settings, bus=self._bus("reconciler"), stores=self._stores()
            )
            aggregator = Aggregator(settings, bus=self._bus("aggregator"), stores=self._stores())
            # Its transactional id names the instance: unique, as two processes' would be.
            aggregator.instance = f"inproc-{uuid.uuid4().hex[:8]}"
            self._workers = [
                Worker(
                    settings,
                    self.registry,
                    self.pool,
                    self._limits,
                    worker_id=f"inproc-{n}-{uuid.uuid4().hex[:8]}",
                    bus=self._bus(f"worker-{self.pool}"),
                    stores=self._stores(),
                )
                for n in range(self.workers)
            ]
            services: list[tuple[str, _Service]] = [
                ("planner", self._planner),
                ("aggregator", aggregator),
                ("reconciler", self._reconciler),
                *((f"worker-{n}", w) for n, w in enumerate(self._workers)),
            ]
            for name, service in services:
                self._services.append(service)
                self._tasks[name] = asyncio.create_task(
                    service.run(), name=f"toolfleet-inproc-{name}"
                )
                if not isinstance(service, Aggregator):  # it runs no loop beside its own
                    self._backgrounds[name] = service.background
            self._client = FleetClient(settings)
            await self._client.__aenter__()
            try:
                async with asyncio.timeout(self.ready_within):
                    await asyncio.gather(self._first_turn(), self._workers_own_partitions())
            except TimeoutError:
                raise UnavailableError(
                    f"the in-process fleet did not serve within {self.ready_within:g} s: is "
                    f"the broker at {settings.kafka_servers()} answering (`toolfleet infra "
                    "status`)? Raise ready_within= on a slow machine"
                ) from None
        except BaseException:
            with contextlib.suppress(Exception):  # the reason it did not start comes first
                await self.stop()
            raise
        if self.auto_serve:
            serving.install(self)
        self.started_in_s = time.monotonic() - began

    def _bus(self, service: str) -> KafkaBus:
        return KafkaBus(self.settings, service=service)

    def _stores(self) -> Stores:
        """The stores of one service, over a Redis client of its own, as each process would
        have."""
        redis = connect_redis(self.settings)
        self._connections.append(redis)
        return Stores(redis, self.settings)

    async def _first_turn(self) -> None:
        """An empty turn through the planner and the aggregator: both consume and publish."""
        client = self.client
        warm = ModelResponseEvent(
            tenant_id="warm-up",
            run_id=f"warm-{uuid.uuid4().hex[:8]}",
            turn_id=0,
            agent=AgentRef(name="warm-up"),
            response_id="warm-up",
        )
        client.expect(warm.run_id, 0)
        await client.submit(warm)
        while True:
            self.check()
            with contextlib.suppress(TimeoutError):
                await client.result(warm.run_id, 0, within=0.5)
                return

    async def _workers_own_partitions(self) -> None:
        """Until the workers' assignments cover their command topic, so admission counts
        their slots (a call waits for capacity until then)."""
        partitions = self.settings.partitions_of(command_topic(self.pool))
        while sum(len(w.owned_partitions) for w in self._workers) < partitions:
            self.check()
            await asyncio.sleep(0.01)  # wait-ok: polling interval of a deadline-bounded wait

    def _failed(self) -> bool:
        return any(task.done() for task in self._tasks.values()) or any(
            background.failure for background in self._backgrounds.values()
        )

    def check(self) -> None:
        """Raise UnavailableError if a service of the fleet stopped on its own, or lost one of
        its background loops (a worker's capacity registration, the planner's admission
        tick...; the service then stops), its exception chained: rather than letting a call
        wait for it until a timeout."""
        if self._stopping:
            raise UsageError("the in-process fleet is stopped; start a new one")
        for name, background in self._backgrounds.items():
            if background.failure is not None:
                loop, cause = background.failure
                raise UnavailableError(
                    f"the in-process fleet's {name} lost its {loop} ({cause!r}) and stops; "
                    "see the test's log for why, and start a new fleet"
                ) from cause
        for name, task in self._tasks.items():
            if task.done():
                error = None if task.cancelled() else task.exception()
                raise UnavailableError(
                    f"the in-process fleet's {name} stopped ({error!r}); see the test's log "
                    "for why, and start a new fleet"
                ) from error

    async def stop(self, within: float = 30.0) -> None:
        """Stop every service (in-flight calls finish, offsets are committed), the client and
        the connections; delete the fleet's topics and Redis keys unless ``cleanup=False``."""
        if self._stopping:
            return
        self._stopping = True
        began = time.monotonic()
        serving.uninstall(self)
        try:
            if self._tasks and self.quiet_within > 0 and not self._failed():
                lagging = await until_quiet(self.settings, self.pool, self.quiet_within)
                if lagging:
                    log.warning(
                        "in-process fleet stopped with records not yet handled",
                        extra={"lagging": lagging, "waited_s": self.quiet_within},
                    )
            pending = set(self._tasks.values())
            deadline = time.monotonic() + within
            while pending and time.monotonic() < deadline:
                # Asked again each round: a service still starting when first asked (its
                # consume loop not made yet) would not hear a single request.
                for service in self._services:
                    service.stop()
                _, pending = await asyncio.wait(pending, timeout=0.1)
            if pending:
                log.error(
                    "in-process fleet services cancelled after %.0f s",
                    within,
                    extra={"services": sorted(t.get_name() for t in pending)},
                )
                for task in pending:
                    task.cancel()
                await asyncio.wait(pending)
            if self._client is not None:
                await self._client.__aexit__(None, None, None)
        finally:
            for redis in self._connections:
                await redis.aclose()
            if self._redis is not None:
                await self._redis.aclose()
            if self.cleanup and self._redis is not None:
                await self.purge()
            self.stopped_in_s = time.monotonic() - began
        failures = [
            (name, task.exception())
            for name, task in self._tasks.items()
            if not task.cancelled() and task.exception() is not None
        ]
        if failures:
            first = failures[0][1]
            raise UnavailableError(
                f"the in-process fleet's {', '.join(n for n, _ in failures)} stopped on an "
                f"error ({first!r}); the test's log says why"
            ) from first

    async def purge(self) -> None:
        """Delete the fleet's topics and every Redis key of its namespace (``stop`` does it
        unless ``cleanup=False``; after it, nothing of the fleet is left on either)."""
        admin = AIOKafkaAdminClient(**kafka_options(self.settings))
        await admin.start()
        try:
            prefix = self.settings.topic_prefix
            mine = [t for t in await admin.list_topics() if t.startswith(prefix)]
            if mine:
                await admin.delete_topics(mine)
        finally:
            await admin.close()
        redis = connect_redis(self.settings)
        try:
            pattern = f"{self.keys.namespace}:*"
            leftovers = [key async for key in redis.scan_iter(match=pattern, count=1000)]
            for start in range(0, len(leftovers), 500):  # a key per command: any cluster slot
                await asyncio.gather(*(redis.unlink(k) for k in leftovers[start : start + 500]))
        finally:
            await redis.aclose()
