"""Calls the door can find again: MCP tasks and plain calls with an idempotency key.

A task is a call identity: its id is the run id of the one-call turn it became, and the
door's record of it (``kernel.stores.mcp_tasks``) lives under the tenant of the token that
created it. Every answer (``tasks/get``, ``tasks/result``, ``tasks/list``, ``tasks/cancel``,
a retried keyed call) is read from the fleet's state: the record and the call's ledger
entry, the run's outcomes followed on ``outcomes``. So any replica answers, a client whose
connection dropped loses nothing, and nothing runs twice (the run and call id are the
same: the planner's ledger dedupes). Another tenant's token computes another key and finds
nothing: "not found", as for an id that never existed.

Waiting for settlement follows the run's outcomes (before reading the ledger, so none is
missed) and reads the ledger again every ``recheck_s`` too: that is how a wait notices what
travels on no outcome (an operator's approval decision, after which the door resumes the
turn; a creator that died before its publish was acknowledged, after which the door
publishes the same call again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError

from kernel.rules.effects import settles_call
from kernel.rules.mcp import (
    APPROVAL_WAIT,
    IDEMPOTENCY_CONFLICT,
    REPUBLISH_AFTER_S,
    TASK_NOT_FOUND,
    TERMINAL,
    CallEnd,
    CallProgress,
    TaskStatus,
    call_fingerprint,
    call_id_of,
    call_tool_result,
    cancelled_result,
    related,
    republish_due,
    task_of,
    task_status,
)
from kernel.stores.door import Stores
from kernel.stores.ledger import Ledger, LedgerEntry
from kernel.stores.mcp_tasks import DoorRecord, InvalidCursorError, McpTasks
from schemas import CallOutcome, CancelRequest, ModelResponseEvent, ToolSpec
from toolfleet.app.mcp._calls import event_of
from toolfleet.app.mcp._gate import Caller
from toolfleet.client import FleetClient

log = logging.getLogger(__name__)

StatusSink = Callable[[dict[str, Any]], Awaitable[None]]
"""Takes a task (wire names) whose status changed: ``notifications/tasks/status``."""


@dataclass(frozen=True)
class TaskLimits:
    """How the door waits on a task's call."""

    wait_s: float = 24 * 3600.0
    """The longest ``tasks/result`` (or re-attached keyed call) waits in one request."""
    recheck_s: float = 1.0
    """How often a wait reads the ledger again for what no outcome tells."""
    page_size: int = 50
    """Tasks per ``tasks/list`` page."""


@dataclass(frozen=True)
class Seen:
    """A task's record and its call's ledger entry, read together."""

    record: DoorRecord
    entry: LedgerEntry | None
    status: TaskStatus
    message: str | None
    decided: bool = False
    """The call waits for approval, but its decision was made: its turn is being resumed."""

    @property
    def outcome(self) -> CallOutcome | None:
        """The call's outcome in the ledger (None: none yet)."""
        return self.entry.outcome if self.entry is not None else None


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def not_found(task_id: str) -> MCPError:
    """The answer for a task the caller's tenant has none of (no oracle for other tenants)."""
    return MCPError(types.INVALID_PARAMS, TASK_NOT_FOUND.format(task_id=task_id[:200]))


