"""The console's history API: ``/api/history`` (search), ``/api/runs/TENANT/RUN`` (a run's
turns, calls, decisions and tasks in order) and the turns ``/api/recent`` returns.

The tenants a request reads are the identity's (``Access``), never the request's: a
``tenant`` parameter must be one of them (403 otherwise), and without one an admin of every
tenant reads every tenant that has history, another identity its own tenants. Every other
filter only narrows what those tenants hold.

Query parameters (all optional): ``kind`` (turn, decision, task, cancellation; turn by
default), ``tenant``, ``run``, ``call``, ``tool``, ``version`` (with ``tool``, or
``tool@version``), ``status`` (a turn's; a decision's approved / rejected; a task's open /
resolved), ``call_status``, ``effect``, ``decider``, ``since`` and ``until`` (Unix seconds or
ISO 8601), ``limit`` (1-500) and ``cursor`` (from the page before). A page is newest first;
its ``cursor`` is null on the last page. A page may be short, or empty, and still have a
cursor: each page looks at a bounded number of index entries, and says how many (``looked``).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kernel.errors import UsageError
from kernel.stores.history import (
    KINDS,
    MAX_LIMIT,
    Cursor,
    History,
    HistoryEntry,
    Kind,
    Page,
    Query,
    RunPage,
)
from toolfleet.app.console._access import Access
from toolfleet.app.console._history import HistoryRecorder
from toolfleet.app.console._views import trace_link
from toolfleet.app.identity import Identity

FILTERS = ("run", "call", "tool", "version", "status", "call_status", "effect", "decider")
"""The query parameters that name one value of a facet."""
DEFAULT_LIMIT = 50
RUN_LIMIT = 500
"""A run view's entries per page (its turns, decisions, tasks, cancellations)."""


