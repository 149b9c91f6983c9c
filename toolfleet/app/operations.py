"""What an operator may do, in one place: the ``toolfleet`` operator commands and the live
console (``toolfleet.app.console``) both call these functions.

Each function takes what it touches (a Redis connection, a started ``Bus``, the ``Settings``)
and raises a ``UsageError`` that says what to fix when it cannot act:

- decisions (a task resolution, an approval decision) are signed with the tenant's decision
  key (``DecisionAuth.of(settings).sign``, ``kernel/rules/auth.py``) and published; the
  reconciler or the planner verifies the signature and carries them out;
- circuits and tool pins are written to Redis directly, as they always were;
- ``tenant`` scopes an operator to one tenant or a set of tenants (a console started with
  ``--tenant``, a console user's tenants): another tenant's task, call or approval is refused
  (``NotAllowedError``) and never listed, and so are fleet-wide actions (circuits, pins),
  which touch every tenant; a decision is signed only after this check;
- a call is shown with its arguments' digest, never their values (``call_fields``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from redis.asyncio import Redis

from kernel.adapters.bus import Bus
from kernel.adapters.lag import GroupLag
from kernel.adapters.topics import command_topic
from kernel.errors import UsageError
from kernel.rules.auth import CompletionHandle, DecisionAuth
from kernel.rules.versions import VersionChoice, choose_version, version_order, version_ref
from kernel.settings import Settings
from kernel.stores.admission import Admission, Limits, TenantView, WorkerView
from kernel.stores.circuit import CircuitBreaker, parse_task_call_ref
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger, LedgerEntry
from kernel.stores.registry import (
    ToolDirectory,
    live_versions,
    pin_version,
    pinned_version,
    unpin_version,
)
from kernel.stores.tasks import StoredTask, TaskStore
from schemas import (
    ApprovalDecision,
    CancelRequest,
    CompletionMessage,
    HumanTask,
    TaskResolution,
    ToolSpec,
)

__all__ = [
    "RESOLUTIONS",
    "AlreadyDecidedError",
    "CallView",
    "CompletionEffect",
    "LimitKind",
    "NotAllowedError",
    "NotFoundError",
    "PendingApproval",
    "PoolView",
    "Resolution",
    "TenantScope",
    "TenantShare",
    "ToolVersions",
    "VersionView",
    "assign_task",
    "call_fields",
    "cancel_run",
    "check_fleet_wide",
    "check_tenant",
    "complete_call",
    "decide_approval",
    "list_tasks",
    "list_tools",
    "open_circuits",
    "pending_approvals",
    "pin_tool",
    "pools",
    "read_call",
    "resolve_task",
    "resume_circuit",
    "set_limits",
    "task_calls",
    "tenant_shares",
    "tool_limits",
    "tool_versions",
    "unpin_tool",
    "updated_limits",
]

Resolution = Literal[
    "applied", "not_applied", "wrong_effect", "approve_compensation", "reject_compensation"
]
"""An operator's answer to a human task."""
RESOLUTIONS: tuple[Resolution, ...] = (
    "applied",
    "not_applied",
    "wrong_effect",
    "approve_compensation",
    "reject_compensation",
)
"""What an operator may answer to a human task (``TaskResolution.resolution``)."""

TenantScope = str | Collection[str] | None
"""The tenants an operator acts for: one, a set of them, or None for every tenant."""


class NotFoundError(UsageError):
    """No such task, call or tool version: check the id (the message says where to look)."""


class NotAllowedError(UsageError):
    """This operator may not do that here: another tenant's data on an operator scoped to one
    tenant, or a fleet-wide action there (the message says which)."""


class AlreadyDecidedError(UsageError):
    """The call was decided already, or has run: a second decision would change nothing."""


def _allowed(tenant: TenantScope) -> frozenset[str] | None:
    if tenant is None:
        return None
    return frozenset((tenant,)) if isinstance(tenant, str) else frozenset(tenant)


def _names(allowed: frozenset[str]) -> str:
    return ", ".join(sorted(allowed)) or "no tenant"


