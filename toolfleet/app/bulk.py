"""Bulk actions: select by search, see what it touches, confirm, act.

Decide pending approvals, resolve or assign human tasks, cancel runs, pin tools. An operator's
bulk action is two requests. ``plan`` resolves a selection into its targets (the
pending approvals, open human tasks or runs it names, within the operator's tenants) and a
digest of them; the operator reads the targets and confirms; ``carry_out`` resolves the
selection again and acts only if the digest is unchanged (what is confirmed is what is done:
a call that was decided meanwhile, or a task that opened since, changes the digest, and the
operator is asked to look again). Each target is acted on as a single action would be, with
the decision signed for the operator (``operations``), and every call a target names gets a
``bulk_action`` entry in its audit chain first, naming the action, the operator and the bulk
action's id, so the call's history says it was part of one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from redis.asyncio import Redis

from kernel.adapters.bus import Bus
from kernel.errors import UsageError
from kernel.settings import Settings
from kernel.stores.door import Stores
from kernel.stores.history import History
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger
from toolfleet.app import operations
from toolfleet.app.operations import Resolution, TenantScope

MAX_TARGETS = 1000
"""The most targets one bulk action touches: a larger selection is refused (narrow it)."""

BulkActionName = Literal["approve", "reject", "resolve", "assign", "cancel", "pin"]


class Selection(BaseModel):
    """What a bulk action applies to; every field narrows it (absent: any)."""

    model_config = ConfigDict(extra="forbid")

    tenant: str | None = None
    tool: str | None = None
    """A tool's name (its lookup key)."""
    run: str | None = None
    task_kind: Literal["unknown_effect", "compensation_approval", "circuit_open"] | None = None
    """Human tasks of this kind only (``resolve``, ``assign``)."""
    task_ids: list[str] | None = Field(default=None, max_length=MAX_TARGETS)
    """These tasks only (``resolve``, ``assign``)."""
    runs: list[str] | None = Field(default=None, max_length=MAX_TARGETS)
    """These runs of ``tenant`` only (``cancel``)."""
    tools: list[str] | None = Field(default=None, max_length=MAX_TARGETS)
    """These tools only (``pin``; absent: every tool, or ``tool``)."""
    rolled_back: bool = False
    """``pin``: only tools whose new calls go to an earlier version than their newest (an
    open circuit passed over it): pinning keeps them there once it closes."""


class BulkRequest(BaseModel):
    """One bulk action: its selection and what to do to each target."""

    model_config = ConfigDict(extra="forbid")

    action: BulkActionName
    selection: Selection = Selection()
    resolution: Resolution | None = None
    """``resolve``: the answer to every selected task."""
    output: str | None = None
    """``resolve`` with ``applied``: the output the model sees."""
    assignee: str | None = Field(default=None, max_length=200)
    """``assign``: who the tasks are assigned to (empty: nobody)."""
    note: str | None = Field(default=None, max_length=2000)
    """Why: the rejection's message, the resolution's note, the cancellation's reason."""
    digest: str | None = None
    """``carry_out``: the digest of the plan the operator confirmed."""

    @model_validator(mode="after")
    def _complete(self) -> BulkRequest:
        if self.action == "assign" and self.assignee is None:
            raise ValueError("assign needs an assignee (empty to unassign)")
        if self.action == "resolve" and self.resolution is None:
            raise ValueError("resolve needs a resolution: " + ", ".join(operations.RESOLUTIONS))
        if self.action == "pin" and self.selection.tenant is not None:
            raise ValueError("a pin touches every tenant: select tools, not a tenant")
        if self.action == "cancel" and not (self.selection.tenant and self.selection.runs):
            raise ValueError("cancel needs a tenant and the runs to cancel (selection.runs)")
        return self


@dataclass(frozen=True)
class Target:
    """One thing a bulk action touches."""

    kind: Literal["call", "task", "run", "tool"]
    tenant_id: str
    run_id: str | None
    call_id: str | None
    task_id: str | None
    tool: str | None
    calls: tuple[tuple[str, str], ...] = ()
    """(run, call) of every call it names (a task's call, a circuit's calls)."""
    version: str | None = None
    """``pin``: the version the tool is pinned to (where its new calls go now)."""

    @property
    def key(self) -> str:
        """What identifies it in the digest."""
        parts = (self.kind, self.tenant_id, self.run_id, self.call_id, self.task_id, self.tool)
        return "\x1f".join(p or "" for p in (*parts, self.version))


