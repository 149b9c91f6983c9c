"""One simulated world: the real services, their tools' upstream, the faults of one seed.

``simulate(seed)`` builds everything from the seed: two tenants whose runs share run and call
ids, a few turns of calls to four tools (a non-idempotent charge with a probe, an idempotent
ticket whose upstream dedupes by idempotency key, a read-only lookup, a non-idempotent refund
without a probe that needs approval), each turn failing on its first failed call or not and
running its calls one at a time or all at once, and a schedule of faults. An agent runtime
drawn from the seed too decides each call that waits for approval (approves or rejects) and
submits its turn again to resume it, and cancels some runs while their turns run.
The real planner, aggregator, reconciler and two workers run on a ``SimLoop`` over the
simulator's log and state server; services crash at whatever await they are in and restart;
replies are lost after the command applied; the state server fails over; groups rebalance
under their members; records are written twice or late; tools apply and then raise or hang;
probes do not know once. When the turns have settled (or a deadline passed) the invariants
are checked (``_check``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import gc
import json
import logging
import os
import random
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

from aggregator.service import Aggregator
from executors import NotExecuted, ProbeResult, ToolContext, ToolRegistry
from executors.worker import Worker
from kernel.adapters.bus import TRANSIENT_ERRORS, Bus
from kernel.adapters.dependencies import DEPENDENCIES
from kernel.settings import Settings
from kernel.stores.door import Stores
from planner.service import Planner
from reconciler.service import Reconciler
from schemas import (
    AgentRef,
    ApprovalDecision,
    CallOutcome,
    CancelRequest,
    ModelResponseEvent,
    TurnConfig,
)
from toolfleet.client import FleetClient, TurnTimeoutError
from toolfleet.testing.sim._broker import Broker, Faults, SimBus, SimConsumer
from toolfleet.testing.sim._fresh import as_new_process
from toolfleet.testing.sim._groups import slot_groups
from toolfleet.testing.sim._loop import SimLoop, Stalled, virtual_time
from toolfleet.testing.sim._state import StateServer

TENANTS = ("acme", "globex")
TurnKey = tuple[str, str, int]
"""(tenant, run, turn)."""
CallKey = tuple[str, str, str]
"""(tenant, run, call id)."""
SERVICES = ("planner", "aggregator", "reconciler", "worker-0", "worker-1")
SCHEDULED = (
    "crash",
    "lost redis reply",
    "failover",
    "rebalance",
    "duplicate record",
    "late record",
    "lost transaction answer",
)
"""The faults injected at a step of the run (the others come with a tool's attempt or probe)."""

FAULT_KINDS = (
    *SCHEDULED,
    "tool applied then raised",
    "tool applied then hung",
    "tool raised before applying",
    "tool refused",
    "probe did not know",
)
"""Every kind of fault a seed may draw (coverage reports the ones a batch injected)."""


SETTLE_WITHIN_S = 900.0
"""Virtual seconds the turns have to settle once submitted."""

MAX_STEPS = 2_000_000
"""Loop steps a seed may take (a seed that settles takes thousands; one that waits out its
900 virtual seconds, a few hundred thousand)."""

LEASE_S = 30.0
"""The simulated fleet's admission lease."""

FAULTS_UNTIL_STEP = 3_200
"""The last loop step at which a scheduled fault may land (from step 50): a seed that
settles takes 2,500 to 3,300 steps (its middle half), so most land while it runs."""

SIMULATED_SLOT_GROUPS = 4
"""The simulated fleet's slot groups (a deployment has 64): the state server is one shard, and
the reconciler's and stores' scans run one script or command per group. Four still put some
of a seed's runs in one group and some in others."""

_OWNER: contextvars.ContextVar[str | None] = contextvars.ContextVar("sim_owner", default=None)


@dataclass
class Upstream:
    """The systems the tools act on, as the simulator sees them: every effect applied."""

    applied: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    """(tool, idempotency key, tenant, run, call) of every effect that took place."""
    deduped: int = 0
    """Requests the idempotent upstream recognised by their key and did not apply again."""

    def has(self, tool: str, key: str) -> bool:
        """Whether an effect of ``tool`` under ``key`` took place."""
        return any(a[0] == tool and a[1] == key for a in self.applied)


@dataclass
class Report:
    """What one seed did and found."""

    seed: int
    violations: list[str] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    states: Counter[str] = field(default_factory=Counter)
    """Protocol states reached: ledger states and effects, outcome statuses, turn statuses,
    the functions services crashed in."""
    steps: int = 0
    virtual_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether every invariant held."""
        return not self.violations


@functools.cache
def _settings() -> Settings:
    """The simulated fleet's settings (read from the environment once a process: it costs
    more than a tenth of a small seed)."""
    return Settings(
        topic_prefix="sim.",
        partitions=2,
        identity_scope="run",
        # Admission leases reclaim the slots of calls whose release a failover lost; short
        # here, so a seed's end can wait for them.
        admission_lease_s=LEASE_S,
        admission_tick_ms=200,  # the planner's refill pass: enough for the seeds' rates
        # Decisions and cancellations are signed, each tenant with its own key.
        decision_keys={tenant: f"sim-key-{tenant}" for tenant in TENANTS},
    )


class World:
    """The simulation of one seed (``simulate`` runs it)."""

    def __init__(
        self, seed: int, turns: int | None = None, faults: frozenset[str] | None = None
    ) -> None:
        self.seed = seed
        self.allowed = FAULT_KINDS if faults is None else tuple(faults)
        """The fault kinds this world may draw."""
        self.rng = random.Random(seed)
        self.faults: Counter[str] = Counter()
        self.states: Counter[str] = Counter()
        self.upstream = Upstream()
        self.settings = _settings().model_copy(deep=True)
        self.loop = SimLoop(random.Random(self.rng.random()))
        self.state = StateServer(self._lose_reply)
        self.broker = Broker(self.settings, self._broker_faults())
        self.cancels: dict[int, float] = {}
        """Runs the agent runtime cancels: the index of the event after whose submission it
        does, and how long after."""
        self.events = self._turns(turns if turns is not None else self.rng.randint(1, 4))
        self.submitted: Counter[TurnKey] = Counter()
        """How many times each turn was submitted (resuming it is once more)."""
        self.decisions: dict[CallKey, bool] = {}
        """The agent runtime's decision on each call that waited for approval: approved?"""
        self.cancelled: set[tuple[str, str]] = set()
        """(tenant, run) of every run the agent runtime cancelled."""
        self.crossed: list[str] = []
        """What the client handed the agent runtime of another tenant's turn (a violation)."""
        self.services: dict[str, Any] = {}
        self.links: dict[str, Any] = {}
        self.buses: dict[str, SimBus] = {}
        self.tasks: dict[str, dict[asyncio.Task[Any], None]] = {}
        """Each service instance's tasks, in the order they were made (a crash cancels them
        in that order: a set's order would follow memory addresses, not the seed)."""
        self.generation: Counter[str] = Counter()
        self.armed: Counter[str] = Counter()
        """Faults waiting for their moment (the next reply, record, commit...)."""
        self.failed_over_at: float | None = None
        """When the last failover happened (virtual time)."""
        self.down: set[str] = set()
        """Services crashed or exited, waiting for their restart."""
        self.schedule = self._schedule()
        # No failover drawn: the state server keeps no replica (it draws nothing from the seed).
        self.state.replicating = any(kind == "failover" for _, kind, _ in self.schedule)
        self.tools = self._registry()
        self._lied: set[str] = set()
        self.died: list[str] = []
        """Services that stopped on their own (an error that crash-loops a service)."""

    # --- what the seed draws ----------------------------------------------------------------
    def _turns(self, count: int) -> list[ModelResponseEvent]:
        """Turns of both tenants; runs and calls share ids across tenants on purpose."""
        events: list[ModelResponseEvent] = []
        for n in range(count):
            tenant = TENANTS[n % 2] if self.rng.random() < 0.7 else TENANTS[0]
            run = f"run-{self.rng.randint(0, 1)}"
            turn = sum(1 for e in events if e.tenant_id == tenant and e.run_id == run)
            items = []
            for c in range(self.rng.randint(1, 3)):
                tool = self.rng.choice(("charge", "ticket", "lookup", "refund"))
                arguments = {"charge": {"cents": self.rng.randint(1, 9) * 100},
                             "ticket": {"title": f"t{n}{c}"},
                             "lookup": {"q": f"q{n}{c}"},
                             "refund": {"cents": self.rng.randint(1, 9) * 100}}[tool]  # fmt: skip
                items.append(
                    {
                        "type": "function_call",
                        "call_id": f"call_{turn}_{c}",
                        "name": tool,
                        "arguments": json.dumps(arguments),
                    }
                )
            events.append(
                ModelResponseEvent(
                    tenant_id=tenant,
                    run_id=run,
                    turn_id=turn,
                    agent=AgentRef(name="sim"),
                    response_id=f"resp-{n}",
                    items=items,
                    config=TurnConfig(
                        failure_policy=self.rng.choice(("error_as_output", "fail_turn")),
                        max_concurrency=self.rng.choice((None, None, 1)),
                    ),
                )
            )
            if self.rng.random() < 0.15:
                self.cancels[n] = self.rng.choice((0.0, 0.05, 0.5, 2.0))
        return events

    def _schedule(self) -> list[tuple[int, str, str]]:
        """(step, fault, target) events, in step order."""
        kinds = [k for k in SCHEDULED if k in self.allowed]
        events = []
        for _ in range(self.rng.choice((0, 1, 2, 3, 4, 6))):
            step, kind, target = (
                self.rng.randint(50, FAULTS_UNTIL_STEP),
                self.rng.choice(SCHEDULED),
                self.rng.choice(SERVICES),
            )
            if kind in kinds:  # drawn whatever is allowed: a seed's other draws stay the same
                events.append((step, kind, target))
        return sorted(events)

    def _broker_faults(self) -> Faults:
        def delay() -> float:
            if self.armed["late record"]:
                self.armed["late record"] -= 1
                self.faults["late record"] += 1
                return self.rng.uniform(1.0, 5.0)
            return self.rng.choice((0.0, 0.0, 0.001, 0.005))

        def duplicate() -> bool:
            if self.armed["duplicate record"]:
                self.armed["duplicate record"] -= 1
                self.faults["duplicate record"] += 1
                return True
            return False

        def lose_commit_answer() -> bool:
            if self.armed["lost transaction answer"]:
                self.armed["lost transaction answer"] -= 1
                self.faults["lost transaction answer"] += 1
                return True
            return False

        return Faults(
            delay=delay,
            duplicate=duplicate,
            lose_commit_answer=lose_commit_answer,
            commit_applied=lambda: self.rng.random() < 0.5,
            fetch_some=lambda n: self.rng.randint(1, n),
        )

    def _lose_reply(self, service: str) -> bool:
        if self.armed[f"lost redis reply:{service}"]:
            self.armed[f"lost redis reply:{service}"] -= 1
            self.faults["lost redis reply"] += 1
            return True
        return False

    # --- the tools and their upstream ---------------------------------------------------------
    def _registry(self) -> ToolRegistry:
        tools = ToolRegistry()
        world = self

        @tools.tool(effect="non_idempotent", timeout=5.0)
        async def charge(ctx: ToolContext, cents: int) -> str:
            """Charges a card: applied at most once by the fleet (probed by key)."""
            return await world._act("charge", ctx, f"charged {cents}")

        @charge.probe
        async def _(ctx: ToolContext) -> ProbeResult:
            return world._probe("charge", ctx)

        @tools.tool(effect="idempotent", timeout=5.0)
        async def ticket(ctx: ToolContext, title: str) -> str:
            """Opens a ticket; the upstream dedupes by idempotency key."""
            return await world._act("ticket", ctx, f"ticket {title}")

        @tools.tool(effect="read_only", timeout=5.0)
        async def lookup(ctx: ToolContext, q: str) -> str:
            """Reads something."""
            return await world._act("lookup", ctx, f"found {q}")

        @tools.tool(effect="non_idempotent", timeout=5.0, needs_approval=True)
        async def refund(ctx: ToolContext, cents: int) -> str:
            """Refunds a card once its tenant approved: no probe, so an unknown effect goes to
            a person."""
            return await world._act("refund", ctx, f"refunded {cents}")

        return tools

    async def _act(self, tool: str, ctx: ToolContext, output: str) -> str:
        """One attempt of a tool: what it does to the upstream is drawn from the seed."""
        behaviour = self.rng.choices(
            ("ok", "applied then raised", "applied then hung", "raised before applying",
             "refused"),
            weights=(70, 8, 5, 9, 8),
        )[0]  # fmt: skip
        if behaviour != "ok" and f"tool {behaviour}" not in self.allowed:
            behaviour = "ok"
        answer = f"{ctx.tenant_id}:{output}"
        if tool == "ticket" and self.upstream.has(tool, ctx.idempotency_key):
            # The upstream knows the key: it answers with what it did, it refuses nothing.
            behaviour = "ok" if behaviour == "refused" else behaviour
        if behaviour == "refused":
            self.faults["tool refused"] += 1
            raise NotExecuted("the upstream refused", retryable=False)
        if behaviour == "raised before applying":
            self.faults["tool raised before applying"] += 1
            raise ConnectionRefusedError("simulated: the request never left")
        # The request leaves: it lands upstream whatever becomes of the caller.
        landed = asyncio.get_running_loop().create_future()
        token = _OWNER.set(None)
        try:
            asyncio.get_running_loop().call_later(
                self.rng.choice((0.0, 0.002, 0.05)), self._apply, tool, ctx, landed
            )
        finally:
            _OWNER.reset(token)
        await asyncio.shield(landed)
        if tool == "lookup":
            return answer
        if behaviour == "applied then raised":
            self.faults["tool applied then raised"] += 1
            raise ConnectionResetError("simulated: connection reset after the request")
        if behaviour == "applied then hung":
            self.faults["tool applied then hung"] += 1
            await asyncio.sleep(3600)
        return answer

    def _apply(self, tool: str, ctx: ToolContext, landed: asyncio.Future[None]) -> None:
        key = ctx.idempotency_key
        if tool == "ticket" and self.upstream.has(tool, key):
            self.upstream.deduped += 1
        elif tool != "lookup":
            self.upstream.applied.append((tool, key, ctx.tenant_id, ctx.run_id, ctx.call_id))
        if not landed.done():
            landed.set_result(None)

    def _probe(self, tool: str, ctx: ToolContext) -> ProbeResult:
        key = ctx.idempotency_key
        lie = self.rng.random() < 0.3
        if key not in self._lied and lie and "probe did not know" in self.allowed:
            self._lied.add(key)
            self.faults["probe did not know"] += 1
            return ProbeResult.unknown("simulated: the upstream did not answer")
        if self.upstream.has(tool, key):
            return ProbeResult.applied(f"{ctx.tenant_id}:probed", detail="found by key")
        return ProbeResult.not_applied()

    # --- services -----------------------------------------------------------------------------
    def _start(self, name: str) -> None:
        """Start (or restart) service ``name`` with connections of its own."""
        self.generation[name] += 1
        self.down.discard(name)
        instance = f"{name}#{self.generation[name]}"
        redis, link = self.state.client(instance)
        service_name = "worker-default" if name.startswith("worker") else name
        sim_bus = SimBus(self.broker, self.settings, service_name)
        bus = cast("Bus", sim_bus)  # what the services use of a Bus, over the simulator's log
        stores = Stores(redis, self.settings)
        service: Any
        if name == "planner":
            service = Planner(self.settings, bus=bus, stores=stores)
        elif name == "aggregator":
            service = Aggregator(self.settings, bus=bus, stores=stores)
            service.instance = instance.replace("#", "-")
        elif name == "reconciler":
            # Its pass scans every slot group's schedule and leases: each second, not five
            # times a second, or the scans are most of a seed's cost.
            service = Reconciler(self.settings, bus=bus, stores=stores, tick_s=1.0)
        else:
            service = Worker(self.settings, self.tools, "default", worker_id=instance,
                             bus=bus, stores=stores)  # fmt: skip
        self.services[name], self.links[name], self.buses[name] = service, link, sim_bus
        self.tasks[instance] = {}
        token = _OWNER.set(instance)
        try:
            task = asyncio.get_running_loop().create_task(service.run(), name=instance)
        finally:
            _OWNER.reset(token)

        def ended(done: asyncio.Task[Any]) -> None:
            if link.severed:
                return  # crashed by the simulator: how it ended is the crash's doing
            error = None if done.cancelled() else done.exception()
            if isinstance(error, TRANSIENT_ERRORS):
                # A process that exits because Redis or Kafka failed it is restarted by its
                # supervisor (Kubernetes), as the simulator does here.
                self.states[f"exited on {type(error).__name__}, restarted"] += 1
                link.severed = sim_bus.severed = True
                self.down.add(name)
                self.loop.call_later(self.rng.uniform(1.0, 5.0), self._start, name)
                return
            if not done.cancelled() and done.exception() is not None:
                self.died.append(f"{instance} stopped on its own: {done.exception()!r}")
                if os.environ.get("TOOLFLEET_SIM_LOG"):
                    done.print_stack()
                    import traceback

                    traceback.print_exception(done.exception())

        task.add_done_callback(ended)

    def _task_factory(
        self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kw: Any
    ) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kw)
        owner = _OWNER.get()
        if owner is not None:
            mine = self.tasks.setdefault(owner, {})
            mine[task] = None
            task.add_done_callback(lambda done: mine.pop(done, None))
        return task

    def _crash(self, name: str) -> None:
        """Kill service ``name`` where it stands; restart it a little later."""
        instance = f"{name}#{self.generation[name]}"
        self.faults["crash"] += 1
        self.down.add(name)
        self.links[name].severed = True
        bus = self.buses[name]
        bus.severed = True
        for task in list(self.tasks.get(instance, ())):
            frame = _innermost(task)
            if frame is not None:
                self.states[f"crashed in {frame}"] += 1
            task.cancel()
        # Its group memberships last until the session times out.
        members = [m for g in self.broker.groups.values() for m in g.members if m.bus is bus]
        later = self.settings.session_timeout_ms / 1000

        def expire(consumers: list[SimConsumer] = members) -> None:
            for consumer in consumers:
                self.broker.leave(consumer)

        self.loop.call_later(later, expire)
        self.loop.call_later(self.rng.uniform(0.5, 15.0), self._start, name)

    def _on_step(self) -> None:
        if self.loop.steps > MAX_STEPS:
            raise Stalled(f"{MAX_STEPS} steps without the turns settling: a livelock")
        while self.schedule and self.schedule[0][0] <= self.loop.steps:
            _, kind, target = self.schedule.pop(0)
            self._inject(kind, target)

    def _inject(self, kind: str, target: str) -> None:
        if kind == "crash":
            if target in self.services:
                self._crash(target)
        elif kind == "lost redis reply":
            self.armed[f"lost redis reply:{target}#{self.generation[target]}"] += 1
        elif kind == "failover":
            self.faults["failover"] += 1
            self.failed_over_at = self.loop.time()
            self.state.fail_over()
        elif kind == "rebalance":
            groups = sorted(self.broker.groups)
            if groups:
                self.faults["rebalance"] += 1
                self.broker.rebalance(self.broker.groups[self.rng.choice(groups)])
        else:
            self.armed[kind] += 1

    # --- the run ------------------------------------------------------------------------------
    async def _main(self) -> None:
        await (
            Stores(self.state.client("setup", observer=True)[0], self.settings)
            .schema()
            .check_start("sim")
        )
        for name in SERVICES:
            self._start(name)
        await asyncio.sleep(2.0)  # the workers publish their tools and own their partitions
        client = FleetClient(
            self.settings, bus=cast("Bus", SimBus(self.broker, self.settings, "client"))
        )
        await client.__aenter__()
        loop = asyncio.get_running_loop()
        runtime: list[asyncio.Task[None]] = []
        cancelling = []
        for n, event in enumerate(self.events):
            runtime.append(loop.create_task(self._follow_through(client, event)))
            await self._submit(client, event)
            if n in self.cancels:
                cancel = self._cancel_later(client, event, self.cancels[n])
                cancelling.append(asyncio.get_running_loop().create_task(cancel))
            await asyncio.sleep(self.rng.choice((0.0, 0.01, 0.5)))
        deadline = self.loop.time() + SETTLE_WITHIN_S
        from toolfleet.testing.sim._check import settled, slots_held

        while self.loop.time() < deadline and not await settled(self):  # noqa: ASYNC110
            await asyncio.sleep(1.0)  # checked each virtual second: nothing signals it
        # Let what settles after the result (slots released, leases let go) happen; a failover
        # may have taken back releases, which only the admission lease gives back.
        await asyncio.sleep(10.0)
        while self.failed_over_at is not None and (  # noqa: ASYNC110 (a failover moves it)
            self.loop.time() < self.failed_over_at + LEASE_S + 10.0
        ):
            await asyncio.sleep(self.failed_over_at + LEASE_S + 10.0 - self.loop.time())
        # A turn can end before its calls' slots come back, by design: a call left started
        # under a lease nobody renews (its worker crashed, or lost the reply to `started`)
        # is reported lost once the lease runs out; a command admitted but never published
        # is handed out again after the publish lease; a service restarted after the turns
        # settled still works through its backlog. Slots still held once every service is
        # up again and every lease running then has run out are leaked.
        if await slots_held(self):
            self.states["slots held after the turns settled"] += 1
            while self.down:  # noqa: ASYNC110 (checked each virtual second: nothing signals it)
                await asyncio.sleep(1.0)
            await asyncio.sleep(LEASE_S + 10.0)
        for task in [*runtime, *cancelling]:
            task.cancel()
        await client.__aexit__(None, None, None)

    # --- the agent runtime ----------------------------------------------------------------------
    async def _submit(self, client: FleetClient, event: ModelResponseEvent) -> None:
        self.submitted[(event.tenant_id, event.run_id, event.turn_id)] += 1
        await client.submit(event)

    async def _cancel_later(
        self, client: FleetClient, event: ModelResponseEvent, after: float
    ) -> None:
        """Cancel ``event``'s run ``after`` seconds after it was submitted."""
        await asyncio.sleep(after)
        self.cancelled.add((event.tenant_id, event.run_id))
        request = CancelRequest(
            tenant_id=event.tenant_id, run_id=event.run_id, reason="simulated: the user stopped",
            decided_by="sim",
        )  # fmt: skip
        await client.cancel(request)

    async def _follow_through(self, client: FleetClient, event: ModelResponseEvent) -> None:
        """As an agent runtime does with each turn it submitted: await its result through the
        client (and follow its calls' outcomes); for a result that is interrupted, decide each
        call that waits (approve or reject, drawn from the seed; once a call) and submit the
        turn again to resume it. A resumed response that overtakes its decision is
        interrupted again, and submitted again. Whatever the client hands over must be this
        tenant's turn: the tenants' runs share their ids."""
        tenant, run, turn = event.tenant_id, event.run_id, event.turn_id

        def on_outcome(outcome: CallOutcome) -> None:
            if (outcome.tenant_id, outcome.run_id, outcome.turn_id) != (tenant, run, turn):
                self.crossed.append(
                    f"{tenant}/{run} turn {turn} was shown {outcome.tenant_id}'s outcome"
                )

        stop = await client.follow(run, turn, on_outcome, tenant_id=tenant)
        try:
            while True:
                try:
                    result = await client.result(
                        run, turn, within=SETTLE_WITHIN_S, tenant_id=tenant
                    )
                except TurnTimeoutError:
                    return  # the turn waits on a person, or never ends (the checker says which)
                if (result.tenant_id, result.run_id, result.turn_id) != (tenant, run, turn):
                    self.crossed.append(
                        f"{tenant}/{run} turn {turn} was handed {result.tenant_id}'s result"
                    )
                if result.status != "interrupted":
                    return
                for item in result.interruptions:
                    call = (tenant, run, item.call_id)
                    if call not in self.decisions:
                        self.decisions[call] = self.rng.random() < 0.6
                        decision = ApprovalDecision(
                            tenant_id=tenant, run_id=run, call_id=item.call_id,
                            tool_name=item.tool_name, approve=self.decisions[call],
                            message=None if self.decisions[call] else "simulated: rejected",
                            decided_by="sim",
                        )  # fmt: skip
                        await client.decide(decision)
                await asyncio.sleep(self.rng.choice((0.0, 0.01, 0.5)))
                await self._submit(client, event.model_copy(update={"resume": True}))
        finally:
            stop()

    def run(self) -> Report:
        """Run the seed to its end and check the invariants."""
        from toolfleet.testing.sim._check import check

        report = Report(self.seed)
        self.loop.set_task_factory(self._task_factory)  # type: ignore[arg-type]
        self.loop.on_step = self._on_step
        if not os.environ.get("TOOLFLEET_SIM_LOG"):
            logging.disable(logging.CRITICAL)
        # The collector runs when allocations say so, and what it finalises (an async
        # generator's aclose, a connection's __del__) lands on the loop: its moments would
        # depend on what ran before the seed, not on the seed.
        gc.collect()
        gc.disable()
        # What this process's dependency monitor saw of an earlier seed's Kafka and Redis
        # (down since when, said when) would steer this one.
        DEPENDENCIES.configure(self.settings)
        try:
            with (
                as_new_process(),
                virtual_time(self.loop, self.seed),
                slot_groups(SIMULATED_SLOT_GROUPS),
            ):
                self.loop.run_until_complete(self._main())
                report.violations += self.loop.run_until_complete(check(self))
                report.violations += self.died
        except Stalled as exc:
            report.violations.append(f"the simulation stalled: {exc}")
        finally:
            report.steps = self.loop.steps  # the seed's own: not the clean-up's below
            report.virtual_s = self.loop.now
            logging.disable(logging.NOTSET)
            _close(self.loop)
            DEPENDENCIES.forget_loops()
            gc.enable()
        report.faults = self.faults
        report.states = self.states
        return report


def _innermost(task: asyncio.Task[Any]) -> str | None:
    """The function a task is suspended in, innermost first (where a crash lands)."""
    coro: Any = task.get_coro()
    name = None
    while coro is not None:
        code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
        if code is not None:
            name = code.co_qualname
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return name


def _close(loop: SimLoop) -> None:
    """Drop every task left (services of a finished world) and close the loop."""
    for task in asyncio.all_tasks(loop):
        task.cancel()
    loop.on_step = None
    with contextlib.suppress(Exception):  # a dying world's leftovers: nothing to learn
        loop.run_until_complete(asyncio.sleep(0))
    loop.close()


def simulate(seed: int, turns: int | None = None, faults: frozenset[str] | None = None) -> Report:
    """Simulate ``seed`` (with the fault kinds ``faults``, all by default) and report."""
    return World(seed, turns, faults).run()