def check_tenant(tenant: TenantScope, owner: str, what: str) -> None:
    """Refuse (``NotAllowedError``) ``what`` of tenant ``owner`` to an operator of ``tenant``."""
    allowed = _allowed(tenant)
    if allowed is not None and owner not in allowed:
        raise NotAllowedError(
            f"{what} belongs to another tenant; this operator acts for {_names(allowed)}"
        )


def check_fleet_wide(tenant: TenantScope, what: str) -> None:
    """Refuse (``NotAllowedError``) ``what``, which touches every tenant, to an operator
    scoped to some."""
    allowed = _allowed(tenant)
    if allowed is not None:
        raise NotAllowedError(
            f"{what} touches every tenant; an operator scoped to {_names(allowed)} may not"
        )


# --- human tasks ------------------------------------------------------------------------------
def _visible(stored: StoredTask, tenant: TenantScope) -> bool:
    """A circuit's task lists calls of every tenant: only an unscoped operator sees it."""
    allowed = _allowed(tenant)
    if allowed is None:
        return True
    return stored.task.tenant_id in allowed and stored.task.kind != "circuit_open"


async def list_tasks(
    redis: Redis,
    settings: Settings,
    *,
    include_resolved: bool = False,
    tenant: TenantScope = None,
) -> list[StoredTask]:
    """Open (or all) human tasks, oldest first; of ``tenant`` only, when given."""
    found = await TaskStore(redis, Keys.of(settings)).all()
    return [
        t for t in found if (include_resolved or t.status != "resolved") and _visible(t, tenant)
    ]


async def resolve_task(
    redis: Redis,
    bus: Bus,
    settings: Settings,
    task_id: str,
    resolution: Resolution,
    *,
    decided_by: str,
    output: str | None = None,
    note: str | None = None,
    tenant: TenantScope = None,
    fleet_wide: bool = True,
) -> TaskResolution:
    """Answer a human task: a TaskResolution signed with the task's tenant's key, published
    on ``task-resolutions`` for the reconciler to carry out. Returns what was sent.
    ``fleet_wide=False`` refuses a task that touches every tenant (an open circuit's) even to
    an operator of every tenant (a console user without the admin role)."""
    stored = await _task_to_act_on(TaskStore(redis, Keys.of(settings)), task_id, tenant, fleet_wide)
    message = TaskResolution(
        tenant_id=stored.task.tenant_id,
        task_id=task_id,
        resolution=resolution,
        output=output,
        note=note,
        decided_by=decided_by,
    )
    signed = DecisionAuth.of(settings).sign(message)
    await bus.publish_and_wait("task-resolutions", stored.task.run_id or task_id, signed)
    return signed


# --- calls ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CallView:
    """A call as an operator sees it: its ledger entry and its audit chain, oldest first."""

    entry: LedgerEntry
    audit: list[dict[str, Any]]

    @property
    def fields(self) -> dict[str, Any]:
        """The entry's fields without argument values (``call_fields``)."""
        return call_fields(self.entry)


async def _task_to_act_on(
    store: TaskStore, task_id: str, tenant: TenantScope, fleet_wide: bool
) -> StoredTask:
    """The task, if this operator may act on it: one of its tenants', and an open circuit's
    (which lists every tenant's calls) only for one who may act fleet-wide."""
    stored = await store.get(task_id)
    if stored is None:
        raise NotFoundError(f"no task {task_id}; see `toolfleet tasks list`")
    check_tenant(tenant, stored.task.tenant_id, f"task {task_id}")
    if stored.task.kind == "circuit_open":
        what = f"task {task_id} (an open circuit's)"
        check_fleet_wide(tenant, what)
        if not fleet_wide:
            raise NotAllowedError(f"{what} touches every tenant: it needs the admin role")
    return stored


