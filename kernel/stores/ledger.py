"""The call ledger in Redis: one hash per (tenant, call_id) and an append-only audit chain.

Every state change that decides whether user code may run is a Lua script, so two workers
that receive the same command (a rebalance, a redelivery) can never both start it:

    planned -> dispatched -> started -> finished -> committed

``started`` is written before any user code runs. A call found ``started`` whose holder's
lease has expired is never run again blindly: its effect is unknown.

Retention: a call whose history is its plain run (one attempt, no approval decision, no
probe, retry, compensation or human verdict) expires ``retention_s`` after it is committed,
its audit chain with it. Any other call is marked ``keep`` and stays until an operator
archives it: that history is what the failure table forbids deleting.
"""

from __future__ import annotations

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
    register_durable_script,
    slot_bound,
    text,
)
from kernel.settings import LEDGER_RETENTION_S
from kernel.stores.keys import SLOT_GROUPS, Keys
from schemas import CallOutcome, ExecutionCommand, TurnConfig

LedgerState = Literal["planned", "dispatched", "started", "finished", "committed"]
BeginVerdict = Literal["run", "done", "stale", "busy", "unknown", "missing", "cancelled"]


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
    the call's identity and its turn's policy come from what the ledger records."""
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
    """What user code raised in the latest failed attempt of a call, for operators: class
    name, message and traceback (bounded, the call's argument values redacted by the worker
    that ran it). A later attempt that succeeds leaves it in place: it says which attempt."""

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

    @property
    def arguments_digest(self) -> str:
        """sha256 of the raw arguments: names what was asked without printing its values."""
        return hashlib.sha256(self.arguments.encode()).hexdigest()

    @classmethod
    def from_hash(cls, tenant_id: str, call_id: str, raw: Mapping[bytes, bytes]) -> LedgerEntry:
        """Decode an HGETALL reply."""
        h = {k.decode(): v.decode() for k, v in raw.items()}
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
        )


AUDIT_FUNCTIONS = """
local function plain_events(call)
  local h = redis.call('HMGET', call, 'created_at', 'dispatched_at', 'attempts',
    'fencing_token', 'dispatch_reason', 'started_at', 'worker_id', 'finished_at', 'outcome',
    'settled_at')
  local events = {}
  if h[1] then events[#events + 1] = cjson.encode({event='planned', at=tonumber(h[1])}) end
  if h[2] then
    events[#events + 1] = cjson.encode({event='dispatched', attempt=tonumber(h[3]),
      fencing_token=tonumber(h[4]), reason=h[5] or 'planned', at=tonumber(h[2])})
  end
  if h[6] then
    events[#events + 1] = cjson.encode({event='started', worker=h[7],
      fencing_token=tonumber(h[4]), at=tonumber(h[6])})
  end
  local ref = redis.call('HMGET', call, 'upstream_ref', 'upstream_ref_at')
  if ref[1] and ref[2] then
    events[#events + 1] = cjson.encode({event='upstream_ref', ref=ref[1], at=tonumber(ref[2])})
  end
  if h[8] and h[9] then
    local o = cjson.decode(h[9])
    events[#events + 1] = cjson.encode({event='finished', status=o.status, effect=o.effect,
      fencing_token=tonumber(h[4]), at=tonumber(h[8])})
  end
  if h[10] then
    events[#events + 1] = cjson.encode({event='settled_without_running', at=tonumber(h[10])})
  end
  return events
end
local function keep(call, audit)
  if redis.call('HGET', call, 'keep') then return end
  if redis.call('LLEN', audit) == 0 then
    local events = plain_events(call)
    if #events > 0 then redis.call('RPUSH', audit, unpack(events)) end
  end
  redis.call('HSET', call, 'keep', 1)
  redis.call('PERSIST', call)
  redis.call('PERSIST', audit)
end
"""
"""Lua: a call's plain run (planned, dispatched, started, finished, or settled without
running) is recorded in its entry alone, each event's facts in fields of their own.
``plain_events`` writes them as the audit chain would hold them. ``keep`` is for the first
event beyond the plain run (an approval, probe, retry, compensation, verdict): it moves the
plain run's events into the chain, and from then on every event is appended there. The call
is kept: it never expires. Most calls never get a chain: an append per transition was a
fifth of the ledger's Redis time, and the chain's key most of a finished call's memory."""

RETAIN_FUNCTION = """
local function retain(call, audit, retention_s)
  if retention_s > 0 and not redis.call('HGET', call, 'keep') then
    redis.call('EXPIRE', call, retention_s)
    redis.call('EXPIRE', audit, retention_s)
  end
end
"""
"""Lua: a committed call expires after ``retention_s`` (0: never) unless it is kept."""

