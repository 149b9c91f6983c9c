"""Admission: a call reaches Kafka only when it can run, and tenants share capacity by weight.

The planner hands every call it dispatches to ``Admission.enqueue``; ``Admission.admit``
returns the commands that may go to Kafka now. A call is admitted when all of these hold:

- its pool has a free slot: the pool's capacity is the sum of its live workers' slots (each
  worker registers them, ``register_worker``, and keeps registering while it runs);
- its tenant is under the tenant's ``max_concurrency`` and its tool under the tool's;
- a token is free in each rate limit that applies: the tenant's, the tool's and the tool's
  per-tenant rate (token buckets shared by the fleet, refilled at ``RATE_SAFETY`` of the
  declared rate so that calls, which start at the workers a few milliseconds apart from when
  they were admitted, stay under it in any window of a second). An HTTP 429 from the tool
  halves its buckets' rate, which recovers linearly over ``RECOVERY_S``.

Among tenants with waiting calls the next admission goes to the one with the lowest virtual
time, which grows by 1/weight per admitted call (start-time fair queueing): backlogged
tenants get capacity in proportion to their weights, and a tenant that arrives gets the
next free slot instead of waiting behind another tenant's backlog. A tenant that was idle
re-enters at the current virtual time, never with credit saved from before, and so does a
tenant held back by its own quota or rate while others were admitted.

Every decision is one Lua script (``kernel/stores/lua/admission/``) over keys of one hash
slot (``{adm}``), so several planners admit concurrently without exceeding a quota or
admitting a call twice. An admitted call holds its slot until its outcome is released
(``admit(release=...)``), or until its lease (``lease_s``) runs out (a safety net: a lost
outcome cannot leak a slot forever). Each call attempt is released once, whoever releases it
first; a pass handed attempt N of a call (``admit(enqueue=...)``) also releases the attempts
before N (a retry is made only once they are over). A pass with ``scan=False`` (one that
frees calls it knows ended) leaves the sweeps of expired leases, stopped workers and
unconfirmed commands to the scanning passes, and ends after the release when nothing waits.
An admitted command is *pending* until the planner confirms it is on Kafka; a planner that
dies in between leaves it pending, and the next planner's tick publishes it again (commands
are idempotent: the ledger gates every attempt). A call that the pass queueing it admits at
once never enters the queue: only what must wait is written there (the usual case with free
capacity costs Redis no queue entry, no deadline entry, and no read-back of the payload).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis.asyncio import Redis

from kernel.adapters.redis import text
from kernel.settings import Settings
from kernel.stores.keys import Keys
from kernel.stores.scripts import script
from schemas import ExecutionCommand

RATE_SAFETY = 0.9
"""Buckets refill at this share of the declared rate (a margin for start-time jitter)."""

RECOVERY_S = 10.0
"""After an HTTP 429, a bucket's rate climbs back from its cut to the full rate over this."""
PACE_SLACK_S = 0.1
"""Added to each rate window at the start (``Admission.pace``): a start is counted when the
worker records it, a round trip or two before the tool's own code begins, and under load
that gap varies by tens of milliseconds between calls."""

SEP = "\x1f"
PACED_SEP = "\x1e"
"""Between the rate scopes an admitted call passes at its start (a scope holds ``SEP``)."""

_ENQUEUE = script("admission/enqueue")
_ADMIT = script("admission/admit")
_WITHDRAW = script("admission/withdraw")
_THROTTLE = script("admission/throttle")
_PACE = script("admission/pace")


