"""The call ledger in Redis: one hash per (tenant, call_id) and an append-only audit chain.

Every state change that decides whether user code may run is a Lua script
(``kernel/stores/lua/ledger/``), so two workers that receive the same command (a rebalance, a
redelivery) can never both start it:

    planned -> dispatched -> started -> finished -> committed

``started`` is written before any user code runs. A call found ``started`` whose holder's
lease has expired is never run again blindly: its effect is unknown.

Retention: a call whose history is its plain run (one attempt, no approval decision, no
probe, retry, compensation or human verdict) expires ``retention_s`` after it is committed,
its audit chain with it. Any other call is marked ``keep`` and stays until an operator
archives it: that history is what the failure table forbids deleting.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, NamedTuple, cast

from redis.asyncio import Redis

from kernel.adapters.redis import (
    HashFields,
    SlotGroupBatches,
    slot_bound,
    text,
)
from kernel.settings import LEDGER_RETENTION_S
from kernel.stores.keys import SLOT_GROUPS, Keys
from kernel.stores.schema import check_record
from kernel.stores.scripts import script
from schemas import CallOutcome, ExecutionCommand, TurnConfig

LedgerState = Literal["planned", "dispatched", "started", "deferred", "finished", "committed"]
BeginVerdict = Literal[
    "run", "done", "stale", "busy", "unknown", "deferred", "missing", "cancelled"
]


class _Step(NamedTuple):
    """One call's part of a batched script: its keys and its arguments."""

    keys: list[str]
    args: list[Any]


def command_for(
    tenant_id: str,
    call: NewCall | LedgerEntry,
    *,
    attempt: int,
    token: int,
    kind: Literal["execute", "probe", "compensate"] = "execute",
    approved: bool = True,
    tool_version: str | None = None,
    upstream_ref: str | None = None,
) -> ExecutionCommand:
    """The one way a command for a call is built, by the planner and the reconciler alike:
    the call's identity and its turn's policy come from what the ledger records. A later
    attempt of a call that sent heartbeats carries their newest details."""
    policy = call.policy
    now = time.time()
    return ExecutionCommand(
        tenant_id=tenant_id,
        run_id=call.run_id,
        turn_id=call.turn_id,
        call_id=call.call_id,
        kind=kind,
        tool_name=call.tool_name,
        tool_version=tool_version,
        arguments=call.arguments,
        index=call.index,
        pool=call.pool or "default",
        attempt=attempt,
        fencing_token=token,
        idempotency_key=call.idempotency_key,
        fingerprint=call.fingerprint,
        approved=approved,
        failure_policy=policy.failure_policy,
        pre_approval_guardrails=policy.pre_approval_guardrails,
        deadline_at=now + policy.deadline_s if policy.deadline_s else None,
        capped=policy.capped,
        upstream_ref=upstream_ref,
        heartbeat_details=(
            call.heartbeat_details if kind == "execute" and isinstance(call, LedgerEntry) else None
        ),
        issued_at=now,
    )


def lease_member(tenant_id: str, run_id: str, call_id: str) -> str:
    """Member of a lease index for one call."""
    return f"{tenant_id}\x1f{run_id}\x1f{call_id}"


@dataclass(frozen=True)
class CallPolicy:
    """What a call's turn asked of its execution. Kept in the ledger, so every command for the
    call (the first, a retry after a lost worker, a probe, a compensation) carries it."""

    failure_policy: Literal["error_as_output", "fail_turn"] = "error_as_output"
    pre_approval_guardrails: bool = False
    deadline_s: float | None = None
    """The turn's time budget; each command's ``deadline_at`` counts it from its issue."""
    capped: bool = False
    """The turn has max_concurrency: its outcomes free slots at the planner."""

    @classmethod
    def of(cls, config: TurnConfig) -> CallPolicy:
        """The policy of a turn with ``config``."""
        return cls(
            failure_policy=config.failure_policy,
            pre_approval_guardrails=config.pre_approval_guardrails,
            deadline_s=config.deadline_s,
            capped=config.max_concurrency is not None,
        )

    def encode(self) -> str:
        """The ledger field's value."""
        return _policy_json(self)

    @classmethod
    def decode(cls, raw: str | None) -> CallPolicy:
        """The policy a ledger field holds (the defaults when it holds none)."""
        return cls(**json.loads(raw)) if raw else cls()


@functools.lru_cache(maxsize=1024)
def _policy_json(policy: CallPolicy) -> str:
    """A policy's JSON (a turn's calls share their policy, and few policies exist)."""
    return json.dumps(dataclasses.asdict(policy), separators=(",", ":"))