# Issue an attempt of the call ``call`` (audit chain ``audit``); ``h`` is its HMGET of state,
# attempts, fencing_token, keep. Unforced (the planner) it is idempotent: a dispatched call gets
# its current attempt back, a started or finished one nothing. Forced (a retry the
# reconciler decided after a probe proved the call not applied) the fencing token is bumped,
# so the outcome of any older holder is ignored; it also reopens a call whose stored
# outcome is an unknown effect. ``plan`` records a new entry in state planned from its
# fields (fingerprint, idem key, run, turn, tool, pool, arguments, index) and returns its h.
_ISSUE = (
    AUDIT_FUNCTIONS
    + """
local function issue(call, audit, h, force, now, reason)
  local state = h[1]
  if not force then
    if state == 'committed' or state == 'finished' then return {-2, 0} end
    if state == 'dispatched' then return {tonumber(h[2]), tonumber(h[3])} end
    if state ~= 'planned' then return {-3, 0} end
  end
  if force then keep(call, audit) end  -- before the previous attempt's fields change
  local attempt, token = tonumber(h[2]) + 1, tonumber(h[3]) + 1
  if force or h[4] then
    redis.call('HSET', call, 'state', 'dispatched', 'attempts', attempt, 'fencing_token', token)
    redis.call('RPUSH', audit, cjson.encode({event='dispatched', attempt=attempt,
      fencing_token=token, reason=reason, at=now}))
  elseif reason == 'planned' then
    redis.call('HSET', call, 'state', 'dispatched', 'attempts', attempt, 'fencing_token', token,
      'dispatched_at', now)
  else
    redis.call('HSET', call, 'state', 'dispatched', 'attempts', attempt, 'fencing_token', token,
      'dispatched_at', now, 'dispatch_reason', reason)
  end
  return {attempt, token}
end
local function plan(call, now, f)
  redis.call('HSET', call, 'fingerprint', f[1], 'idempotency_key', f[2], 'run_id', f[3],
    'turn_id', f[4], 'tool_name', f[5], 'pool', f[6], 'state', 'planned', 'attempts', 0,
    'fencing_token', 0, 'created_at', now, 'arguments', f[7], 'index', f[8], 'policy', f[9],
    'trace_id', f[10])
  return {'planned', '0', '0'}
end
"""
)

# Record a planned call unless it exists (an existing entry is left as it is); with
# ARGV[10] = '1' also issue its attempt, as _DISPATCH does. ARGV: fingerprint, idem key,
# run, turn, tool, pool, now, arguments, index, dispatch, policy, trace id. Returns
# {attempt, token}, {0, 0} when not dispatching, or a negative attempt when no command should
# be sent.
_CREATE = (
    _ISSUE
    + """
local h = redis.call('HMGET', KEYS[1], 'state', 'attempts', 'fencing_token', 'keep')
if not h[1] then
  h = plan(KEYS[1], ARGV[7], {ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6],
    ARGV[8], ARGV[9], ARGV[11], ARGV[12]})
end
if ARGV[10] ~= '1' then return {0, 0} end
return issue(KEYS[1], KEYS[2], h, false, tonumber(ARGV[7]), 'planned')
"""
)

# A turn whose calls are all new, in one script: KEYS are the run's approval state and its
# wrong-effect hold, then each call's entry and audit chain; ARGV: now, then the 10 fields of
# each call. Records and dispatches every call (attempt 1, token 1 each) only if none of
# those keys exists; returns the number of calls dispatched, 0 when it wrote nothing.
_CREATE_FRESH = (
    _ISSUE
    + """
for i = 1, #KEYS, 1000 do  -- in chunks: Lua's unpack takes at most ~8,000 values
  if redis.call('EXISTS', unpack(KEYS, i, math.min(i + 999, #KEYS))) > 0 then return 0 end
end
local now = tonumber(ARGV[1])
for i = 3, #KEYS, 2 do
  local a = (i - 3) / 2 * 10 + 1
  local h = plan(KEYS[i], ARGV[1], {ARGV[a + 1], ARGV[a + 2], ARGV[a + 3],
    ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], ARGV[a + 7], ARGV[a + 8], ARGV[a + 9], ARGV[a + 10]})
  issue(KEYS[i], KEYS[i + 1], h, false, now, 'planned')
end
return (#KEYS - 2) / 2
"""
)

# ARGV: now, reason, force ('1' or '0').
_DISPATCH = (
    _ISSUE
    + """
local h = redis.call('HMGET', KEYS[1], 'state', 'attempts', 'fencing_token', 'keep')
if not h[1] then return {-1, 0} end
return issue(KEYS[1], KEYS[2], h, ARGV[3] == '1', tonumber(ARGV[1]), ARGV[2])
"""
)