@dataclass(frozen=True)
class Limits:
    """One tenant's or tool's limits; None leaves a limit off."""

    max_concurrency: int | None = None
    weight: float | None = None
    """Tenants only: share of capacity among tenants with waiting calls (default 1)."""
    rate: float | None = None
    """Calls per second, a token bucket shared by the fleet."""
    burst: int | None = None
    """Tokens the bucket holds (default 1: calls spaced evenly)."""
    tenant_rate: float | None = None
    """Tools only: calls per second per tenant (an upstream's limit per API key)."""
    tenant_burst: int | None = None

    def json(self) -> str:
        """As stored in Redis (and read by the admission script)."""
        return json.dumps({k: v for k, v in self.__dict__.items() if v is not None})

    @classmethod
    def parse(cls, raw: bytes | str | None) -> Limits:
        """From what ``json`` stored; an absent entry is no limits."""
        return cls(**json.loads(text(raw))) if raw else cls()


@dataclass(frozen=True)
class Waiting:
    """A call handed to admission: its identity, what limits it, and its command's bytes."""

    tenant_id: str
    run_id: str
    call_id: str
    attempt: int
    tool: str
    pool: str
    payload: str
    deadline_at: float | None = None

    @property
    def member(self) -> str:
        """The call attempt's name in every admission structure."""
        return member_of(self.tenant_id, self.run_id, self.call_id, self.attempt)


def waiting_command(
    command: ExecutionCommand, traceparent: str | None = None, *, issued_at: float | None = None
) -> Waiting:
    """An admitted copy of ``command`` (its outcome will free its slots), queued for admission,
    issued at ``issued_at`` if given (one copy of the command: copies cost 4 us each).

    The payload is ``pool SEP traceparent SEP command JSON``: whoever admits it publishes it
    to its pool's topic as it is, in the trace of the turn that queued it
    (``queued_command`` reads it back). Every version of the planner reads this format: a
    rolling upgrade has old and new planners admitting each other's calls."""
    update: dict[str, Any] = {"admitted": True}
    if issued_at is not None:
        update["issued_at"] = issued_at
    admitted = command.model_copy(update=update)
    payload = SEP.join((command.pool, traceparent or "", admitted.encode().decode()))
    return Waiting(
        command.tenant_id, command.run_id, command.call_id, command.attempt, command.tool_name,
        command.pool, payload, command.deadline_at,
    )  # fmt: skip


def _entries(calls: Sequence[Waiting]) -> list[Any]:
    """The script arguments of queued calls, six per call."""
    args: list[Any] = []
    for c in calls:
        deadline = "" if c.deadline_at is None else c.deadline_at
        args += [c.member, c.tenant_id, c.tool, c.pool, deadline, c.payload]
    return args


@dataclass(frozen=True)
class QueuedCommand:
    """A queued call's payload, read back: what to publish, where, and what to count."""

    pool: str
    command_json: str
    traceparent: str | None
    kind: str
    issued_at: float | None
    """When the command was issued (None when its JSON could not be read)."""

    def command(self) -> ExecutionCommand:
        """The command itself, decoded."""
        return ExecutionCommand.model_validate_json(self.command_json)


def queued_command(payload: str) -> QueuedCommand:
    """What ``waiting_command`` queued (also a payload queued without trace context)."""
    pool, rest = payload.split(SEP, 1)
    traceparent, raw = ("", rest) if rest.startswith("{") else rest.split(SEP, 1)
    # Two fields for the admission metrics, without validating the command: its worker does
    # (and dead-letters bytes it cannot read; the metrics must not stop them being sent).
    try:
        fields = orjson.loads(raw)
        kind, issued_at = str(fields.get("kind", "execute")), float(fields["issued_at"])
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
        kind, issued_at = "unreadable", None
    return QueuedCommand(pool, raw, traceparent or None, kind, issued_at)


def _scopes(joined: str) -> tuple[str, ...]:
    return tuple(joined.split(PACED_SEP)) if joined else ()


def member_of(tenant_id: str, run_id: str, call_id: str, attempt: int) -> str:
    """The admission name of one call attempt (its slot is released by this name)."""
    return SEP.join((tenant_id, run_id, call_id, str(attempt)))