class Tasks:
    """The door's tasks and keyed calls over a started ``FleetClient`` and the fleet's
    stores."""

    def __init__(
        self, client: FleetClient, stores: Stores, limits: TaskLimits | None = None
    ) -> None:
        self.client = client
        self.store: McpTasks = stores.mcp_tasks()
        self.ledger: Ledger = stores.ledger()
        self.retention_s = stores.settings.ledger_retention_s
        self.limits = limits or TaskLimits()

    # -- creating -------------------------------------------------------------------------

    async def open(
        self,
        caller: Caller,
        spec: ToolSpec,
        arguments: Mapping[str, Any] | None,
        run_id: str,
        *,
        task: bool,
        ttl_ms: int | None,
        key: str | None = None,
        progress_token: str | int | None = None,
    ) -> tuple[bool, DoorRecord, ModelResponseEvent]:
        """Record a call under ``run_id``: (new, its record, its model response). The same
        call found again (a retried key, a retried task) is not new. MCPError (-32602) when
        the run holds another call (an idempotency key used for other arguments). A new
        task keeps ``progress_token`` for its ``tasks/result`` streams."""
        event = event_of(
            caller.tenant,
            run_id,
            created_by=caller.identity.name,
            name=spec.name,
            namespace=spec.namespace,
            arguments=arguments,
        )
        verdict, record = await self.store.create(
            caller.tenant,
            run_id,
            tool=spec.lookup_key,
            name=spec.name,
            namespace=spec.namespace,
            arguments=event.function_calls[0].arguments,
            fingerprint=call_fingerprint(spec.lookup_key, arguments),
            created_by=caller.identity.name,
            task=task,
            ttl_ms=ttl_ms,
            progress_token=progress_token,
        )
        if verdict == "conflict":
            raise MCPError(
                types.INVALID_PARAMS, IDEMPOTENCY_CONFLICT.format(key=(key or run_id)[:200])
            )
        return verdict == "new", record, event

    async def submit(self, record: DoorRecord, event: ModelResponseEvent) -> None:
        """Publish the call's model response, then note it in the record."""
        await self.client.submit(event)
        await self.store.mark_submitted(record.tenant_id, record.run_id)

    # -- reading --------------------------------------------------------------------------

    async def find(self, caller: Caller, task_id: str, *, tasks_only: bool = True) -> DoorRecord:
        """The caller's tenant's record of ``task_id``; not found otherwise."""
        record = await self.store.get(caller.tenant, task_id)
        if record is None or (tasks_only and not record.task):
            raise not_found(task_id)
        return record

    async def see(self, record: DoorRecord, *, act: bool = True) -> Seen:
        """Where the record's call stands now. With ``act``, what only a reader can do is
        done on the way: publish a call whose creator died before it was acknowledged, and
        resume a turn whose approval was decided."""
        call_id = call_id_of(record.run_id)
        entry = (await self.ledger.read(record.tenant_id, record.run_id, [call_id])).get(call_id)
        on_unknown = await self._on_unknown(record.tool)
        outcome = entry.outcome if entry is not None else None
        settled = outcome is not None and settles_call(outcome, on_unknown)
        progress = CallProgress(
            state=entry.state if entry is not None else None,
            pending_approval=bool(entry and entry.pending_approval and entry.approval is None),
            attempts=entry.attempts if entry is not None else 0,
            outcome=outcome,
            settled=settled,
        )
        status, message = task_status(
            record.tool,
            progress,
            cancelled_reason=record.cancel_reason or ("cancelled" if record.cancelled_at else None),
        )
        decided = False
        if act and status not in TERMINAL:
            decided = await self._act(record, entry)
        return Seen(record, entry, status, message, decided)

    async def _on_unknown(self, tool: str) -> str:
        spec = (await self.client.tool_specs()).get(tool)
        return spec.on_unknown if spec is not None else "reconcile_then_report"

    async def _act(self, record: DoorRecord, entry: LedgerEntry | None) -> bool:
        """Publish or resume what needs it; whether the call's approval was decided."""
        now = time.time()
        if republish_due(
            submitted=record.submitted_at is not None,
            has_entry=entry is not None,
            created_at=record.created_at,
            now=now,
        ):
            log.info("MCP door republishes an unsubmitted call", extra={"run_id": record.run_id})
            await self.submit(record, self._event(record))
            return False
        if entry is None or not entry.pending_approval or entry.approval is not None:
            return False
        decisions = await self.ledger.decisions(record.tenant_id, record.run_id)
        if (
            call_id_of(record.run_id) not in decisions.per_call
            and record.tool not in decisions.sticky
        ):
            return False
        if record.resumed_at is not None and now - record.resumed_at < REPUBLISH_AFTER_S:
            return True  # resumed a moment ago: the planner has it
        log.info("MCP door resumes a decided call", extra={"run_id": record.run_id})
        await self.store.mark_resumed(record.tenant_id, record.run_id, now)
        await self.client.submit(self._event(record).model_copy(update={"resume": True}))
        return True

    def _event(self, record: DoorRecord) -> ModelResponseEvent:
        return event_of(
            record.tenant_id,
            record.run_id,
            created_by=record.created_by,
            name=record.name,
            namespace=record.namespace,
            arguments_json=record.arguments,
        )

    def task(self, seen: Seen) -> dict[str, Any]:
        """The MCP ``Task`` of what was seen (wire names)."""
        record = seen.record
        updated = max(record.created_at, record.submitted_at or 0, record.cancelled_at or 0)
        return task_of(
            record.run_id,
            seen.status,
            seen.message,
            created_at=_iso(record.created_at),
            updated_at=_iso(updated),
            ttl_ms=record.ttl_ms,
        )

    # -- waiting --------------------------------------------------------------------------

    async def settled(
        self,
        record: DoorRecord,
        *,
        until_approval: bool = False,
        task: bool = True,
        notify: StatusSink | None = None,
    ) -> dict[str, Any]:
        """The call's ``CallToolResult`` once its task is terminal (wire names), waiting up
        to ``TaskLimits.wait_s``. With ``until_approval`` a call waiting for a person's
        approval answers at once (a plain call, as the door's first answer said). ``notify``
        is given the task each time its status or message changes while this waits."""
        loop = asyncio.get_running_loop()
        arrived: asyncio.Queue[CallOutcome] = asyncio.Queue()
        call_id = call_id_of(record.run_id)

        def on_outcome(outcome: CallOutcome) -> None:
            if outcome.call_id == call_id and outcome.kind == "execute":
                arrived.put_nowait(outcome)

        stop = await self.client.follow(record.run_id, 0, on_outcome, tenant_id=record.tenant_id)
        deadline = loop.time() + self.limits.wait_s
        shown: tuple[str, str | None] | None = None
        try:
            while True:
                seen = await self.see(await self._fresh(record))
                if notify is not None and shown not in (None, (seen.status, seen.message)):
                    await notify(self.task(seen))
                shown = (seen.status, seen.message)
                if seen.status in TERMINAL:
                    return self._result(seen, task=task)
                if until_approval and seen.status == "input_required" and not seen.decided:
                    return self._approval_wait(seen)
                left = deadline - loop.time()
                if left <= 0:
                    why = f"no settlement within {self.limits.wait_s:g} s: ask again"
                    end = CallEnd(record.run_id, "timed_out", "unknown", why, 0, False)
                    return call_tool_result(end)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(self.limits.recheck_s, left)):
                        await arrived.get()  # an outcome: read the ledger it was written to
        finally:
            stop()

    async def _fresh(self, record: DoorRecord) -> DoorRecord:
        """The record as it is now (cancelled meanwhile?); the one given when it is gone."""
        return await self.store.get(record.tenant_id, record.run_id) or record

    def _result(self, seen: Seen, *, task: bool) -> dict[str, Any]:
        record = seen.record
        if seen.status == "cancelled":
            outcome = seen.outcome
            result = cancelled_result(outcome, record.run_id, seen.message or "cancelled")
        else:
            assert seen.outcome is not None  # completed or failed: settled
            result = call_tool_result(seen.outcome)
        return related(result, record.run_id) if task else result

    def _approval_wait(self, seen: Seen) -> dict[str, Any]:
        record = seen.record
        text = APPROVAL_WAIT.format(
            tool=record.tool, run_id=record.run_id, call_id=call_id_of(record.run_id)
        )
        return call_tool_result(
            CallEnd(record.run_id, "pending_approval", "not_executed", text, 0, False)
        )

    # -- the tasks/* requests -------------------------------------------------------------

    async def get(self, caller: Caller, task_id: str) -> dict[str, Any]:
        """``tasks/get``."""
        return self.task(await self.see(await self.find(caller, task_id)))

    async def result(
        self, caller: Caller, task_id: str, notify: StatusSink | None = None
    ) -> dict[str, Any]:
        """``tasks/result``: the call's result once the task is terminal; ``notify`` is given
        the task as its status changes meanwhile."""
        return await self.settled(await self.find(caller, task_id), notify=notify)

    async def list(self, caller: Caller, cursor: str | None) -> dict[str, Any]:
        """``tasks/list``: a page of the caller's tenant's tasks, newest first."""
        try:
            records, after = await self.store.page(caller.tenant, cursor, self.limits.page_size)
        except InvalidCursorError as exc:
            raise MCPError(types.INVALID_PARAMS, str(exc)) from None
        seen = await asyncio.gather(*(self.see(r, act=False) for r in records))
        answer: dict[str, Any] = {"tasks": [self.task(s) for s in seen]}
        if after is not None:
            answer["nextCursor"] = after
        return answer

    async def cancel(self, caller: Caller, task_id: str) -> dict[str, Any]:
        """``tasks/cancel``: the task is cancelled from now on, and its call is cancelled on
        the fleet: a running call tool-locally (its tool sees the cancellation), one not
        started yet by cancelling its run (it never starts). MCPError (-32602) for a task
        that is terminal already."""
        reason = f"cancelled through the MCP door by {caller.identity.name}"
        for _ in range(5):
            record = await self.find(caller, task_id)
            seen = await self.see(record, act=False)
            if seen.status in TERMINAL:
                raise MCPError(
                    types.INVALID_PARAMS,
                    f"task {task_id} is {seen.status} already: nothing to cancel",
                )
            outcome = seen.outcome
            done = await self.store.cancel(
                caller.tenant,
                record.run_id,
                reason=reason,
                outcome_read=outcome.model_dump_json(exclude_none=True) if outcome else None,
                at=time.time(),
            )
            if done == "missing":
                raise not_found(task_id)
            if done == "moved":
                continue  # the call moved on meanwhile: decide again on what it is now
            if done == "cancelled":
                started = seen.entry is not None and seen.entry.state == "started"
                await self.client.cancel(
                    CancelRequest(
                        tenant_id=caller.tenant,
                        run_id=record.run_id,
                        call_id=call_id_of(record.run_id) if started else None,
                        reason=reason,
                        decided_by=f"mcp:{caller.identity.name}",
                    )
                )
            return self.task(await self.see(await self.find(caller, task_id), act=False))
        raise MCPError(
            types.INTERNAL_ERROR, f"task {task_id} kept changing while it was cancelled: retry"
        )
