"""The services' side of admission: queue commands, publish what admission lets run.

Every command the planner dispatches, and every retry the reconciler sends, is queued
(``submit``); ``Admission.admit`` decides which may go to Kafka now
(``kernel.stores.admission``). The worker that ran an admitted call frees its slots when it is
done with it (``free``), and its pass admits the calls waiting for that capacity; a planner
frees the calls whose outcome says an earlier release's worker, or the reconciler, left them
held (``release``). Submissions and releases that arrive while a pass runs share the next
pass, and each caller returns once its part is durable (its record's offset may then be
committed). A planner's tick (``tick``) refills rate buckets, frees expired leases, hands out
commands another instance admitted and never confirmed, and withdraws calls whose turn
deadline passed while they waited.

Its passes start tasks, wait and read the clock through functions bound at import
(``_create_task``, ``_now``...): a test sharing the event loop with an in-process fleet may
patch asyncio's or time's module-wide (a mock ``create_task`` that runs nothing would leave a
pass that never ends, and no pass after it).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from asyncio import create_task as _create_task
from asyncio import wait as _wait
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from time import monotonic as _monotonic
from time import time as _now
from typing import Protocol

from kernel.adapters.backoff import nap
from kernel.adapters.bus import Bus
from kernel.adapters.metrics import (
    ADMISSION_WAIT,
    ADMITTED,
    COMMANDS,
    TENANT_CALLS,
    THROTTLED,
    labelled,
)
from kernel.adapters.topics import command_topic
from kernel.adapters.tracing import traceparent
from kernel.rules.outcomes import past_deadline
from kernel.stores.admission import (
    PACED_SEP,
    SEP,
    Admission,
    Waiting,
    member_of,
    queued_command,
    waiting_command,
)
from schemas import CallOutcome, ExecutionCommand

log = logging.getLogger(__name__)

Publish = Callable[[CallOutcome], Awaitable[None]]

REPORT_EVERY_S = 5.0
"""How often a planner refreshes the per-tenant gauges (a read of every busy tenant)."""
TOP_TENANTS = 10
"""Tenants named in the gauges (bounded cardinality); the rest are summed as ``other``."""
MAX_CALLS = 1000
"""Calls one pass may admit (a planner's, the reconciler's)."""
CREDIT_HEADER = "tf-credit"
"""Header of a command a worker's pass admitted onto one of its own free slots: its value is
that worker's id (it counts its credits until they start)."""
PACED_HEADER = "tf-paced"
"""Header of an admitted command that took a rate token: the rate scopes (joined by
``PACED_SEP``) its start must pass too (``Admission.pace``)."""
CONFIRM_WITHIN_S = 0.05
"""A worker with no pass soon after it published admitted commands confirms them within this
(a planner's tick would otherwise publish them again after the publish lease)."""


class Credits(Protocol):
    """A worker's free slots, as its admission passes see them: its pass admits at most as
    many calls as it has free slots, and each of its pool goes to one of its partitions, so
    it starts on the slot that freed instead of behind another worker's running calls."""

    worker_id: str

    def room(self) -> int:
        """How many calls this worker could start now (its pass admits no more)."""

    def claim(self, pool: str) -> int | None:
        """A partition of this worker's for one more command of ``pool`` (a free slot is
        then counted as promised), or None: publish it by key."""