@dataclass(frozen=True)
class NewCall:
    """What the planner records for a call before dispatching it."""

    call_id: str
    fingerprint: str
    idempotency_key: str
    run_id: str
    turn_id: int
    tool_name: str
    pool: str | None
    arguments: str = ""
    index: int = 0
    """Position among the response's function calls."""
    policy: CallPolicy = CallPolicy()
    trace_id: str = ""
    """The trace of the turn that planned it ('' when none is current)."""


@dataclass(frozen=True)
class CallFailure:
    """What user code raised in one failed attempt of a call, for operators: class name,
    message and traceback (bounded, the call's argument values and secrets redacted by the
    worker that ran it), and which attempt. Every failed attempt keeps its own: the latest
    in the entry's ``failure`` field, each earlier one in ``failure:<attempt>``."""

    type: str
    message: str
    traceback: str
    attempt: int
    worker_id: str | None = None
    at: float = 0.0

    def encode(self) -> str:
        """The ledger field's value."""
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def decode(cls, raw: str | None) -> CallFailure | None:
        """The record a ledger field holds (None when it holds none, or not one of these)."""
        if not raw:
            return None
        try:
            data = json.loads(raw)
            return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})
        except (ValueError, TypeError):
            return None


@dataclass(frozen=True)
class RunDecision:
    """A person's approval decision as its run keeps it, for one call or sticky for a tool:
    approve or reject, with the message the model sees on a rejection."""

    approve: bool
    message: str | None = None

    def encode(self) -> str:
        """The value of its field in the run's decisions hash."""
        return json.dumps({"approve": self.approve, "message": self.message})

    @classmethod
    def decode(cls, raw: bytes | str) -> RunDecision:
        """The decision a field of the run's decisions hash holds."""
        data = json.loads(raw)
        return cls(bool(data["approve"]), data.get("message"))


@dataclass(frozen=True)
class RunDecisions:
    """A run's approval decisions received so far: per call id, and sticky per tool."""

    per_call: dict[str, RunDecision] = dataclasses.field(default_factory=dict)
    sticky: dict[str, RunDecision] = dataclasses.field(default_factory=dict)
    """Keyed by the tool's lookup key (namespace.name or name)."""


@dataclass(frozen=True)
class LedgerEntry:
    """A call's ledger entry as read from Redis."""

    tenant_id: str
    call_id: str
    fingerprint: str
    state: LedgerState
    idempotency_key: str
    run_id: str
    turn_id: int
    tool_name: str
    pool: str | None
    arguments: str
    index: int
    attempts: int
    fencing_token: int
    outcome: CallOutcome | None
    approval: Literal["approved", "rejected"] | None
    approval_message: str | None
    pending_approval: bool
    lease_until: float
    worker_id: str | None
    upstream_ref: str | None = None
    """The upstream's own id for what the call did (ticket T-9), as the tool recorded it."""
    tool_version: str | None = None
    """The tool version the latest attempt ran on."""
    policy: CallPolicy = CallPolicy()
    trace_id: str | None = None
    """The OpenTelemetry trace (32 hex digits) of the turn that planned the call."""
    failure: CallFailure | None = None
    """What the tool raised in its latest failed attempt (type, message, traceback)."""
    failures: tuple[CallFailure, ...] = ()
    """What the tool raised in each failed attempt, by attempt (the latest is ``failure``)."""
    heartbeat_details: str | None = None
    """The newest details (JSON) a running attempt sent with ``ctx.heartbeat``: a later
    attempt is given them."""
    heartbeat_at: float | None = None
    """When they were written (Unix time)."""
    deferred_until: float | None = None
    """For a deferred call: when its completion is due (Unix time)."""

    @property
    def arguments_digest(self) -> str:
        """sha256 of the raw arguments: names what was asked without printing its values."""
        return hashlib.sha256(self.arguments.encode()).hexdigest()

    @classmethod
    def from_hash(cls, tenant_id: str, call_id: str, raw: Mapping[bytes, bytes]) -> LedgerEntry:
        """Decode an HGETALL reply."""
        h = {k.decode(): v.decode() for k, v in raw.items()}
        check_record("ledger entry", h.get("v"))
        approval = h.get("approval") or None
        return cls(
            tenant_id=tenant_id,
            call_id=call_id,
            fingerprint=h.get("fingerprint", ""),
            state=h.get("state", "planned"),  # type: ignore[arg-type]
            idempotency_key=h.get("idempotency_key", ""),
            run_id=h.get("run_id", ""),
            turn_id=int(h.get("turn_id", "0")),
            tool_name=h.get("tool_name", ""),
            pool=h.get("pool") or None,
            arguments=h.get("arguments", ""),
            index=int(h.get("index", "0")),
            attempts=int(h.get("attempts", "0")),
            fencing_token=int(h.get("fencing_token", "0")),
            outcome=CallOutcome.model_validate_json(h["outcome"]) if h.get("outcome") else None,
            approval=approval,  # type: ignore[arg-type]
            approval_message=h.get("approval_message") or None,
            pending_approval=h.get("pending_approval") == "1",
            lease_until=float(h.get("lease_until", "0")),
            worker_id=h.get("worker_id") or None,
            upstream_ref=h.get("upstream_ref") or None,
            tool_version=h.get("tool_version") or None,
            policy=CallPolicy.decode(h.get("policy")),
            trace_id=h.get("trace_id") or None,
            failure=CallFailure.decode(h.get("failure")),
            failures=_failures(h),
            heartbeat_details=h.get("heartbeat") or None,
            heartbeat_at=float(h["heartbeat_at"]) if h.get("heartbeat_at") else None,
            deferred_until=float(h["deferred_until"]) if h.get("deferred_until") else None,
        )