# Workers ask to run attempts, a batch at once (``SlotGroupBatches``). KEYS, four per call:
# entry, audit chain, lease index, cancellation marker. ARGV, five per call: token, worker,
# lease_s, lease member, the tool version it runs ('' for none: compensations). Returns
# verdict, stored outcome ('' unless done) per call.
_BEGIN = """
local function begin(entry, audit, leases, cancelled, a, now)
  local h = redis.call('HMGET', entry, 'state', 'fencing_token', 'lease_until', 'outcome',
    'keep')
  local state, token = h[1], tonumber(h[2])
  if not state then return 'missing', '' end
  if state == 'finished' or state == 'committed' then return 'done', h[4] or '' end
  if tonumber(ARGV[a]) < token then return 'stale', '' end
  if state == 'started' then
    if tonumber(h[3] or '0') > now then return 'busy', '' end
    return 'unknown', ''
  end
  if redis.call('EXISTS', cancelled) == 1 then return 'cancelled', '' end
  local lease_until = now + tonumber(ARGV[a + 2])
  redis.call('HSET', entry, 'state', 'started', 'worker_id', ARGV[a + 1],
    'lease_until', lease_until, 'started_at', now)
  if ARGV[a + 4] ~= '' then redis.call('HSET', entry, 'tool_version', ARGV[a + 4]) end
  redis.call('ZADD', leases, lease_until, ARGV[a + 3])
  if h[5] then
    redis.call('RPUSH', audit, cjson.encode({event='started', worker=ARGV[a + 1],
      fencing_token=token, at=now}))
  end
  return 'run', ''
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local out = {}
for i = 1, #KEYS, 4 do
  local verdict, outcome = begin(KEYS[i], KEYS[i + 1], KEYS[i + 2], KEYS[i + 3],
    (i - 1) / 4 * 5 + 1, now)
  out[#out + 1] = verdict
  out[#out + 1] = outcome
end
return out
"""

# The running attempt recorded the upstream's id for what it did. ARGV: token, ref.
# Returns 0 when the attempt is no longer the current one (fenced off).
_UPSTREAM_REF = """
local h = redis.call('HMGET', KEYS[1], 'state', 'fencing_token', 'keep')
if h[1] ~= 'started' or tonumber(h[2]) ~= tonumber(ARGV[1]) then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('HSET', KEYS[1], 'upstream_ref', ARGV[2], 'upstream_ref_at', now)
if h[3] then
  redis.call('RPUSH', KEYS[2], cjson.encode({event='upstream_ref', ref=ARGV[2],
    fencing_token=tonumber(ARGV[1]), at=now}))
end
return 1
"""

# ARGV: token, worker, lease_s
_RENEW = """
local h = redis.call('HMGET', KEYS[1], 'state', 'fencing_token', 'worker_id')
if h[1] ~= 'started' or tonumber(h[2]) ~= tonumber(ARGV[1]) or h[3] ~= ARGV[2] then return 0 end
local t = redis.call('TIME')
local expiry = tonumber(t[1]) + tonumber(t[2]) / 1e6 + ARGV[3]
redis.call('HSET', KEYS[1], 'lease_until', expiry)
redis.call('ZADD', KEYS[2], 'XX', expiry, ARGV[4])
return 1
"""

# Store the outcomes of current attempts, a batch at once (``SlotGroupBatches``). KEYS, three
# per call: entry, audit chain, lease index. ARGV, seven per call: token, outcome json,
# status, effect, now, lease member, failure json ('' when user code raised nothing).
# Returns ok, stale, done or missing per call.
_FINISH = """
local function finish(entry, audit, leases, a)
  local h = redis.call('HMGET', entry, 'state', 'fencing_token', 'keep')
  if h[1] == false then return 'missing' end
  if tonumber(ARGV[a]) ~= tonumber(h[2]) then return 'stale' end
  if h[1] == 'finished' or h[1] == 'committed' then return 'done' end
  redis.call('HSET', entry, 'state', 'finished', 'outcome', ARGV[a + 1], 'lease_until', 0,
    'finished_at', ARGV[a + 4])
  if ARGV[a + 6] ~= '' then redis.call('HSET', entry, 'failure', ARGV[a + 6]) end
  redis.call('ZREM', leases, ARGV[a + 5])
  if h[3] then
    redis.call('RPUSH', audit, cjson.encode({event='finished', status=ARGV[a + 2],
      effect=ARGV[a + 3], fencing_token=tonumber(ARGV[a]), at=tonumber(ARGV[a + 4])}))
  end
  return 'ok'
end
local out = {}
for i = 1, #KEYS, 3 do
  out[#out + 1] = finish(KEYS[i], KEYS[i + 1], KEYS[i + 2], (i - 1) / 3 * 7 + 1)
end
return out
"""