@dataclass(frozen=True)
class BulkPlan:
    """A selection resolved: its targets and their digest."""

    request: BulkRequest
    targets: list[Target]
    digest: str


@dataclass(frozen=True)
class TargetResult:
    """What happened to one target."""

    target: Target
    ok: bool
    detail: str


class SelectionChangedError(UsageError):
    """The targets are no longer those the operator confirmed: show the plan again."""


async def plan(
    redis: Redis,
    settings: Settings,
    request: BulkRequest,
    *,
    tenant: TenantScope,
    fleet_wide: bool = True,
) -> BulkPlan:
    """The targets ``request`` selects within ``tenant`` (the operator's scope), in a stable
    order, and their digest; an open circuit's task only for one who may act fleet-wide."""
    sel = request.selection
    scope = _narrowed(tenant, sel.tenant)
    targets: list[Target]
    if request.action in ("approve", "reject"):
        pending = await operations.pending_approvals(
            redis, settings, tenant=scope, limit=MAX_TARGETS + 1
        )
        targets = [
            Target(
                "call",
                e.tenant_id,
                e.run_id,
                e.call_id,
                None,
                e.tool_name,
                ((e.run_id, e.call_id),),
            )
            for p in pending
            if p.decision is None
            and (e := p.entry)
            and (sel.tool is None or e.tool_name == sel.tool)
            and (sel.run is None or e.run_id == sel.run)
        ]
    elif request.action in ("resolve", "assign"):
        tasks = await operations.list_tasks(redis, settings, tenant=scope)
        wanted = set(sel.task_ids) if sel.task_ids is not None else None
        targets = [
            Target(
                "task",
                t.tenant_id,
                t.run_id,
                t.call_id,
                t.task_id,
                t.tool_name,
                tuple(operations.task_calls(t)),
            )
            for s in tasks
            if (t := s.task)
            and (wanted is None or t.task_id in wanted)
            and (fleet_wide or t.kind != "circuit_open")
            and (sel.task_kind is None or t.kind == sel.task_kind)
            and (sel.tool is None or t.tool_name == sel.tool)
            and (sel.run is None or t.run_id == sel.run)
        ]
    elif request.action == "pin":
        if not fleet_wide:
            raise operations.NotAllowedError(
                "pinning tools touches every tenant: it needs the admin role"
            )
        targets = await _pins(redis, settings, sel, tenant)
    else:
        assert sel.tenant is not None and sel.runs is not None  # the request's validator
        history = Stores(redis, settings).history()
        targets = [
            Target(
                "run", sel.tenant, r, None, None, None, await _calls_of_run(history, sel.tenant, r)
            )
            for r in sorted(set(sel.runs))
        ]
    if len(targets) > MAX_TARGETS:
        raise UsageError(
            f"the selection holds more than {MAX_TARGETS} targets: narrow it (tenant, tool, run)"
        )
    targets.sort(key=lambda t: t.key)
    return BulkPlan(request, targets, _digest(request, targets))


async def carry_out(
    redis: Redis,
    bus: Bus,
    settings: Settings,
    request: BulkRequest,
    *,
    decided_by: str,
    tenant: TenantScope,
    fleet_wide: bool,
) -> tuple[str, list[TargetResult]]:
    """Act on every target of ``request``'s selection, if they are still those its digest
    names; the bulk action's id and what happened to each target."""
    confirmed = await plan(redis, settings, request, tenant=tenant, fleet_wide=fleet_wide)
    if request.digest != confirmed.digest:
        raise SelectionChangedError(
            f"the selection changed since it was shown ({len(confirmed.targets)} targets now): "
            "look at it again and confirm"
        )
    bulk_id = f"bulk-{uuid.uuid4().hex[:12]}"
    acting = _Acting(redis, bus, settings, decided_by, tenant, fleet_wide, bulk_id)
    ledger = Ledger(redis, Keys.of(settings), settings.ledger_retention_s)
    results = []
    for target in confirmed.targets:
        for run_id, call_id in target.calls:
            await ledger.append_audit(
                target.tenant_id,
                run_id,
                call_id,
                "bulk_action",
                bulk=bulk_id,
                action=request.action,
                by=decided_by,
            )
        try:
            detail = await acting.act(request, target)
        except UsageError as exc:  # decided meanwhile, no longer allowed: said per target
            results.append(TargetResult(target, False, str(exc)))
        else:
            results.append(TargetResult(target, True, detail))
    return bulk_id, results