def _failures(h: Mapping[str, str]) -> tuple[CallFailure, ...]:
    """Every failed attempt's record in an entry's fields, by attempt (finish.lua keeps the
    latest in ``failure`` and moves each earlier one to ``failure:<attempt>``)."""
    found: dict[int, CallFailure] = {}
    for name, raw in h.items():
        if name.startswith("failure:") and (failure := CallFailure.decode(raw)) is not None:
            found[failure.attempt] = failure
    latest = CallFailure.decode(h.get("failure"))
    if latest is not None:
        found[latest.attempt] = latest
    return tuple(found[attempt] for attempt in sorted(found))


# The scripts (kernel/stores/lua/ledger/): every state change that decides whether user code
# may run. Each file says which keys and arguments it takes and what it returns.
_CREATE = script("ledger/create")
_CREATE_FRESH = script("ledger/create_fresh")
_DISPATCH = script("ledger/dispatch")
_BEGIN = script("ledger/begin")
_UPSTREAM_REF = script("ledger/upstream_ref")
_RENEW = script("ledger/renew")
_HEARTBEAT = script("ledger/heartbeat")
_NEVER_STARTED = script("ledger/never_started")
_DEFER = script("ledger/defer")
_COMPLETE = script("ledger/complete")
_EXPIRE_DEFERRAL = script("ledger/expire_deferral")
_FINISH = script("ledger/finish")
_SETTLE = script("ledger/settle")
_RESOLVE = script("ledger/resolve")
_APPEND = script("ledger/append")
_AUDIT = script("ledger/audit")
_COMMIT = script("ledger/commit")