@dataclass(frozen=True)
class Admitted:
    """What one admission pass hands out."""

    calls: list[tuple[str, str, tuple[str, ...]]]
    """(member, payload, paced) of each command to publish now; ``paced``: the rate scopes
    its admission took a token from, each of which it must also pass when it starts
    (``Admission.pace``)."""
    refill_in_s: float | None = None
    """Seconds until a rate bucket that held a call back has a token (None: none did)."""


@dataclass(frozen=True)
class WorkerStatus:
    """What a worker says of itself each time it registers its slots."""

    in_flight: int = 0
    """Calls its tools are running now."""
    build: str = ""
    """The toolfleet release it runs."""
    host: str = ""
    started_at: float = 0.0
    tools: dict[str, str] = field(default_factory=dict)
    """The tools it serves: name -> newest version."""

    def json(self) -> str:
        """As stored (``Admission.register_worker``)."""
        return json.dumps(
            {
                "in_flight": self.in_flight,
                "build": self.build,
                "host": self.host,
                "started_at": self.started_at,
                "tools": self.tools,
            },
            separators=(",", ":"),
        )

    @classmethod
    def parse(cls, raw: bytes | str) -> WorkerStatus:
        """As stored; fields a later release adds are ignored, missing ones take defaults."""
        data = orjson.loads(raw)
        return cls(
            int(data.get("in_flight", 0)),
            str(data.get("build", "")),
            str(data.get("host", "")),
            float(data.get("started_at", 0.0)),
            {str(k): str(v) for k, v in dict(data.get("tools", {})).items()},
        )


@dataclass(frozen=True)
class WorkerView:
    """One worker as admission knows it (``Admission.workers``)."""

    pool: str
    worker_id: str
    slots: int
    registered_until: float
    live: bool
    """Registered now (its slots count in the pool's capacity)."""
    status: WorkerStatus | None
    """What it said of itself (None: a release before statuses, or none yet)."""


@dataclass(frozen=True)
class TenantView:
    """What ``toolfleet tenants list`` shows for one tenant."""

    tenant_id: str
    limits: Limits
    running: int
    waiting: int
    admitted_total: int


