"""The JSON of the fleet page (pools and their workers, tenants' shares, limits) and of bulk
actions (a plan to confirm, what happened to each target)."""

from __future__ import annotations

from typing import Any

from kernel.stores.admission import Limits, WorkerView
from toolfleet.app.bulk import BulkPlan, Target, TargetResult
from toolfleet.app.operations import PoolView, TenantShare

SHOWN_TARGETS = 200
"""A plan lists this many of its targets (and says how many there are)."""


def limits_json(limits: Limits) -> dict[str, Any]:
    """The limits that are set (absent: off)."""
    return {k: v for k, v in limits.__dict__.items() if v is not None}


def _worker_json(view: WorkerView) -> dict[str, Any]:
    status = view.status
    return {
        "worker_id": view.worker_id,
        "slots": view.slots,
        "live": view.live,
        "registered_until": view.registered_until,
        "in_flight": status.in_flight if status else None,
        "build": status.build if status else None,
        "host": status.host if status else None,
        "started_at": status.started_at if status else None,
        "tools": status.tools if status else {},
    }


def pool_json(view: PoolView) -> dict[str, Any]:
    """One pool: capacity, running, lag and its workers."""
    return {
        "name": view.name,
        "capacity": view.capacity,
        "running": view.running,
        "saturation": view.running / view.capacity if view.capacity else None,
        "lag": view.lag,
        "workers": [_worker_json(w) for w in view.workers],
    }


def share_json(share: TenantShare) -> dict[str, Any]:
    """One tenant: its limits, calls, and share against its weight."""
    view = share.view
    return {
        "tenant_id": view.tenant_id,
        "limits": limits_json(view.limits),
        "weight": share.weight,
        "running": view.running,
        "waiting": view.waiting,
        "admitted_total": view.admitted_total,
        "share": share.share,
        "fair_share": share.fair_share,
    }


def _target_json(target: Target) -> dict[str, Any]:
    return {
        "kind": target.kind,
        "tenant_id": target.tenant_id,
        "run_id": target.run_id,
        "call_id": target.call_id,
        "task_id": target.task_id,
        "tool": target.tool,
        "version": target.version,
        "calls": len(target.calls),
    }


def plan_json(plan: BulkPlan) -> dict[str, Any]:
    """A bulk action's plan: how many targets, the first ones, and the digest to confirm."""
    return {
        "action": plan.request.action,
        "count": len(plan.targets),
        "targets": [_target_json(t) for t in plan.targets[:SHOWN_TARGETS]],
        "calls": sum(len(t.calls) for t in plan.targets),
        "digest": plan.digest,
    }


def results_json(bulk_id: str, results: list[TargetResult]) -> dict[str, Any]:
    """What a bulk action did, target by target."""
    return {
        "bulk_id": bulk_id,
        "done": sum(r.ok for r in results),
        "failed": sum(not r.ok for r in results),
        "results": [_target_json(r.target) | {"ok": r.ok, "detail": r.detail} for r in results],
    }