# An outcome decided without running anything (the planner's rejections). ARGV: json, now,
# retention_s
_SETTLE = (
    RETAIN_FUNCTION
    + """
local h = redis.call('HMGET', KEYS[1], 'state', 'keep')
local state = h[1]
if state == false or state == 'finished' or state == 'committed' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'committed', 'outcome', ARGV[1], 'settled_at', ARGV[2])
if h[2] then
  redis.call('RPUSH', KEYS[2], cjson.encode({event='settled_without_running',
    at=tonumber(ARGV[2])}))
end
retain(KEYS[1], KEYS[2], tonumber(ARGV[3]))
return 1
"""
)

# The reconciler's (or a human's) verdict on a call: replaces the stored outcome, whatever
# the state, and appends why. ARGV: outcome json, event json, member
_RESOLVE = (
    AUDIT_FUNCTIONS
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
keep(KEYS[1], KEYS[2])  -- before the outcome it replaces is gone
redis.call('HSET', KEYS[1], 'state', 'committed', 'outcome', ARGV[1], 'lease_until', 0)
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1
"""
)

# Append one event to a call's audit chain and keep the call. ARGV: the event (JSON), then
# field/value pairs to set on its entry first (an approval decision).
_APPEND = (
    AUDIT_FUNCTIONS
    + """
if #ARGV > 1 then redis.call('HSET', KEYS[1], unpack(ARGV, 2)) end
if redis.call('EXISTS', KEYS[1]) == 1 then keep(KEYS[1], KEYS[2]) end
redis.call('RPUSH', KEYS[2], ARGV[1])
"""
)

# The audit chain, and a plain run's events from the entry (none once the call is kept).
_AUDIT = (
    AUDIT_FUNCTIONS
    + """
local chain = redis.call('LRANGE', KEYS[2], 0, -1)
if redis.call('HGET', KEYS[1], 'keep') then return {chain, {}} end
return {chain, plain_events(KEYS[1])}
"""
)

COMMIT_FUNCTION = (
    RETAIN_FUNCTION
    + """
local function commit(call, audit, retention_s)
  if redis.call('HGET', call, 'state') == 'finished' then
    redis.call('HSET', call, 'state', 'committed')
    retain(call, audit, retention_s)
    return 1
  end
  return 0
end
"""
)
"""Lua: mark the entry ``call`` (its key; ``audit`` its chain) committed, if it is finished,
and let a plain run expire after ``retention_s`` (0: never); 1 when it did. Workers run it
for the outcomes they published (``executors._after_publish``)."""


class Ledger:
    """The Redis call ledger. All writes that gate user code are atomic scripts."""

    def __init__(self, redis: Redis, keys: Keys, retention_s: int = LEDGER_RETENTION_S) -> None:
        self.redis = redis
        self.keys = keys
        self.retention_s = retention_s
        self._create = redis.register_script(_CREATE)
        self._create_fresh = redis.register_script(_CREATE_FRESH)
        self._dispatch = redis.register_script(_DISPATCH)
        # ``started`` must survive a failover before user code runs: it waits for a replica.
        self._begin = register_durable_script(redis, _BEGIN)
        self._begins: SlotGroupBatches[_Step, tuple[bytes, bytes]] = SlotGroupBatches(
            partial(self._batch, self._begin, 2), per_slot_group=slot_bound(redis)
        )
        self._renew = redis.register_script(_RENEW)
        self._upstream_ref = redis.register_script(_UPSTREAM_REF)
        self._finish = redis.register_script(_FINISH)
        self._finishes: SlotGroupBatches[_Step, tuple[bytes]] = SlotGroupBatches(
            partial(self._batch, self._finish, 1), per_slot_group=slot_bound(redis)
        )
        self._settle = redis.register_script(_SETTLE)
        self._resolve = redis.register_script(_RESOLVE)
        self._append = redis.register_script(_APPEND)
        self._audit = redis.register_script(_AUDIT)

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
                    args=[now, "planned", "0"],
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
        force: bool = False,
    ) -> tuple[int, int] | None:
        """(attempt, fencing token) to put on the command, or None when none should be sent.

        Without ``force`` this is idempotent (a redelivered plan re-sends the same attempt);
        ``force`` starts a new attempt and fences off the previous one.
        """
        attempt, token = await self._dispatch(
            keys=[
                self.keys.call(tenant_id, run_id, call_id),
                self.keys.audit(tenant_id, run_id, call_id),
            ],
            args=[time.time(), reason, "1" if force else "0"],
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