async def assign_task(
    redis: Redis,
    settings: Settings,
    task_id: str,
    to: str,
    *,
    decided_by: str,
    tenant: TenantScope = None,
    fleet_wide: bool = True,
) -> StoredTask:
    """Assign an open human task to ``to`` (an identity, as the console names it; empty:
    nobody), so that operators can share the queue; the task's calls' audit chains say who
    assigned it to whom. Returns the task as it is now."""
    store = TaskStore(redis, Keys.of(settings))
    stored = await _task_to_act_on(store, task_id, tenant, fleet_wide)
    if stored.status == "resolved":
        raise AlreadyDecidedError(f"task {task_id} is resolved already: nothing to assign")
    await store.assign(task_id, to, by=decided_by, at=time.time())
    ledger = Ledger(redis, Keys.of(settings), settings.ledger_retention_s)
    for run_id, call_id in task_calls(stored.task):
        await ledger.append_audit(
            stored.task.tenant_id, run_id, call_id, "task_assigned",
            task_id=task_id, to=to or None, by=decided_by,
        )  # fmt: skip
    return await store.get(task_id) or stored


def task_calls(task: HumanTask) -> list[tuple[str, str]]:
    """(run, call) of every call a task names: its own, or an open circuit's (those an
    earlier release listed by bare call id cannot be found)."""
    if task.run_id is not None and task.call_id is not None:
        return [(task.run_id, task.call_id)]
    refs = [parse_task_call_ref(c) for c in task.calls]
    return [(run, call) for run, call in refs if run is not None]


def call_fields(entry: LedgerEntry) -> dict[str, Any]:
    """A ledger entry's fields for operators: everything but the outcome (shown on its own)
    and the arguments, whose sha256 digest names what was asked without printing it.

    ``failures`` is what the tool raised in each failed attempt, oldest first, each a dict:
    ``type``, ``message``, ``traceback`` (at most 16 KiB, argument values and secrets
    redacted), ``attempt``, ``worker_id`` and ``at``; ``failure`` is the latest of them (None
    when no attempt raised).
    """
    fields: dict[str, Any] = {
        k: v for k, v in vars(entry).items() if k not in ("outcome", "arguments")
    }
    fields["arguments_digest"] = entry.arguments_digest
    fields["failure"] = dataclasses.asdict(entry.failure) if entry.failure is not None else None
    fields["failures"] = [dataclasses.asdict(failure) for failure in entry.failures]
    return fields


async def read_call(
    redis: Redis,
    settings: Settings,
    tenant_id: str,
    run_id: str,
    call_id: str,
    *,
    tenant: TenantScope = None,
) -> CallView:
    """A call's ledger entry and audit chain (``run_id`` may be '' with tenant identity
    scope)."""
    check_tenant(tenant, tenant_id, f"call {call_id}")
    ledger = Ledger(redis, Keys.of(settings), settings.ledger_retention_s)
    entry = (await ledger.read(tenant_id, run_id, [call_id])).get(call_id)
    if entry is None:
        raise NotFoundError(f"no call {call_id} for tenant {tenant_id}")
    return CallView(entry, await ledger.audit(tenant_id, run_id, call_id))


CompletionEffect = Literal["applied", "not_executed", "unknown"]
"""What an operator may say became of a deferred call's work."""


async def complete_call(
    redis: Redis,
    bus: Bus,
    settings: Settings,
    tenant_id: str,
    call_id: str,
    *,
    run_id: str = "",
    effect: CompletionEffect,
    output: str | None,
    completed_by: str,
    tenant: TenantScope = None,
) -> CompletionMessage:
    """Complete a deferred call by hand, as the external system it waits for would: a
    completion with the handle of the call's current attempt, signed with its tenant's key,
    published on ``completions`` for the workers of its pool (``run_id`` may be '' with
    tenant identity scope). Returns what was sent."""
    view = await read_call(redis, settings, tenant_id, run_id, call_id, tenant=tenant)
    entry = view.entry
    if entry.state != "deferred":
        raise UsageError(
            f"call {call_id} is {entry.state}, not deferred: only a call whose tool handed "
            "its work over waits for a completion (`toolfleet inspect call` shows it)"
        )
    handle = CompletionHandle(
        tenant_id, entry.run_id, call_id, entry.attempts, entry.fencing_token,
        entry.pool or "default",
    )  # fmt: skip
    message = CompletionMessage(
        tenant_id=tenant_id,
        handle=handle.encode(DecisionAuth.of(settings).handle_key(tenant_id)),
        effect=effect,
        output=output,
        completed_by=completed_by,
    )
    await bus.publish_and_wait("completions", entry.run_id, message)
    return message


