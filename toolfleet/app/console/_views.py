"""What the console's JSON API returns: plain dicts built from the stores' records."""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

from kernel.rules.versions import version_ref
from kernel.stores.circuit import parse_task_call_ref
from kernel.stores.ledger import LedgerEntry
from kernel.stores.tasks import StoredTask
from toolfleet.app.operations import CallView, PendingApproval, ToolVersions, call_fields

_TRACE_ID = re.compile(r"[0-9a-f]{32}")


def trace_link(template: str | None, trace_id: str | None) -> dict[str, str | None] | None:
    """A call's trace: its id, and a URL when a template is configured (``{trace_id}`` is
    replaced; an id that is not 32 hex digits is never put into a URL)."""
    if not trace_id:
        return None
    url = None
    if template and _TRACE_ID.fullmatch(trace_id):
        url = template.replace("{trace_id}", trace_id)
    return {"id": trace_id, "url": url}


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def entry_json(entry: LedgerEntry) -> dict[str, Any]:
    """A ledger entry's fields, with the arguments' digest in place of their values (every
    failed attempt's record is the call's ``failures``, not repeated here: ``failure`` is
    the latest)."""
    fields = {k: _jsonable(v) for k, v in call_fields(entry).items() if k != "failures"}
    fields["arguments_bytes"] = len(entry.arguments.encode())
    return fields


def failures_json(entry: LedgerEntry) -> list[dict[str, Any]]:
    """What the tool raised in each failed attempt, oldest first: type, message, traceback
    (bounded, argument values and secrets redacted), attempt, worker and time."""
    return [dataclasses.asdict(failure) for failure in entry.failures]


def call_json(view: CallView, trace_url_template: str | None) -> dict[str, Any]:
    """A call's page: entry, outcome, every failed attempt with its traceback, audit chain,
    upstream reference and trace."""
    entry = view.entry
    outcome = entry.outcome.model_dump(mode="json", exclude_none=True) if entry.outcome else None
    return {
        "entry": entry_json(entry),
        "outcome": outcome,
        "failures": failures_json(entry),
        "audit": view.audit,
        "upstream_ref": entry.upstream_ref,
        "trace": trace_link(trace_url_template, entry.trace_id),
    }


def task_json(stored: StoredTask) -> dict[str, Any]:
    """A human task, where it stands, and how it was resolved (without the signature). A
    circuit's task lists its calls as ``RUN/CALL`` (``calls``); ``call_refs`` has them apart,
    ``run_id`` None for a bare call id (a task an earlier release filed)."""
    resolution = dict(stored.resolution) if stored.resolution else None
    if resolution is not None:
        resolution.pop("signature", None)
    refs = [parse_task_call_ref(ref) for ref in stored.task.calls]
    return {
        **stored.task.model_dump(mode="json"),
        "call_refs": [{"run_id": run, "call_id": call} for run, call in refs],
        "status": stored.status,
        "resolution": resolution,
        "assignee": stored.assignee,
        "age_s": max(0.0, time.time() - stored.task.created_at),
    }


def approval_json(pending: PendingApproval) -> dict[str, Any]:
    """A call waiting for approval: what it is (arguments as their digest), and the decision
    received for it, if the turn has not been resumed yet."""
    e = pending.entry
    decision = None
    if pending.decision is not None:
        d = pending.decision
        decision = {"approve": bool(d.get("approve")), "by": d.get("by"), "at": d.get("at")}
    return {
        "tenant_id": e.tenant_id,
        "run_id": e.run_id,
        "turn_id": e.turn_id,
        "call_id": e.call_id,
        "tool_name": e.tool_name,
        "tool_version": e.tool_version,
        "pool": e.pool,
        "state": e.state,
        "arguments_digest": e.arguments_digest,
        "arguments_bytes": len(e.arguments.encode()),
        "held": not e.pending_approval,
        "decision": decision,
    }


def tool_json(view: ToolVersions) -> dict[str, Any]:
    """A tool's live versions, where new calls go and why, and its pin."""
    choice = view.choice
    return {
        "name": view.name,
        "new_calls": {"version": choice.version, "route": choice.route, "why": choice.describe()},
        "pin": view.pin,
        "auto_rollback": view.auto_rollback,
        "versions": [
            {
                "version": v.version,
                "ref": version_ref(view.name, v.version),
                "pool": v.spec.pool,
                "effect_class": v.spec.effect_class,
                "circuit": v.circuit,
                "new_calls": v.version == choice.version,
            }
            for v in view.versions
        ],
    }


def circuits_json(circuits: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """Open circuits, the longest open first."""
    rows = [{"ref": ref, **state} for ref, state in circuits.items()]
    return sorted(rows, key=lambda r: float(r.get("opened_at", 0)))
