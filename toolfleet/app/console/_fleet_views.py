"""The JSON of the fleet page: pools and their workers, tenants' shares, limits."""

from __future__ import annotations

from typing import Any

from kernel.stores.admission import Limits, WorkerView
from toolfleet.app.operations import PoolView, TenantShare


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