class Admission:
    """The admission queues, quotas and rate limits, in Redis (see the module docstring)."""

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        *,
        default_tenant: Limits = Limits(),
        lease_s: float = 900.0,
        publish_lease_s: float = 10.0,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.default_tenant = default_tenant
        self.lease_s = lease_s
        self.publish_lease_s = publish_lease_s
        self._enqueue = _ENQUEUE.register(redis)
        self._admit = _ADMIT.register(redis)
        self._withdraw = _WITHDRAW.register(redis)
        self._throttle = _THROTTLE.register(redis)
        self._pace = _PACE.register(redis)

    @classmethod
    def of(cls, redis: Redis, keys: Keys, settings: Settings) -> Admission:
        """Admission as ``settings`` configure it (defaults for tenants nobody configured)."""
        default = Limits(
            max_concurrency=settings.tenant_max_concurrency,
            weight=settings.tenant_weight,
            rate=settings.tenant_rate,
            burst=settings.tenant_burst,
        )
        return cls(redis, keys, default_tenant=default, lease_s=settings.admission_lease_s)

    def _key(self, name: str) -> str:
        return self.keys.admission(name)

    async def enqueue(self, calls: Sequence[Waiting], now: float) -> int:
        """Queue calls (a call attempt already queued or admitted is skipped); how many."""
        if not calls:
            return 0
        args: list[Any] = [now, *_entries(calls)]
        names = ("active", "clock", "waiting", "info", "payloads", "deadlines", "seq")
        return int(await self._enqueue(keys=[self._key(n) for n in names], args=args))

    async def admit(
        self,
        now: float,
        *,
        release: Sequence[str] = (),
        published: Sequence[str] = (),
        enqueue: Sequence[Waiting] = (),
        max_calls: int = 1000,
        scan: bool = True,
    ) -> Admitted:
        """Free the slots of ``release``d calls, confirm ``published`` ones, queue
        ``enqueue``d ones, then admit what can run: (member, payload) of each command to
        publish now, fairest first (also those a planner admitted and did not confirm within
        the publish lease), and when a rate limit that held a call back has a token again.

        ``scan`` also frees the slots of expired leases and stopped workers and hands out the
        unconfirmed commands; without it the pass only frees, queues and admits, and returns
        at once when nothing waits (a release by whoever saw the calls end)."""
        names = (
            "active", "clock", "waiting", "info", "payloads", "deadlines", "running",
            "admitted", "pending", "tenants", "tools", "buckets", "workers", "slots", "seq",
        )  # fmt: skip
        args: list[Any] = [
            now, max_calls, self.lease_s, self.publish_lease_s, self.default_tenant.json(),
            RATE_SAFETY, RECOVERY_S, int(scan), len(release), *release, len(published),
            *published, len(enqueue), *_entries(enqueue),
        ]  # fmt: skip
        flat = await self._admit(keys=[self._key(n) for n in names], args=args)
        retry = text(flat[0])
        calls = [
            (text(flat[i]), text(flat[i + 1]), _scopes(text(flat[i + 2])))
            for i in range(1, len(flat), 3)
        ]
        return Admitted(calls, float(retry) if retry else None)

    async def pace(self, member: str, scopes: Sequence[str], now: float) -> float | None:
        """A call about to start under the rate ``scopes`` its admission named: None once its
        start is counted in every one (it may start now), or the seconds to wait before
        asking again. A rate holds at the start, where the upstream sees it: calls admitted
        apart may reach their workers together."""
        if not scopes:
            return None
        keys = [self._key("tenants"), self._key("tools")]
        keys += [self._key(f"starts{SEP}{scope}") for scope in scopes]
        args: list[Any] = [now, member, PACE_SLACK_S, self.default_tenant.json(), *scopes]
        wait = text(await self._pace(keys=keys, args=args))
        return float(wait) if wait else None

    async def started(self, member: str, scopes: Sequence[str], now: float) -> None:
        """The call ``pace`` let through starts now: its start counts from now in each scope.
        Between the two, the ledger's ``begin`` may take a while under load; counted from the
        earlier time, a start held back could begin less than a window after this one."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for scope in scopes:
                pipe.zadd(self._key(f"starts{SEP}{scope}"), {member: now}, xx=True)
            await pipe.execute()

    async def withdraw_expired(self, now: float) -> list[tuple[str, str]]:
        """Take out the waiting calls whose turn deadline has passed: (member, payload)."""
        return await self._withdrawn("deadline", now)

    async def withdraw_run(self, tenant_id: str, run_id: str) -> list[tuple[str, str]]:
        """Take out every waiting call of a cancelled run: (member, payload)."""
        return await self._withdrawn("run", tenant_id, f"{tenant_id}{SEP}{run_id}{SEP}")

    async def _withdrawn(self, *args: Any) -> list[tuple[str, str]]:
        names = ("waiting", "info", "payloads", "deadlines")
        flat = await self._withdraw(keys=[self._key(n) for n in names], args=list(args))
        return [(text(flat[i]), text(flat[i + 1])) for i in range(0, len(flat), 2)]

    async def throttle(self, tenant_id: str, tool: str, now: float) -> None:
        """An HTTP 429 from ``tool``: slow its buckets (the tool's and its per-tenant one)."""
        scopes = [f"o:{tool}", f"to:{tenant_id}{SEP}{tool}"]
        await self._throttle(
            keys=[self._key("buckets"), self._key("stats")], args=[now, RECOVERY_S, *scopes]
        )

    async def register_worker(
        self,
        pool: str,
        worker_id: str,
        slots: int,
        ttl_s: float,
        now: float,
        *,
        status: WorkerStatus | None = None,
    ) -> None:
        """A worker's slots count in its pool's capacity until ``now + ttl_s``; ``status`` is
        what operators see of it (``workers``)."""
        name = f"{pool}{SEP}{worker_id}"
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(self._key("workers"), {name: now + ttl_s})
            pipe.hset(self._key("slots"), name, slots)
            if status is not None:
                pipe.hset(self._key("worker-status"), name, status.json())
            await pipe.execute()

    async def unregister_worker(self, pool: str, worker_id: str) -> None:
        """A worker that stops takes its slots out of its pool's capacity at once."""
        name = f"{pool}{SEP}{worker_id}"
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrem(self._key("workers"), name)
            pipe.hdel(self._key("slots"), name)
            pipe.hdel(self._key("worker-status"), name)
            await pipe.execute()

    async def workers(self, now: float) -> list[WorkerView]:
        """Every registered worker, live or not yet swept, by pool and id. The status of a
        worker that is no longer registered at all is dropped here (a bounded clean-up: the
        sweep that forgets a stopped worker's slots predates the status)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrange(self._key("workers"), 0, -1, withscores=True)
            pipe.hgetall(self._key("slots"))
            pipe.hgetall(self._key("worker-status"))
            registered, slots, statuses = await pipe.execute()
        views = []
        for raw, until in registered:
            name = text(raw)
            pool, worker_id = name.split(SEP, 1)
            status = statuses.pop(raw, None)
            views.append(
                WorkerView(
                    pool,
                    worker_id,
                    int(slots.get(raw, 0)),
                    float(until),
                    float(until) >= now,
                    WorkerStatus.parse(status) if status else None,
                )
            )
        if statuses:
            await self.redis.hdel(self._key("worker-status"), *statuses)
        return sorted(views, key=lambda v: (v.pool, v.worker_id))

    async def running(self) -> dict[str, int]:
        """Calls admitted and not yet freed, per ``t:tenant``, ``o:tool`` and ``p:pool``."""
        raw = await self.redis.hgetall(self._key("running"))
        return {text(k): int(v) for k, v in raw.items()}

    async def set_limits(self, kind: str, name: str, limits: Limits) -> None:
        """Store a tenant's or a tool's limits (``kind``: tenants | tools); live at once."""
        if limits == Limits():
            await self.redis.hdel(self._key(kind), name)
        else:
            await self.redis.hset(self._key(kind), name, limits.json())

    async def limits(self, kind: str) -> dict[str, Limits]:
        """Every configured tenant's or tool's limits."""
        raw = await self.redis.hgetall(self._key(kind))
        return {text(k): Limits.parse(v) for k, v in raw.items()}

    async def tenants(self) -> list[TenantView]:
        """Configured tenants and tenants with calls running or waiting, by name."""
        configured = await self.limits("tenants")
        running = {
            text(k): int(v) for k, v in (await self.redis.hgetall(self._key("running"))).items()
        }
        names = set(configured) | {
            k.removeprefix(p) for k in running for p in ("t:", "admitted:") if k.startswith(p)
        }
        ordered = sorted(names)
        waiting = await asyncio.gather(
            *(
                self.redis.zlexcount(self._key("waiting"), f"[{name}{SEP}", f"({name}\x20")
                for name in ordered
            )
        )
        return [
            TenantView(
                name,
                configured.get(name, Limits()),
                running.get(f"t:{name}", 0),
                int(count),
                running.get(f"admitted:{name}", 0),
            )
            for name, count in zip(ordered, waiting, strict=True)
        ]

    async def pool_capacity(self, now: float) -> dict[str, int]:
        """Slots per pool, of the workers registered now."""
        live = await self.redis.zrangebyscore(self._key("workers"), now, "+inf")
        slots = await self.redis.hgetall(self._key("slots"))
        capacity: dict[str, int] = {}
        for raw in live:
            name = text(raw) if isinstance(raw, bytes | str) else str(raw)
            pool = name.split(SEP, 1)[0]
            capacity[pool] = capacity.get(pool, 0) + int(slots.get(name.encode(), 0))
        return capacity