class Admitter:
    """Queues commands, publishes admitted ones, frees the slots of calls that ended (the
    worker that ran them; planners for earlier workers and the reconciler) and ticks (every
    planner's).

    One admission pass runs at a time per instance (group commit): whatever is submitted or
    freed while a pass runs goes into the next one, a single script call. Idle, a pass
    starts at once; under load, passes grow instead of their number, so the one hash slot
    admission lives on does a few large passes instead of one small pass per call.

    ``scan`` (planners, the reconciler) makes every pass also free expired leases and hand
    out unconfirmed commands; a worker's passes only free, queue and admit, and return at once
    when nothing waits. ``service`` names the publisher in the command metrics; ``credits``
    (a worker's) places what its passes admit on its own free slots.
    """

    def __init__(
        self,
        admission: Admission,
        bus: Bus,
        *,
        service: str = "planner",
        scan: bool = True,
        credits: Credits | None = None,
    ) -> None:
        self.admission = admission
        self.bus = bus
        self.service = service
        self.scan = scan
        self.credits = credits
        self._confirm: list[str] = []
        """Admitted commands now on Kafka, confirmed with the next admission pass."""
        self._queued: list[Waiting] = []
        self._released: list[str] = []
        self._waiters: list[asyncio.Future[None]] = []
        """Callers whose items are in ``_queued`` or who asked for a pass: woken once its
        admitted commands are on Kafka (an offset must not commit before its commands are)."""
        self._freeing: list[asyncio.Future[None]] = []
        """Callers whose items are in ``_released``: woken as soon as the pass's script ran
        (their release is durable; the commands it admitted are published after)."""
        self._pass: asyncio.Task[None] | None = None
        self._refills: set[asyncio.Task[None]] = set()
        """Refill passes, kept until done."""
        self._reported_at = 0.0
        self._refill: asyncio.TimerHandle | None = None

    async def submit(self, commands: Sequence[ExecutionCommand]) -> None:
        """Queue ``commands`` for admission and publish whatever may run now; returns once
        they are queued durably (and those admitted are on Kafka)."""
        if not commands:
            return
        now = _now()
        # In the trace of the caller's span (the planner's for its turn): kept with the payload.
        parent = traceparent()
        self._queued += [waiting_command(c, parent, issued_at=now) for c in commands]
        await self._in_next_pass()

    async def free(self, command: ExecutionCommand, *, throttled: bool = False) -> None:
        """Free the slots of an admitted call its worker is done with (idempotent: a member
        is freed once, whoever frees it), and admit what waits for them; returns once the
        release is durable. ``throttled``: the upstream said HTTP 429, and the tool's rate
        buckets slow down."""
        if throttled:
            THROTTLED.labels(command.tool_name).inc()
            await self.admission.throttle(command.tenant_id, command.tool_name, _now())
        self._released.append(
            member_of(command.tenant_id, command.run_id, command.call_id, command.attempt)
        )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._freeing.append(future)
        self._start_passes()
        await future

    async def release(self, outcome: CallOutcome) -> None:
        """Free the slots of an admitted call whose outcome says its slots are still held (an
        earlier release's worker, the reconciler's report of a lost worker), and admit what
        can run in its place; returns once that is durable."""
        if outcome.throttled:
            THROTTLED.labels(outcome.tool_name).inc()
            await self.admission.throttle(outcome.tenant_id, outcome.tool_name, _now())
        self._released.append(
            member_of(outcome.tenant_id, outcome.run_id, outcome.call_id, outcome.attempt)
        )
        await self._in_next_pass()

    async def admit(self) -> None:
        """An admission pass (refilled buckets, expired leases, unconfirmed commands)."""
        await self._in_next_pass()

    async def _in_next_pass(self) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        self._start_passes()
        await future

    def _start_passes(self) -> None:
        if self._pass is None:
            self._pass = _create_task(self._run_passes())

    async def _run_passes(self) -> None:
        """Passes until nobody waits for one; a failed pass fails its callers (their handlers
        retry, and queueing and releasing are idempotent)."""
        try:
            while self._waiters or self._freeing:
                waiters, self._waiters = self._waiters, []
                freeing, self._freeing = self._freeing, []
                queued, self._queued = self._queued, []
                released, self._released = self._released, []
                try:
                    await self._one_pass(queued, released, functools.partial(_wake, freeing))
                except asyncio.CancelledError:
                    for waiter in waiters + freeing + self._waiters + self._freeing:
                        waiter.cancel()
                    raise
                except Exception as exc:
                    for waiter in waiters + freeing:
                        if not waiter.done():
                            waiter.set_exception(exc)
                    continue
                _wake(waiters + freeing)
        finally:
            self._pass = None

    async def _one_pass(
        self, queued: Sequence[Waiting], released: Sequence[str], durable: Callable[[], None]
    ) -> None:
        """Queue, free, confirm what is on Kafka (``durable`` is called once that is
        written), then publish what may run now (and wait for the broker's acks)."""
        confirm, self._confirm = self._confirm, []
        try:
            admitted = await self.admission.admit(
                _now(),
                release=released,
                published=confirm,
                enqueue=queued,
                max_calls=MAX_CALLS if self.credits is None else self.credits.room(),
                scan=self.scan,
            )
        except BaseException:
            self._confirm = confirm + self._confirm  # confirmed with a later pass instead
            raise
        durable()
        if admitted.refill_in_s is not None:
            self._admit_at(admitted.refill_in_s)
        sent = []
        now = _now()
        counts: Counter[tuple[str, str]] = Counter()
        for member, payload, paced in admitted.calls:
            command = queued_command(payload)
            call_id = member.split(SEP)[2]
            tp = command.traceparent
            headers = [("traceparent", tp.encode())] if tp else []
            partition = self.credits.claim(command.pool) if self.credits else None
            if partition is not None:
                assert self.credits is not None
                headers.append((CREDIT_HEADER, self.credits.worker_id.encode()))
            if paced:
                headers.append((PACED_HEADER, PACED_SEP.join(paced).encode()))
            topic = command_topic(command.pool)
            raw = command.command_json.encode()
            sent.append(await self.bus.publish(topic, call_id, raw, headers, partition=partition))
            counts[command.pool, command.kind] += 1
            if command.issued_at is not None:
                labelled(ADMISSION_WAIT, command.pool).observe(max(0.0, now - command.issued_at))
        for (pool, kind), n in counts.items():
            labelled(ADMITTED, pool).inc(n)
            labelled(COMMANDS, self.service, pool, kind).inc(n)
        for future in sent:
            await future
        self._confirm += [member for member, _, _ in admitted.calls]
        if sent and not self.scan:
            # Nothing ticks in a worker: confirm soon, or a planner hands them out again.
            self._admit_at(CONFIRM_WITHIN_S)

    async def pace(
        self,
        command: ExecutionCommand,
        scopes: Sequence[str],
        *,
        until: asyncio.Event | None = None,
    ) -> None:
        """Return once ``command`` may start under every rate scope its admission named
        (``paced_scopes``); raises ``Interrupted`` if ``until`` is set meanwhile."""
        member = member_of(command.tenant_id, command.run_id, command.call_id, command.attempt)
        while (wait := await self.admission.pace(member, scopes, _now())) is not None:
            await nap(wait, until=until)

    async def started(self, command: ExecutionCommand, scopes: Sequence[str]) -> None:
        """``command``, paced, starts now (``Admission.started``)."""
        member = member_of(command.tenant_id, command.run_id, command.call_id, command.attempt)
        await self.admission.started(member, scopes, _now())

    def _admit_at(self, delay_s: float) -> None:
        """Another pass when a rate bucket has a token again (sooner than the next tick)."""
        if self._refill is not None:
            return
        loop = asyncio.get_running_loop()

        def run() -> None:
            self._refill = None
            task = _create_task(self._refill_pass())
            self._refills.add(task)
            task.add_done_callback(self._refills.discard)

        self._refill = loop.call_later(max(delay_s, 0.001), run)

    async def _refill_pass(self) -> None:
        try:
            await self.admit()
        except Exception as exc:  # the next tick tries again
            log.warning("admission pass failed", extra={"error": repr(exc)})

    async def drain(self) -> None:
        """Wait for the pass in flight, then confirm what this instance published (a worker
        that stops: its admitted commands are not handed out again)."""
        if self._refill is not None:
            self._refill.cancel()
            self._refill = None
        while self._pass is not None:
            await _wait([self._pass])
        await self.confirm()

    async def confirm(self) -> None:
        """Confirm at once what this instance published (a service that admits rarely, the
        reconciler, would otherwise leave it pending until a planner publishes it again)."""
        confirm, self._confirm = self._confirm, []
        if confirm:
            await self.admission.admit(_now(), published=confirm, max_calls=0)

    async def tick(self, publish: Publish) -> None:
        """Withdraw calls past their turn's deadline (each reported never started), then an
        admission pass (refilled buckets, expired leases, unconfirmed commands)."""
        for _, payload in await self.admission.withdraw_expired(_now()):
            await publish(past_deadline(_command(payload)))
        await self.admit()
        if _monotonic() - self._reported_at > REPORT_EVERY_S:
            self._reported_at = _monotonic()
            await self._report()

    async def _report(self) -> None:
        """The per-tenant gauges: the most-waiting tenants by name, the rest as one."""
        views = sorted(await self.admission.tenants(), key=lambda v: -v.waiting)
        TENANT_CALLS.clear()
        for view in views[:TOP_TENANTS]:
            TENANT_CALLS.labels(view.tenant_id, "running").set(view.running)
            TENANT_CALLS.labels(view.tenant_id, "waiting").set(view.waiting)
        rest = views[TOP_TENANTS:]
        if rest:
            TENANT_CALLS.labels("other", "running").set(sum(v.running for v in rest))
            TENANT_CALLS.labels("other", "waiting").set(sum(v.waiting for v in rest))


def _wake(waiters: Sequence[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)


def _command(payload: str) -> ExecutionCommand:
    return queued_command(payload).command()


def paced_scopes(headers: Sequence[tuple[str, bytes]] | None) -> tuple[str, ...]:
    """The rate scopes an admitted command's start must pass (``PACED_HEADER``)."""
    for name, value in headers or ():
        if name == PACED_HEADER and value:
            return tuple(value.decode().split(PACED_SEP))
    return ()