class Ledger:
    """The Redis call ledger. All writes that gate user code are atomic scripts."""

    def __init__(self, redis: Redis, keys: Keys, retention_s: int = LEDGER_RETENTION_S) -> None:
        self.redis = redis
        self.keys = keys
        self.retention_s = retention_s
        self._create = _CREATE.register(redis)
        self._create_fresh = _CREATE_FRESH.register(redis)
        self._dispatch = _DISPATCH.register(redis)
        # ``started`` must survive a failover before user code runs: it waits for a replica.
        self._begin = _BEGIN.register_durable(redis)
        self._begins: SlotGroupBatches[_Step, tuple[bytes, bytes]] = SlotGroupBatches(
            partial(self._batch, self._begin, 2), per_slot_group=slot_bound(redis)
        )
        self._renew = _RENEW.register(redis)
        self._heartbeat = _HEARTBEAT.register(redis)
        self._never_started = _NEVER_STARTED.register(redis)
        self._defer = _DEFER.register(redis)
        self._complete = _COMPLETE.register_durable(redis)  # as _finish
        self._expire_deferral = _EXPIRE_DEFERRAL.register(redis)
        self._upstream_ref = _UPSTREAM_REF.register(redis)
        # The end of a call is what its outcome on Kafka says: a failover must not take it
        # back once that is published (the worker publishes it right after).
        self._finish = _FINISH.register_durable(redis)
        self._finishes: SlotGroupBatches[_Step, tuple[bytes]] = SlotGroupBatches(
            partial(self._batch, self._finish, 1), per_slot_group=slot_bound(redis)
        )
        self._settle = _SETTLE.register(redis)
        self._resolve = _RESOLVE.register(redis)
        self._append = _APPEND.register(redis)
        self._audit = _AUDIT.register(redis)
        self._commit = _COMMIT.register(redis)
        self._per_slot_group = slot_bound(redis)

    async def read(
        self, tenant_id: str, run_id: str, call_ids: Iterable[str]
    ) -> dict[str, LedgerEntry]:
        """The entries that exist among ``call_ids``, in one round trip."""
        ids = list(dict.fromkeys(call_ids))
        if not ids:
            return {}
        async with self.redis.pipeline(transaction=False) as pipe:
            for call_id in ids:
                pipe.hgetall(self.keys.call(tenant_id, run_id, call_id))
            replies = await pipe.execute()
        return {
            call_id: LedgerEntry.from_hash(tenant_id, call_id, raw)
            for call_id, raw in zip(ids, replies, strict=True)
            if raw
        }

    async def create(
        self,
        tenant_id: str,
        run_id: str,
        calls: Iterable[NewCall],
        dispatch: Iterable[str] = (),
    ) -> list[tuple[int, int] | None]:
        """Record planned calls (an existing entry is left exactly as it is), then ``dispatch``
        the given ones (idempotent, as ``dispatch_many``), in one round trip and that order."""
        now = time.time()
        dispatch = list(dispatch)
        now_too = set(dispatch)
        issued: dict[str, tuple[int, int] | None] = {}
        async with self.redis.pipeline(transaction=False) as pipe:
            # A call created and dispatched here takes one script, not two.
            for c in calls:
                issued[c.call_id] = None
                await self._create(
                    keys=[
                        self.keys.call(tenant_id, c.run_id, c.call_id),
                        self.keys.audit(tenant_id, c.run_id, c.call_id),
                    ],
                    args=[
                        c.fingerprint,
                        c.idempotency_key,
                        c.run_id,
                        c.turn_id,
                        c.tool_name,
                        c.pool or "",
                        now,
                        c.arguments,
                        c.index,
                        "1" if c.call_id in now_too else "0",
                        c.policy.encode(),
                        c.trace_id,
                    ],
                    client=pipe,
                )
            others = [call_id for call_id in dispatch if call_id not in issued]
            for call_id in others:
                await self._dispatch(
                    keys=[
                        self.keys.call(tenant_id, run_id, call_id),
                        self.keys.audit(tenant_id, run_id, call_id),
                    ],
                    args=[now, "planned", ""],  # not a retry: no attempt to follow
                    client=pipe,
                )
            replies = await pipe.execute()
        for call_id, (attempt, token) in zip([*issued, *others], replies, strict=True):
            issued[call_id] = None if int(attempt) <= 0 else (int(attempt), int(token))
        return [issued[call_id] for call_id in dispatch]

    async def create_fresh(
        self, tenant_id: str, run_id: str, calls: list[NewCall]
    ) -> list[tuple[int, int]] | None:
        """Record and dispatch ``calls`` in one script, only if none of them has an entry or
        an audit chain yet and the run has no approval decisions and no wrong-effect hold:
        (attempt, fencing token)
        per call, as ``create`` returns them; None when it wrote nothing (the caller then
        reads the ledger and plans as usual)."""
        keys = [self.keys.approvals(tenant_id, run_id), self.keys.held(tenant_id, run_id)]
        args: list[Any] = [time.time()]
        for c in calls:
            keys += [
                self.keys.call(tenant_id, run_id, c.call_id),
                self.keys.audit(tenant_id, run_id, c.call_id),
            ]
            args += [c.fingerprint, c.idempotency_key, c.run_id, c.turn_id, c.tool_name,
                     c.pool or "", c.arguments, c.index, c.policy.encode(), c.trace_id]  # fmt: skip
        if int(await self._create_fresh(keys=keys, args=args)) != len(calls):
            return None
        return [(1, 1)] * len(calls)  # a new call's first attempt, as _ISSUE numbers it

    async def dispatch(
        self,
        tenant_id: str,
        run_id: str,
        call_id: str,
        reason: str = "planned",
        *,
        retry_after: int | None = None,
    ) -> tuple[int, int] | None:
        """(attempt, fencing token) to put on the command, or None when none should be sent.

        A planned call's first attempt; idempotent (a redelivered plan re-sends the same
        attempt). With ``retry_after`` (the fencing token of the attempt to retry), a new
        attempt that fences that one off, if it is still the latest; idempotent too: the retry
        carried out again gets the attempt it issued, while still dispatched, and no other.
        """
        attempt, token = await self._dispatch(
            keys=[
                self.keys.call(tenant_id, run_id, call_id),
                self.keys.audit(tenant_id, run_id, call_id),
            ],
            args=[time.time(), reason, "" if retry_after is None else retry_after],
        )
        if int(attempt) < 0:
            return None
        return int(attempt), int(token)

    async def dispatch_many(
        self, tenant_id: str, run_id: str, call_ids: list[str]
    ) -> list[tuple[int, int] | None]:
        """``dispatch`` (idempotent) for several calls of a run in one round trip."""
        return await self.create(tenant_id, run_id, (), dispatch=call_ids)

    async def begin(
        self,
        tenant_id: str,
        run_id: str,
        call_id: str,
        *,
        token: int,
        worker_id: str,
        lease_s: float,
        unless_cancelled: bool = True,
        tool_version: str | None = None,
    ) -> tuple[BeginVerdict, CallOutcome | None]:
        """May this worker run this attempt now? ``run`` means ``started`` is durably written:
        fsynced, and on as many replicas as the client waits for. ``UnreplicatedWriteError``
        means it reached the primary alone: the call counts as started and must not run.

        With ``unless_cancelled``, a call of a cancelled run never starts (``cancelled``). The
        ``tool_version`` that runs is recorded, so retries and probes go to the same version.
        """
        # A key of the run's slot group that is never set stands for "do not check".
        cancelled = self.keys.cancelled(tenant_id, run_id)
        group = self.keys.group(tenant_id, run_id)
        step = _Step(
            [
                self.keys.call(tenant_id, run_id, call_id),
                self.keys.audit(tenant_id, run_id, call_id),
                self.keys.leases(group),
                cancelled if unless_cancelled else f"{cancelled}\x1fnever",
            ],
            [
                token, worker_id, lease_s, lease_member(tenant_id, run_id, call_id),
                tool_version or "",
            ],
        )  # fmt: skip
        verdict, outcome = await self._begins.submit(group, step)
        stored = CallOutcome.model_validate_json(outcome) if outcome else None
        return cast(BeginVerdict, verdict.decode()), stored

    @staticmethod
    async def _batch(
        script: Callable[..., Awaitable[Any]], width: int, steps: list[_Step]
    ) -> list[tuple[Any, ...]]:
        """Run ``script`` once for ``steps`` (their keys and arguments one after another):
        its flat reply, ``width`` values per step."""
        keys: list[str] = []
        args: list[Any] = []
        for step in steps:
            keys += step.keys
            args += step.args
        flat = await script(keys=keys, args=args)
        return [tuple(flat[i : i + width]) for i in range(0, len(flat), width)]

    async def renew(
        self,
        tenant_id: str,
        run_id: str,
        call_id: str,
        *,
        token: int,
        worker_id: str,
        lease_s: float,
    ) -> bool:
        """Extend the holder's lease; False when the attempt is no longer this worker's."""
        leases = self.keys.leases(self.keys.group(tenant_id, run_id))
        return bool(
            await self._renew(
                keys=[self.keys.call(tenant_id, run_id, call_id), leases],
                args=[token, worker_id, lease_s, lease_member(tenant_id, run_id, call_id)],
            )
        )

    async def heartbeat(
        self, command: ExecutionCommand, details: str, *, worker_id: str, lease_s: float
    ) -> bool:
        """Keep the newest heartbeat ``details`` (JSON) of the running attempt of ``command``
        and extend its lease; False when that attempt is no longer this worker's (fenced
        off, finished)."""
        tenant, run, call = command.tenant_id, command.run_id, command.call_id
        return bool(
            await self._heartbeat(
                keys=[self.keys.call(tenant, run, call), self.lease_index(tenant, run)],
                args=[
                    command.fencing_token,
                    worker_id,
                    lease_s,
                    lease_member(tenant, run, call),
                    details,
                ],
            )
        )

    async def never_started(self, outcome: CallOutcome, schedule_to_start_s: float) -> str:
        """Store ``outcome`` of an attempt that waited past its schedule-to-start timeout,
        only while nothing has started the call: ``ok``, ``stale``, ``missing``, or the state
        that forbade it (``started``, ``finished``, ``committed``)."""
        tenant, run, call = outcome.tenant_id, outcome.run_id, outcome.call_id
        reply = await self._never_started(
            keys=[self.keys.call(tenant, run, call), self.keys.audit(tenant, run, call)],
            args=[
                outcome.fencing_token,
                outcome.model_dump_json(exclude_none=True),
                time.time(),
                schedule_to_start_s,
            ],
        )
        return text(reply)

    async def defer(self, command: ExecutionCommand, *, worker_id: str, until: float) -> bool:
        """The running attempt of ``command`` handed its work over: the call is ``deferred``
        until a completion ends it, due by ``until`` (its lease index member is due then:
        ``expire_deferral``); False when the attempt is no longer this worker's."""
        tenant, run, call = command.tenant_id, command.run_id, command.call_id
        return bool(
            await self._defer(
                keys=[
                    self.keys.call(tenant, run, call),
                    self.keys.audit(tenant, run, call),
                    self.lease_index(tenant, run),
                ],
                args=[
                    command.fencing_token,
                    worker_id,
                    lease_member(tenant, run, call),
                    until,
                    time.time(),
                ],
            )
        )

    async def expire_deferral(self, tenant_id: str, run_id: str, call_id: str) -> bool:
        """A deferred call whose completion is overdue becomes a started call whose holder is
        gone (a later completion finds it no longer deferred); False when it is not deferred
        or not due yet."""
        return bool(
            await self._expire_deferral(
                keys=[
                    self.keys.call(tenant_id, run_id, call_id),
                    self.keys.audit(tenant_id, run_id, call_id),
                ],
                args=[time.time()],
            )
        )

    async def complete(self, outcome: CallOutcome, completed_by: str) -> str:
        """Store the outcome a deferred call's completion brought: ``ok``, ``stale``,
        ``done`` (completed before), ``missing``, or the state of a call not deferred."""
        tenant, run, call = outcome.tenant_id, outcome.run_id, outcome.call_id
        reply = await self._complete(
            keys=[self.keys.call(tenant, run, call), self.keys.audit(tenant, run, call)],
            args=[
                outcome.fencing_token,
                outcome.model_dump_json(exclude_none=True),
                time.time(),
                completed_by,
            ],
        )
        return text(reply)

    async def record_upstream_ref(self, command: ExecutionCommand, ref: str) -> bool:
        """Store the upstream reference the running attempt of ``command`` recorded (durable
        before it returns); False when that attempt was fenced off meanwhile."""
        return bool(
            await self._upstream_ref(
                keys=[
                    self.keys.call(command.tenant_id, command.run_id, command.call_id),
                    self.keys.audit(command.tenant_id, command.run_id, command.call_id),
                ],
                args=[command.fencing_token, ref],
            )
        )

    async def finish(self, outcome: CallOutcome, failure: CallFailure | None = None) -> str:
        """Store the outcome of the current attempt: ``ok``, ``stale``, ``done`` or ``missing``;
        with ``failure``, what the tool raised (kept until a later failure replaces it)."""
        tenant, run, call = outcome.tenant_id, outcome.run_id, outcome.call_id
        group = self.keys.group(tenant, run)
        step = _Step(
            [
                self.keys.call(tenant, run, call),
                self.keys.audit(tenant, run, call),
                self.keys.leases(group),
            ],
            [
                outcome.fencing_token,
                outcome.model_dump_json(exclude_none=True),
                outcome.status,
                outcome.effect,
                time.time(),
                lease_member(tenant, run, call),
                failure.encode() if failure is not None else "",
            ],
        )
        (reply,) = await self._finishes.submit(group, step)
        return str(reply.decode())

    def commit(self, calls: Iterable[tuple[str, str, str]]) -> asyncio.Future[list[Any]]:
        """Mark the entries of published outcomes committed (those that are finished) and let
        a plain run expire after the retention: ``calls`` are (tenant, run, call_id).

        One script per slot group on a Redis Cluster (a script's keys share a slot), one for
        all on a single server. The scripts are issued as this returns (it is not a
        coroutine): they share a round trip with what the caller issues in the same loop
        turn (the worker's count of the same calls, ``executors.AfterPublish``)."""
        groups: dict[int, list[str]] = {}
        for tenant, run, call in calls:
            slot_group = self.keys.group(tenant, run) if self._per_slot_group else 0
            group = groups.setdefault(slot_group, [])
            group += [self.keys.call(tenant, run, call), self.keys.audit(tenant, run, call)]
        return asyncio.gather(
            *(self._commit(keys=keys, args=[self.retention_s]) for keys in groups.values())
        )

    async def resolve(self, outcome: CallOutcome, event: str, **details: Any) -> bool:
        """Record the reconciler's or a human's verdict as the call's outcome, with why."""
        tenant, run, call = outcome.tenant_id, outcome.run_id, outcome.call_id
        entry = _event(event, {"effect": outcome.effect, **details})
        return bool(
            await self._resolve(
                keys=[
                    self.keys.call(tenant, run, call),
                    self.keys.audit(tenant, run, call),
                    self.keys.leases(self.keys.group(tenant, run)),
                ],
                args=[
                    outcome.model_dump_json(exclude_none=True),
                    entry,
                    lease_member(tenant, run, call),
                ],
            )
        )

    async def expired_leases(self, now: float, limit: int = 100) -> list[tuple[str, str, str]]:
        """(tenant, run, call_id) of started calls whose holder stopped renewing before
        ``now``: at most ``limit`` per slot group, every group in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for group in range(SLOT_GROUPS):
                pipe.zrangebyscore(self.keys.leases(group), 0, now, start=0, num=limit)
            replies = await pipe.execute()
        found = []
        for members in replies:
            for member in members:
                tenant, run, call_id = text(member).split("\x1f", 2)
                found.append((tenant, run, call_id))
        return found

    def lease_index(self, tenant_id: str, run_id: str) -> str:
        """The lease index of a run's slot group."""
        return self.keys.leases(self.keys.group(tenant_id, run_id))

    async def drop_lease(self, tenant_id: str, run_id: str, call_id: str) -> None:
        """Take the call out of its lease index (its expired lease has been dealt with)."""
        member = lease_member(tenant_id, run_id, call_id)
        await self.redis.zrem(self.lease_index(tenant_id, run_id), member)

    async def record_decision(
        self,
        tenant_id: str,
        run_id: str,
        call_id: str,
        decision: RunDecision,
        *,
        sticky: tuple[str, RunDecision] | None = None,
    ) -> None:
        """Keep a person's decision on ``call_id`` among the run's decisions (``decisions``),
        with ``sticky`` (tool lookup key, decision) one for the tool's later calls of the run
        too; they last as long as the run's ledger entries (``retention_s``; 0: forever)."""
        fields: HashFields = {f"call:{call_id}": decision.encode()}
        if sticky is not None:
            tool, always = sticky
            fields[f"sticky:{tool}"] = always.encode()
        key = self.keys.approvals(tenant_id, run_id)
        async with self.redis.pipeline(transaction=False) as pipe:  # one slot: the run's group
            pipe.hset(key, mapping=fields)
            if self.retention_s > 0:
                pipe.expire(key, self.retention_s)
            await pipe.execute()

    async def decisions(self, tenant_id: str, run_id: str) -> RunDecisions:
        """The run's approval decisions (``record_decision``) received so far."""
        raw = await self.redis.hgetall(self.keys.approvals(tenant_id, run_id))
        found = RunDecisions()
        for field, value in raw.items():
            kind, _, name = text(field).partition(":")
            (found.per_call if kind == "call" else found.sticky)[name] = RunDecision.decode(value)
        return found

    async def cancel_run(self, tenant_id: str, run_id: str, reason: str) -> None:
        """Parent cancellation: none of the run's calls starts from now on (``begin`` checks
        it); the mark lasts as long as the run's ledger entries."""
        key = self.keys.cancelled(tenant_id, run_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(key, reason)
            if self.retention_s > 0:
                pipe.expire(key, self.retention_s)
            await pipe.execute()

    async def run_cancelled(self, tenant_id: str, run_id: str) -> bool:
        """Whether the run was cancelled (``cancel_run``): none of its calls starts."""
        return bool(await self.redis.exists(self.keys.cancelled(tenant_id, run_id)))

    async def held(self, tenant_id: str, run_id: str) -> set[str]:
        """The run's calls with a wrong effect not yet compensated (``hold``)."""
        return {text(m) for m in await self.redis.smembers(self.keys.held(tenant_id, run_id))}

    async def hold(self, tenant_id: str, run_id: str, call_id: str) -> None:
        """The call had a wrong effect: until it is compensated (``release_hold``), the run's
        later side-effecting calls wait for a human, and ``create_fresh`` writes nothing."""
        await self.redis.sadd(self.keys.held(tenant_id, run_id), call_id)

    async def release_hold(self, tenant_id: str, run_id: str, call_id: str) -> None:
        """The call's wrong effect was compensated: it no longer holds its run back."""
        await self.redis.srem(self.keys.held(tenant_id, run_id), call_id)

    async def settle(self, outcome: CallOutcome) -> None:
        """Commit an outcome decided without running the call (a rejection, a missing tool)."""
        await self._settle(
            keys=[
                self.keys.call(outcome.tenant_id, outcome.run_id, outcome.call_id),
                self.keys.audit(outcome.tenant_id, outcome.run_id, outcome.call_id),
            ],
            args=[outcome.model_dump_json(exclude_none=True), time.time(), self.retention_s],
        )

    async def set_approval(
        self,
        tenant_id: str,
        run_id: str,
        call_id: str,
        *,
        approve: bool,
        message: str | None,
        by: str,
    ) -> None:
        """Record an approval decision; it is authoritative from now on."""
        fields: HashFields = {
            "approval": "approved" if approve else "rejected",
            "approval_message": message or "",
            "pending_approval": "0",
        }
        event = _event("approval", {str(k): v for k, v in fields.items()}, by=by)
        await self._append(
            keys=[
                self.keys.call(tenant_id, run_id, call_id),
                self.keys.audit(tenant_id, run_id, call_id),
            ],
            args=[event, *(x for pair in fields.items() for x in pair)],
        )
        member = lease_member(tenant_id, run_id, call_id)
        await self.redis.zrem(self._pending_index(tenant_id, run_id), member)

    async def set_pending_approval(self, tenant_id: str, run_id: str, call_id: str) -> None:
        """Remember that the call waits for a decision, so needs_approval is not asked again;
        it joins the index operators list (``pending_approvals``) until it is decided."""
        async with self.redis.pipeline(transaction=False) as pipe:  # one slot: the run's group
            pipe.hset(self.keys.call(tenant_id, run_id, call_id), "pending_approval", "1")
            pipe.zadd(
                self._pending_index(tenant_id, run_id),
                {lease_member(tenant_id, run_id, call_id): time.time()},
                nx=True,
            )
            await pipe.execute()

    def _pending_index(self, tenant_id: str, run_id: str) -> str:
        return self.keys.pending(self.keys.group(tenant_id, run_id))

    async def pending_approvals(
        self, tenant_id: str | None = None, limit: int = 500
    ) -> list[LedgerEntry]:
        """Calls waiting for an approval decision (of ``tenant_id`` only, when given), the
        longest waiting first, at most ``limit``. Entries decided, or gone, since they were
        indexed are dropped from the index on the way."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for group in range(SLOT_GROUPS):
                pipe.zrange(self.keys.pending(group), 0, limit - 1, withscores=True)
            replies = await pipe.execute()
        asked: list[tuple[float, str, str, str]] = []
        for members in replies:
            for member, at in members:
                tenant, run, call_id = text(member).split("\x1f", 2)
                if tenant_id is None or tenant == tenant_id:
                    asked.append((float(at), tenant, run, call_id))
        asked.sort()
        found: list[LedgerEntry] = []
        for _at, tenant, run, call_id in asked:
            if len(found) >= limit:
                break
            entry = (await self.read(tenant, run, [call_id])).get(call_id)
            if entry is None or not entry.pending_approval or entry.approval is not None:
                member = lease_member(tenant, run, call_id)
                await self.redis.zrem(self._pending_index(tenant, run), member)
                continue
            found.append(entry)
        return found

    async def audit(self, tenant_id: str, run_id: str, call_id: str) -> list[dict[str, Any]]:
        """The call's audit chain, oldest first; a plain run's events come from its entry."""
        chain, plain = await self._audit(
            keys=[
                self.keys.call(tenant_id, run_id, call_id),
                self.keys.audit(tenant_id, run_id, call_id),
            ]
        )
        events = [json.loads(e) for e in chain]
        ran = [json.loads(e) for e in plain]
        if not events or not ran:
            return events or ran
        # A chain written before plain runs lived in the entry (0.1) holds some of them.
        known = {(e["event"], e.get("at")) for e in events}
        events += [e for e in ran if (e["event"], e.get("at")) not in known]
        return sorted(events, key=lambda e: float(e.get("at") or 0))

    async def append_audit(
        self, tenant_id: str, run_id: str, call_id: str, event: str, **data: Any
    ) -> None:
        """Append one event (probe, retry, compensation, human decision) to the audit chain;
        the call is kept from now on (see the module's docstring on retention)."""
        await self._append(
            keys=[
                self.keys.call(tenant_id, run_id, call_id),
                self.keys.audit(tenant_id, run_id, call_id),
            ],
            args=[_event(event, data)],
        )


def _event(event: str, data: Mapping[str, Any], **extra: Any) -> str:
    return json.dumps({"event": event, "at": time.time(), **data, **extra}, default=str)