# --- approvals --------------------------------------------------------------------------------
@dataclass(frozen=True)
class PendingApproval:
    """A call waiting for an approval decision, and the decision received for it, if any
    (the planner records it; the agent runtime then resumes the turn, which runs or rejects
    the call)."""

    entry: LedgerEntry
    decision: dict[str, Any] | None
    """The latest ``approval_decision`` event of the call's audit chain (approve, by, at)."""


def _undecided(entry: LedgerEntry) -> bool:
    return entry.approval is None and entry.state in ("planned", "dispatched")


async def pending_approvals(
    redis: Redis,
    settings: Settings,
    *,
    tenant: TenantScope = None,
    also: Iterable[tuple[str, str, str]] = (),
    limit: int = 500,
) -> list[PendingApproval]:
    """Calls waiting for an approval decision, the longest waiting first: those the planner
    or a worker asked about (the ledger's index), then any of ``also`` (tenant, run, call:
    interruptions seen in turn results, such as calls held after a wrong effect) that is
    still undecided."""
    ledger = Ledger(redis, Keys.of(settings), settings.ledger_retention_s)
    allowed = _allowed(tenant)
    only = next(iter(allowed)) if allowed is not None and len(allowed) == 1 else None
    entries = [
        e
        for e in await ledger.pending_approvals(only, limit=limit)
        if allowed is None or e.tenant_id in allowed
    ]
    seen = {(e.tenant_id, e.run_id, e.call_id) for e in entries}
    for asked in also:
        tenant_id, run_id, call_id = asked
        if asked in seen or (allowed is not None and tenant_id not in allowed):
            continue
        seen.add(asked)
        entry = (await ledger.read(tenant_id, run_id, [call_id])).get(call_id)
        if entry is not None and _undecided(entry):
            entries.append(entry)
    found = []
    for entry in entries[:limit]:
        chain = await ledger.audit(entry.tenant_id, entry.run_id, entry.call_id)
        decisions = [e for e in chain if e.get("event") == "approval_decision"]
        found.append(PendingApproval(entry, decisions[-1] if decisions else None))
    return found


async def decide_approval(
    redis: Redis,
    bus: Bus,
    settings: Settings,
    *,
    tenant_id: str,
    run_id: str,
    call_id: str,
    approve: bool,
    decided_by: str,
    message: str | None = None,
    tenant: TenantScope = None,
) -> ApprovalDecision:
    """Approve or reject a call that waits for approval: an ApprovalDecision signed with the
    tenant's key, published on ``approvals`` (as ``FleetClient.decide`` does). The planner
    records it; the agent runtime's resumed turn then runs the call, or tells the model it
    was rejected. Returns what was sent."""
    check_tenant(tenant, tenant_id, f"call {call_id}")
    ledger = Ledger(redis, Keys.of(settings), settings.ledger_retention_s)
    entry = (await ledger.read(tenant_id, run_id, [call_id])).get(call_id)
    if entry is None:
        raise NotFoundError(f"no call {call_id} in run {run_id} of tenant {tenant_id}")
    if not _undecided(entry):
        done = entry.approval or entry.state
        raise AlreadyDecidedError(f"call {call_id} is {done} already: nothing to decide")
    decision = ApprovalDecision(
        tenant_id=tenant_id,
        run_id=entry.run_id or run_id,
        call_id=call_id,
        tool_name=entry.tool_name,
        approve=approve,
        message=message,
        decided_by=decided_by,
    )
    signed = DecisionAuth.of(settings).sign(decision)
    await bus.publish_and_wait("approvals", decision.run_id, signed)
    return signed


async def cancel_run(
    bus: Bus,
    settings: Settings,
    *,
    tenant_id: str,
    run_id: str,
    reason: str,
    decided_by: str,
    tenant: TenantScope = None,
) -> CancelRequest:
    """Cancel a run (parent cancellation: none of its calls starts from now on, running ones
    are cancelled): a CancelRequest signed with the tenant's key, published on
    ``cancellations`` (as ``FleetClient.cancel`` does). Returns what was sent."""
    check_tenant(tenant, tenant_id, f"run {run_id}")
    request = CancelRequest(
        tenant_id=tenant_id, run_id=run_id, reason=reason, decided_by=decided_by
    )
    signed = DecisionAuth.of(settings).sign(request)
    await bus.publish_and_wait("cancellations", run_id, signed)
    return signed