@dataclass(frozen=True)
class _Acting:
    """Who acts, and with what, for every target of one bulk action."""

    redis: Redis
    bus: Bus
    settings: Settings
    decided_by: str
    tenant: TenantScope
    fleet_wide: bool
    bulk_id: str

    async def act(self, request: BulkRequest, target: Target) -> str:
        """Act on one target as the single action would; what was done."""
        if target.kind == "call":
            assert target.run_id is not None and target.call_id is not None
            await operations.decide_approval(
                self.redis,
                self.bus,
                self.settings,
                tenant_id=target.tenant_id,
                run_id=target.run_id,
                call_id=target.call_id,
                approve=request.action == "approve",
                decided_by=self.decided_by,
                message=request.note,
                tenant=self.tenant,
            )
            return "approved" if request.action == "approve" else "rejected"
        if target.kind == "task" and request.action == "assign":
            assert target.task_id is not None and request.assignee is not None
            await operations.assign_task(
                self.redis, self.settings, target.task_id, request.assignee,
                decided_by=self.decided_by, tenant=self.tenant, fleet_wide=self.fleet_wide,
            )  # fmt: skip
            return f"assigned to {request.assignee}" if request.assignee else "unassigned"
        if target.kind == "task":
            assert target.task_id is not None and request.resolution is not None
            await operations.resolve_task(
                self.redis,
                self.bus,
                self.settings,
                target.task_id,
                request.resolution,
                decided_by=self.decided_by,
                output=request.output,
                note=request.note,
                tenant=self.tenant,
                fleet_wide=self.fleet_wide,
            )
            return f"resolved: {request.resolution}"
        if target.kind == "tool":
            assert target.tool is not None and target.version is not None
            return await operations.pin_tool(
                self.redis, self.settings, target.tool, target.version, tenant=self.tenant
            )
        assert target.run_id is not None
        await operations.cancel_run(
            self.bus, self.settings, tenant_id=target.tenant_id, run_id=target.run_id,
            reason=request.note or f"bulk action {self.bulk_id}", decided_by=self.decided_by,
            tenant=self.tenant,
        )  # fmt: skip
        return "cancellation sent"


async def _pins(
    redis: Redis, settings: Settings, sel: Selection, tenant: TenantScope
) -> list[Target]:
    """Each selected tool, at the version its new calls go to now (pins touch every tenant)."""
    operations.check_fleet_wide(tenant, "pinning tools")
    names = await operations.list_tools(redis, settings)
    wanted = set(sel.tools) if sel.tools is not None else None
    targets = []
    for name in names:
        if (wanted is not None and name not in wanted) or (sel.tool and name != sel.tool):
            continue
        with contextlib.suppress(operations.NotFoundError):  # unpublished meanwhile
            view = await operations.tool_versions(redis, settings, name)
            if sel.rolled_back and not view.choice.passed_over:
                continue
            targets.append(Target("tool", "*", None, None, None, name, version=view.choice.version))
    return targets


def _narrowed(tenant: TenantScope, only: str | None) -> TenantScope:
    """The operator's scope, narrowed to one tenant when the selection names one."""
    if only is None:
        return tenant
    operations.check_tenant(tenant, only, f"tenant {only}")
    return only


async def _calls_of_run(
    history: History, tenant_id: str, run_id: str
) -> tuple[tuple[str, str], ...]:
    """The calls the history knows of a run (its first pages: a bulk action's audit entries
    go to the calls a person could have seen)."""
    page = await history.run(tenant_id, run_id)
    seen = dict.fromkeys(
        str(c["call_id"]) for e in page.entries for c in e.calls if c.get("call_id")
    )
    return tuple((run_id, call) for call in seen)


def _digest(request: BulkRequest, targets: Sequence[Target]) -> str:
    what = request.model_dump(mode="json", exclude={"digest"})
    body = json.dumps({"request": what, "targets": [t.key for t in targets]}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:32]