def _when(name: str, raw: str | None) -> float | None:
    """``since`` / ``until`` as Unix time: seconds, or ISO 8601 (UTC unless it says)."""
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        parsed = dt.datetime.fromisoformat(raw)
    except ValueError:
        raise UsageError(
            f"{name} must be Unix seconds or an ISO 8601 time (2026-12-06T10:00:00Z), "
            f"not {raw[:60]!r}"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def query_of(params: Mapping[str, str], *, kind: Kind | None = None) -> Query:
    """The query the parameters ask (InvalidQueryError, a 400, for one that cannot be)."""
    asked = params.get("kind") or "turn"
    if kind is None and asked not in KINDS:
        raise UsageError(f"kind must be one of {', '.join(KINDS)}, not {asked[:40]!r}")
    return Query(
        kind=kind or asked,  # type: ignore[arg-type]
        since=_when("since", params.get("since")),
        until=_when("until", params.get("until")),
        **{name: params.get(name) or None for name in FILTERS},
    )


def _once(params: Any) -> None:
    """Refuse a parameter given more than once: read one way by one layer and another way by
    another, a repeated ``tenant`` could be checked as one tenant and used as the other."""
    if not hasattr(params, "multi_items"):  # a plain mapping: one value each
        return
    repeated = sorted({k for k, _ in params.multi_items() if len(params.getlist(k)) > 1})
    if repeated:
        raise UsageError(f"give each parameter once ({', '.join(repeated)} came more than once)")


def _limit(raw: str | None, default: int, high: int) -> int:
    try:
        value = int(raw) if raw else default
    except ValueError:
        raise UsageError(f"limit must be a number from 1 to {high}") from None
    if not 1 <= value <= high:
        raise UsageError(f"limit must be from 1 to {high}, not {value}: page with the cursor")
    return value


def entry_json(entry: HistoryEntry) -> dict[str, Any]:
    """An entry as the API shows it: its summary, its tenant."""
    return {"tenant_id": entry.tenant_id, **entry.doc}


def turn_event(entry: HistoryEntry) -> dict[str, Any]:
    """A turn from the history in the shape of the live feed's turn events
    (``_feed.summarise_turn``): ``/api/recent`` returns both."""
    calls = [c for c in entry.calls if c.get("status") != "pending_approval"]
    waiting = [c for c in entry.calls if c.get("status") == "pending_approval"]
    return {
        "kind": "turn",
        "source": "history",
        "received_at": entry.at,
        "tenant_id": entry.tenant_id,
        "run_id": entry.run_id,
        "turn_id": entry.doc.get("turn_id"),
        "status": entry.status,
        "calls": [
            {
                "call_id": c.get("call_id"),
                "tool_name": c.get("tool"),
                "status": c.get("status"),
                "effect": c.get("effect"),
                "attempts": c.get("attempts", 0),
            }
            for c in calls
        ],
        "calls_total": len(calls),
        "interruptions": [
            {"call_id": c.get("call_id"), "tool_name": c.get("tool"), "reason": c.get("reason")}
            for c in waiting
        ],
        "interruptions_total": len(waiting),
        "error": entry.doc.get("error"),
    }


def run_json(
    tenant: str, run_id: str, page: RunPage, trace_url_template: str | None
) -> dict[str, Any]:
    """A run: its turns in order, each call with what it did, the output the model saw, the
    decision on its approval and its tasks; then every decision, task and cancellation."""
    kinds: dict[str, list[HistoryEntry]] = defaultdict(list)
    for entry in page.entries:
        kinds[entry.kind].append(entry)
    decisions = [entry_json(e) for e in sorted(kinds["decision"], key=lambda e: e.at)]
    tasks = [entry_json(e) for e in sorted(kinds["task"], key=lambda e: e.at)]
    decision_of = {d["calls"][0]["call_id"]: d for d in decisions if d.get("calls")}
    tasks_of: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for task in tasks:
        for call in task.get("calls") or []:
            if call.get("call_id"):
                tasks_of[call["call_id"]].append(
                    {k: task.get(k) for k in ("task_id", "task_kind", "status", "resolution")}
                )
    turns = []
    for entry in sorted(kinds["turn"], key=lambda e: (e.doc.get("turn_id") or 0, e.at)):
        outputs = entry.outputs or {}
        calls = []
        for call in entry.calls:
            call_id = call.get("call_id") or ""
            started, finished = call.get("started_at"), call.get("finished_at")
            decision = decision_of.get(call_id)
            calls.append(
                {
                    **call,
                    "duration_s": finished - started if started and finished else None,
                    "output": outputs.get(call_id),
                    "trace": trace_link(trace_url_template, call.get("trace_id")),
                    "decision": None
                    if decision is None
                    else {k: decision.get(k) for k in ("status", "at", "message", "sticky")}
                    | {"decided_by": decision["calls"][0].get("decided_by")},
                    "tasks": tasks_of.get(call_id, []),
                }
            )
        turns.append({**entry_json(entry), "calls": calls})
    return {
        "tenant_id": tenant,
        "run_id": run_id,
        "turns": turns,
        "decisions": decisions,
        "tasks": tasks,
        "cancellations": [entry_json(e) for e in sorted(kinds["cancellation"], key=lambda e: e.at)],
        "cursor": None if page.cursor is None else page.cursor.encode(),
    }


class HistoryApi:
    """The history's routes, over the console's store and recorder (set when it starts)."""

    def __init__(self, access: Access, trace_url_template: str | None) -> None:
        self.access = access
        self.trace_url_template = trace_url_template
        self.store: History | None = None
        self.recorder: HistoryRecorder | None = None

    @property
    def _history(self) -> History:
        assert self.store is not None, "the console is not started"
        return self.store

    def _recording(self) -> dict[str, Any]:
        if self.recorder is None:
            return {"state": "off", "error": None}
        return {"state": self.recorder.state, "error": self.recorder.error}

    async def _tenants(
        self, who: Identity, requested: str | None, since: float | None
    ) -> list[str]:
        """The tenants this request reads: the identity's scope, never more."""
        scope = self.access.scope(who, requested or None)
        if scope is None:
            return await self._history.tenants(since)
        return sorted(scope)

    async def page(
        self, who: Identity, params: Mapping[str, str], *, kind: Kind | None = None, limit: int
    ) -> Page:
        """The page of the history that ``params`` ask for, in ``who``'s tenants."""
        query = query_of(params, kind=kind)
        cursor = Cursor.decode(params["cursor"]) if params.get("cursor") else None
        tenants = await self._tenants(who, params.get("tenant"), query.since)
        return await self._history.search(tenants, query, cursor=cursor, limit=limit)

    async def search(self, request: Request, who: Identity) -> Response:
        """A page of the history: entries newest first, the next page's cursor."""
        params = request.query_params
        _once(params)
        limit = _limit(params.get("limit"), DEFAULT_LIMIT, MAX_LIMIT)
        page = await self.page(who, params, limit=limit)
        return JSONResponse(
            {
                "entries": [entry_json(e) for e in page.entries],
                "cursor": None if page.cursor is None else page.cursor.encode(),
                "looked": page.looked,
                "limit": limit,
                "recording": self._recording(),
            }
        )

    async def run(self, request: Request, who: Identity) -> Response:
        """A run's view: its turns in order, their calls, decisions and tasks."""
        tenant, run_id = request.path_params["tenant"], request.path_params["run_id"]
        self.access.check_tenant(who, tenant)
        params = request.query_params
        _once(params)
        cursor = Cursor.decode(params["cursor"]) if params.get("cursor") else None
        limit = _limit(params.get("limit"), RUN_LIMIT, 2_000)
        page = await self._history.run(tenant, run_id, cursor=cursor, limit=limit)
        found = run_json(tenant, run_id, page, self.trace_url_template)
        return JSONResponse(found | {"recording": self._recording()})

    async def recent_turns(
        self, who: Identity, params: Mapping[str, str], limit: int
    ) -> tuple[list[dict[str, Any]], str | None]:
        """The newest ``limit`` turns that pass the filters, as feed events oldest first,
        and the cursor of the page before them."""
        _once(params)
        page = await self.page(who, params, kind="turn", limit=limit)
        cursor = None if page.cursor is None else page.cursor.encode()
        return [turn_event(e) for e in reversed(page.entries)], cursor
