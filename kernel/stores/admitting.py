"""The services' side of admission: queue commands, publish what admission lets run.

Every command the planner dispatches, and every retry the reconciler sends, is queued
(``submit``); ``Admission.admit`` decides which may go to Kafka now
(``kernel.stores.admission``). An outcome of an admitted call frees its slots (``release``).
Submissions and releases that arrive while a pass runs share the next pass, and each caller
returns once its part is durable (its record's offset may then be committed).
A tick (``tick``) refills rate buckets, hands out commands another planner admitted and never
confirmed, and withdraws calls whose turn deadline passed while they waited.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

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


class Admitter:
    """Queues commands, publishes admitted ones, frees slots on outcomes (the planner's) and
    ticks (every planner's).

    One admission pass runs at a time per instance (group commit): whatever is submitted or
    released while a pass runs goes into the next one, a single script call. Idle, a pass
    starts at once; under load, passes grow instead of their number, so the one hash slot
    admission lives on does a few large passes instead of one small pass per call.
    """

    def __init__(self, admission: Admission, bus: Bus) -> None:
        self.admission = admission
        self.bus = bus
        self._confirm: list[str] = []
        """Admitted commands now on Kafka, confirmed with the next admission pass."""
        self._queued: list[Waiting] = []
        self._released: list[str] = []
        self._waiters: list[asyncio.Future[None]] = []
        """Callers whose items are in ``_queued`` / ``_released``: woken when their pass ends."""
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
        now = time.time()
        # In the trace of the caller's span (the planner's for its turn): kept with the payload.
        parent = traceparent()
        self._queued += [waiting_command(c, parent, issued_at=now) for c in commands]
        await self._in_next_pass()

    async def release(self, outcome: CallOutcome) -> None:
        """Free the slots of an admitted call whose outcome arrived (idempotent), and admit
        what can run in its place; returns once that is durable. An HTTP 429 also slows the
        tool's rate buckets."""
        if outcome.throttled:
            THROTTLED.labels(outcome.tool_name).inc()
            await self.admission.throttle(outcome.tenant_id, outcome.tool_name, time.time())
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
        if self._pass is None:
            self._pass = asyncio.create_task(self._run_passes())
        await future

    async def _run_passes(self) -> None:
        """Passes until nobody waits for one; a failed pass fails its callers (their handlers
        retry, and queueing and releasing are idempotent)."""
        try:
            while self._waiters:
                waiters, self._waiters = self._waiters, []
                queued, self._queued = self._queued, []
                released, self._released = self._released, []
                try:
                    await self._one_pass(queued, released)
                except asyncio.CancelledError:
                    for waiter in waiters + self._waiters:
                        waiter.cancel()
                    raise
                except Exception as exc:
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_exception(exc)
                    continue
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
        finally:
            self._pass = None

    async def _one_pass(self, queued: Sequence[Waiting], released: Sequence[str]) -> None:
        """Queue, free, confirm what is on Kafka, then publish what may run now (and wait
        for the broker's acks)."""
        confirm, self._confirm = self._confirm, []
        try:
            admitted = await self.admission.admit(
                time.time(), release=released, published=confirm, enqueue=queued
            )
        except BaseException:
            self._confirm = confirm + self._confirm  # confirmed with a later pass instead
            raise
        if admitted.refill_in_s is not None:
            self._admit_at(admitted.refill_in_s)
        sent = []
        now = time.time()
        counts: Counter[tuple[str, str]] = Counter()
        for member, payload in admitted.calls:
            command = queued_command(payload)
            call_id = member.split(SEP)[2]
            tp = command.traceparent
            headers = [("traceparent", tp.encode())] if tp else []
            topic = command_topic(command.pool)
            raw = command.command_json.encode()
            sent.append(await self.bus.publish(topic, call_id, raw, headers))
            counts[command.pool, command.kind] += 1
            if command.issued_at is not None:
                labelled(ADMISSION_WAIT, command.pool).observe(max(0.0, now - command.issued_at))
        for (pool, kind), n in counts.items():
            labelled(ADMITTED, pool).inc(n)
            labelled(COMMANDS, "planner", pool, kind).inc(n)
        for future in sent:
            await future
        self._confirm += [member for member, _ in admitted.calls]

    def _admit_at(self, delay_s: float) -> None:
        """Another pass when a rate bucket has a token again (sooner than the next tick)."""
        if self._refill is not None:
            return
        loop = asyncio.get_running_loop()

        def run() -> None:
            self._refill = None
            task = asyncio.create_task(self._refill_pass())
            self._refills.add(task)
            task.add_done_callback(self._refills.discard)

        self._refill = loop.call_later(max(delay_s, 0.001), run)

    async def _refill_pass(self) -> None:
        try:
            await self.admit()
        except Exception as exc:  # the next tick tries again
            log.warning("admission pass failed", extra={"error": repr(exc)})

    async def confirm(self) -> None:
        """Confirm at once what this instance published (a service that admits rarely, the
        reconciler, would otherwise leave it pending until a planner publishes it again)."""
        confirm, self._confirm = self._confirm, []
        if confirm:
            await self.admission.admit(time.time(), published=confirm, max_calls=0)

    async def tick(self, publish: Publish) -> None:
        """Withdraw calls past their turn's deadline (each reported never started), then an
        admission pass (refilled buckets, expired leases, unconfirmed commands)."""
        for _, payload in await self.admission.withdraw_expired(time.time()):
            await publish(past_deadline(_command(payload)))
        await self.admit()
        if time.monotonic() - self._reported_at > REPORT_EVERY_S:
            self._reported_at = time.monotonic()
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


def _command(payload: str) -> ExecutionCommand:
    return queued_command(payload).command()