# --- circuits and versions --------------------------------------------------------------------
async def open_circuits(redis: Redis, settings: Settings) -> dict[str, dict[str, float]]:
    """Every open circuit (``NAME@VERSION``) and its state: opened_at, failed, calls."""
    return await CircuitBreaker(redis, settings).open_circuits()


async def resume_circuit(
    redis: Redis, settings: Settings, ref: str, *, tenant: TenantScope = None
) -> bool:
    """Close an open circuit (after reconciling the calls its task lists); False when it was
    not open."""
    check_fleet_wide(tenant, f"resuming {ref}")
    return await CircuitBreaker(redis, settings).close(ref)


@dataclass(frozen=True)
class VersionView:
    """One live version of a tool: its spec and its circuit (None: closed)."""

    version: str
    spec: ToolSpec
    circuit: dict[str, float] | None


@dataclass(frozen=True)
class ToolVersions:
    """A tool's live versions (newest first), where new calls go and why, and its pin."""

    name: str
    choice: VersionChoice
    pin: str | None
    auto_rollback: bool
    versions: list[VersionView]


async def list_tools(redis: Redis, settings: Settings) -> list[str]:
    """The lookup keys of every published tool, sorted."""
    return sorted(await ToolDirectory(redis, Keys.of(settings)).specs())


async def _live_or_fail(redis: Redis, keys: Keys, name: str) -> dict[str, ToolSpec]:
    live = await live_versions(redis, keys, name)
    if not live:
        raise NotFoundError(f"no tool {name} in the registry; is its pool running?")
    return live


async def tool_versions(redis: Redis, settings: Settings, name: str) -> ToolVersions:
    """A tool's live versions, which one new calls go to and why, its pin and circuits."""
    keys = Keys.of(settings)
    live = await _live_or_fail(redis, keys, name)
    pin = await pinned_version(redis, keys, name)
    circuits = await CircuitBreaker(redis, settings).states([version_ref(name, v) for v in live])
    opened = {ref for ref, state in circuits.items() if state is not None}
    auto = settings.auto_rollback
    choice = choose_version(name, live, opened, pin=pin, auto_rollback=auto)
    versions = [
        VersionView(v, live[v], circuits[version_ref(name, v)])
        for v in reversed(version_order(live))
    ]
    return ToolVersions(name, choice, pin, auto, versions)


async def pin_tool(
    redis: Redis, settings: Settings, name: str, version: str, *, tenant: TenantScope = None
) -> str:
    """Send new calls of ``name`` to a live ``version`` (a rollback, or a pin); the ledger and
    human tasks are left as they are. Returns what happened, for the operator."""
    check_fleet_wide(tenant, f"pinning {name}")
    keys = Keys.of(settings)
    live = await _live_or_fail(redis, keys, name)
    if version not in live:
        versions = ", ".join(version_order(live))
        raise UsageError(
            f"{version_ref(name, version)} is not live; live versions of {name}: {versions}"
        )
    await pin_version(redis, keys, name, version)
    return (
        f"{name}: new calls go to {version_ref(name, version)} (pinned; planners pick it up "
        f"within {settings.registry_cache_s:g} s). Open circuit tasks stay open until their "
        "calls are reconciled."
    )


async def unpin_tool(
    redis: Redis, settings: Settings, name: str, *, tenant: TenantScope = None
) -> bool:
    """Drop ``name``'s pin: new calls go to the newest healthy live version again. False: it
    was not pinned."""
    check_fleet_wide(tenant, f"unpinning {name}")
    return await unpin_version(redis, Keys.of(settings), name)


# --- pools, workers, tenants and limits (admission) -------------------------------------------
@dataclass(frozen=True)
class PoolView:
    """One worker pool: its capacity, what runs, how far its workers are behind."""

    name: str
    capacity: int
    """Slots of the workers registered now."""
    running: int
    """Calls admitted to it and not yet freed."""
    lag: int | None
    """Commands its workers' group has not committed yet (None: the broker did not say)."""
    workers: list[WorkerView]


async def pools(
    redis: Redis, settings: Settings, lag: GroupLag | None, now: float
) -> list[PoolView]:
    """Every pool with a registered worker or a running call, by name (fleet-wide facts: no
    tenant's calls are named)."""
    admission = Admission.of(redis, Keys.of(settings), settings)
    workers = await admission.workers(now)
    running = await admission.running()
    names = sorted({w.pool for w in workers} | {k[2:] for k in running if k.startswith("p:")})
    views = []
    for name in names:
        mine = [w for w in workers if w.pool == name]
        behind = await lag.of(f"workers.{name}", command_topic(name)) if lag else None
        capacity = sum(w.slots for w in mine if w.live)
        views.append(PoolView(name, capacity, running.get(f"p:{name}", 0), behind, mine))
    return views


@dataclass(frozen=True)
class TenantShare:
    """One tenant's limits and its share of the fleet now, against what its weight gives."""

    view: TenantView
    weight: float
    share: float
    """Of the calls running now, the fraction that are its (0 when nothing runs)."""
    fair_share: float | None
    """Its weight over the weights of tenants with calls running or waiting (None: idle)."""


async def tenant_shares(
    redis: Redis, settings: Settings, *, tenant: TenantScope = None
) -> tuple[Limits, list[TenantShare]]:
    """The defaults for tenants nobody configured, and every configured or busy tenant in
    ``tenant``'s scope (shares are over the whole fleet)."""
    admission = Admission.of(redis, Keys.of(settings), settings)
    views = await admission.tenants()
    default_weight = admission.default_tenant.weight or 1.0

    def weight(view: TenantView) -> float:
        return view.limits.weight or default_weight

    busy = [v for v in views if v.running or v.waiting]
    running = sum(v.running for v in views)
    weights = sum(weight(v) for v in busy)
    allowed = _allowed(tenant)
    return admission.default_tenant, [
        TenantShare(
            v,
            weight(v),
            v.running / running if running else 0.0,
            weight(v) / weights if (v.running or v.waiting) and weights else None,
        )
        for v in views
        if allowed is None or v.tenant_id in allowed
    ]


async def tool_limits(redis: Redis, settings: Settings) -> dict[str, Limits]:
    """Every tool with limits (its lookup key)."""
    return await Admission.of(redis, Keys.of(settings), settings).limits("tools")


LimitKind = Literal["tenants", "tools"]
"""Whose limits: a tenant's or a tool's."""


def updated_limits(current: Limits, *, clear: bool = False, **changes: Any) -> Limits:
    """``current`` with ``changes`` (None keeps a value); ``clear`` starts from no limits."""
    base = Limits() if clear else current
    return Limits(**(base.__dict__ | {k: v for k, v in changes.items() if v is not None}))


async def set_limits(
    redis: Redis,
    settings: Settings,
    kind: LimitKind,
    name: str,
    *,
    clear: bool = False,
    tenant: TenantScope = None,
    **changes: Any,
) -> Limits:
    """Change a tenant's or a tool's limits, live for the next admission; returns them. A
    tenant's limits decide what every other tenant gets: fleet-wide, as a tool's are."""
    check_fleet_wide(tenant, f"changing the limits of {name}")
    takes = set(Limits.__dataclass_fields__) - (
        {"tenant_rate", "tenant_burst"} if kind == "tenants" else {"weight"}
    )
    if unknown := set(changes) - takes:
        raise UsageError(
            f"{kind[:-1]} limits have no {', '.join(sorted(unknown))}; "
            f"give any of {', '.join(sorted(takes))}"
        )
    for key, value in changes.items():
        if value is not None and (not isinstance(value, int | float) or value <= 0):
            raise UsageError(f"{key} must be a number above 0, got {value!r}")
    admission = Admission.of(redis, Keys.of(settings), settings)
    current = (await admission.limits(kind)).get(name, Limits())
    new = updated_limits(current, clear=clear, **changes)
    await admission.set_limits(kind, name, new)
    return new
