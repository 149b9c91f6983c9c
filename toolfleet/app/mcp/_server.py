"""The door's MCP server: the ``mcp`` package's low-level ``Server`` with toolfleet's handlers.

``tools/list`` is the tool directory the workers publish (``FleetClient.tool_specs``, the
compacted ``tools`` topic), each tool with annotations from its effect class; ``tools/call``
is a one-call turn for the caller's tenant (``Calls``). Every handler reads its caller from
the request (the gate put it there); none trusts a field of the request for who or which
tenant.

Stateless: every request is served by a fresh transport (``stateless_http``), so any replica
answers any request. Tasks (MCP 2025-11-25, SEP-1686) are built here by hand on the package's
low-level server, which has no task runtime: ``capabilities.tasks`` from a ``Server``
subclass, a ``Server.middleware`` entry that answers a task-augmented ``tools/call`` with its
task at once, and ``tasks/*`` handlers (``Tasks``) answered from the fleet's state. A client's
idempotency key (``_meta["io.toolfleet/idempotency-key"]``) makes a plain call retried after a
dropped connection find its first run (``kernel.rules.mcp.run_id_for``).

Progress: a ``tools/call`` whose ``_meta`` carries a ``progressToken`` gets the call's
progress as ``notifications/progress`` on its stream while it waits (``relayed``); a task
keeps the token of its task-augmented call, and each ``tasks/result`` stream gets the
progress reported while it waits, with the task named in ``_meta``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from kernel.rules.mcp import (
    META_RELATED_TASK,
    arguments_refusal,
    created_task_result,
    idempotency_key_of,
    listed,
    run_id_for,
    task_ttl_ms,
    unknown_tool_result,
)
from kernel.rules.progress import Notice
from kernel.rules.texts import TOOL_NOT_FOUND
from kernel.stores.mcp_tasks import DoorRecord
from schemas import ToolSpec
from toolfleet.app.mcp._calls import Calls
from toolfleet.app.mcp._gate import CALLER_KEY, Caller, Refused, check_role
from toolfleet.app.mcp._progress import relayed
from toolfleet.app.mcp._tasks import Tasks
from toolfleet.client import FleetClient

log = logging.getLogger(__name__)

SERVER_NAME = "toolfleet"


def caller_of(ctx: ServerRequestContext[Any, Any]) -> Caller:
    """The caller the gate resolved for this request (MCPError if none: never served
    unauthenticated)."""
    request = ctx.request
    caller = request.scope.get(CALLER_KEY) if request is not None else None
    if not isinstance(caller, Caller):
        raise MCPError(types.INVALID_REQUEST, "not authenticated: send a bearer token")
    return caller


def _modern(ctx: ServerRequestContext[Any, Any]) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def _progress_notification(
    token: str | int, notice: Notice, meta: dict[str, Any] | None = None
) -> types.ProgressNotification:
    params = types.ProgressNotificationParams(
        progress_token=token,
        progress=notice.progress,
        total=notice.total,
        message=notice.message,
        _meta=meta,
    )
    return types.ProgressNotification(params=params)


def _key_of(params: Mapping[str, Any] | None) -> str | None:
    meta = (params or {}).get("_meta")
    try:
        return idempotency_key_of(meta if isinstance(meta, Mapping) else None)
    except ValueError as exc:
        raise MCPError(types.INVALID_PARAMS, str(exc)) from None


class _TaskServer(Server[Any]):
    """The low-level server, advertising tasks to clients of the 2025-11-25 revision (tasks
    on the 2026-07-28 revision are an extension of their own, not served yet)."""

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        """The handlers' capabilities, with ``tasks`` (list, cancel, task-augmented
        ``tools/call``) on the handshake revisions."""
        found = super().get_capabilities(
            notification_options,
            experimental_capabilities,
            extensions,
            protocol_version=protocol_version,
        )
        if protocol_version in MODERN_PROTOCOL_VERSIONS:
            return found
        tasks = types.ServerTasksCapability(
            list=types.TasksListCapability(),
            cancel=types.TasksCancelCapability(),
            requests=types.ServerTasksRequestsCapability(
                tools=types.TasksToolsCapability(call=types.TasksCallCapability())
            ),
        )
        return found.model_copy(update={"tasks": tasks})


class Door:
    """The handlers of ``toolfleet mcp`` over one started ``FleetClient``."""

    def __init__(self, client: FleetClient, calls: Calls, tasks: Tasks, *, version: str) -> None:
        self.client = client
        self.calls = calls
        self.tasks = tasks
        self.server: Server[Any] = _TaskServer(
            SERVER_NAME,
            version=version,
            title="toolfleet",
            description="The tools of a toolfleet fleet: every call a one-call turn, with the "
            "fleet's ledger, at-most-once execution, approvals and effect truth.",
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )
        self.server.middleware.append(self._task_calls)
        self.server.add_request_handler("tasks/get", types.GetTaskRequestParams, self.get_task)
        self.server.add_request_handler(
            "tasks/result", types.GetTaskPayloadRequestParams, self.task_result
        )
        self.server.add_request_handler("tasks/list", types.PaginatedRequestParams, self.list_tasks)
        self.server.add_request_handler(
            "tasks/cancel", types.CancelTaskRequestParams, self.cancel_task
        )

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        """Every enabled tool the fleet serves, in one page."""
        caller_of(ctx)
        specs = await self.client.tool_specs()
        return types.ListToolsResult.model_validate({"tools": listed(specs)})

    def _caller(self, ctx: ServerRequestContext[Any, Any], method: str) -> Caller:
        caller = caller_of(ctx)
        try:
            check_role(caller.identity, method)  # the gate checked it already
        except Refused as refused:
            raise MCPError(types.INVALID_REQUEST, refused.message) from None
        return caller

    def _check_arguments(self, arguments: Mapping[str, Any] | None) -> None:
        """MCPError (-32602) for arguments the planner would refuse (over the fleet's
        limits): nothing is recorded or submitted."""
        settings = self.client.settings
        why = arguments_refusal(
            json.dumps(dict(arguments or {})),
            max_bytes=settings.max_argument_bytes,
            max_depth=settings.max_json_depth,
        )
        if why is not None:
            raise MCPError(types.INVALID_PARAMS, f"{why}: nothing was run")

    async def _spec(self, name: str) -> ToolSpec | None:
        spec = (await self.client.tool_specs()).get(name)
        return spec if spec is not None and spec.enabled else None

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        """One call of a tool, run on the fleet for the caller's tenant; its result once the
        call settled. A tool the fleet does not serve is an error result (nothing runs).

        With an idempotency key the call is the key's run: a retry finds the first call
        (never a second run) and answers its result; the same key with another tool or other
        arguments is an error (-32602)."""
        caller = self._caller(ctx, "tools/call")
        key = _key_of(ctx.params)
        spec = await self._spec(params.name)
        if spec is None:
            return types.CallToolResult.model_validate(unknown_tool_result(params.name))
        self._check_arguments(params.arguments)
        log.info(
            "MCP tool call",
            extra={"tenant_id": caller.tenant, "tool": spec.lookup_key,
                   "caller": caller.identity.name, "keyed": key is not None},
        )  # fmt: skip
        run_id = run_id_for(caller.tenant, key)
        async with self._call_progress(ctx, caller.tenant, run_id):
            if key is None:
                result = await self.calls.call(caller, spec, params.arguments, run_id=run_id)
            else:
                result = await self._keyed(caller, spec, params.arguments, key, run_id)
        return types.CallToolResult.model_validate(result)

    def _call_progress(
        self, ctx: ServerRequestContext[Any, Any], tenant: str, run_id: str
    ) -> AbstractAsyncContextManager[None]:
        """While a plain call waits: its progress on its request's stream, when the request
        carried a progress token."""
        token = progress_token_from_params(ctx.params)
        if token is None:
            return contextlib.nullcontext()

        async def send(notice: Notice) -> None:
            await ctx.session.send_notification(
                _progress_notification(token, notice), related_request_id=ctx.request_id
            )

        return relayed(self.client, tenant, run_id, send)

    def _task_progress(
        self, ctx: ServerRequestContext[Any, Any], record: DoorRecord
    ) -> AbstractAsyncContextManager[None]:
        """While a ``tasks/result`` waits: the task's progress on this request's stream, under
        the token of the call that created it, above the progress already sent for it."""
        token = record.progress_token
        if token is None:
            return contextlib.nullcontext()
        meta = {META_RELATED_TASK: {"taskId": record.run_id}}

        async def send(notice: Notice) -> None:
            await ctx.session.send_notification(
                _progress_notification(token, notice, meta), related_request_id=ctx.request_id
            )
            await self.tasks.store.mark_progress(record.tenant_id, record.run_id, notice.progress)

        return relayed(
            self.client, record.tenant_id, record.run_id, send, sent=record.progress_sent
        )

    async def _keyed(
        self,
        caller: Caller,
        spec: ToolSpec,
        arguments: Mapping[str, Any] | None,
        key: str,
        run_id: str,
    ) -> dict[str, Any]:
        """A plain call with an idempotency key: the key's run, run once."""
        retention = self.tasks.retention_s
        new, record, event = await self.tasks.open(
            caller,
            spec,
            arguments,
            run_id,
            task=False,
            ttl_ms=retention * 1000 or None,
            key=key,
        )
        if not new:
            return await self.tasks.settled(record, until_approval=True, task=False)

        async def submitted() -> None:
            await self.tasks.store.mark_submitted(caller.tenant, run_id)

        return await self.calls.settle(spec, run_id, submit=event, submitted=submitted)

    async def _task_calls(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """A task-augmented ``tools/call`` (2025-11-25): its task at once, the call on the
        fleet. Everything else goes on to its handler."""
        params = ctx.params or {}
        if (
            ctx.method != "tools/call"
            or ctx.request_id is None
            or params.get("task") is None
            or _modern(ctx)
        ):
            return await call_next(ctx)
        caller = self._caller(ctx, "tools/call")
        call = types.CallToolRequestParams.model_validate(params)
        key = _key_of(params)
        spec = await self._spec(call.name)
        if spec is None:
            raise MCPError(types.INVALID_PARAMS, TOOL_NOT_FOUND.format(name=call.name[:200]))
        self._check_arguments(call.arguments)
        run_id = run_id_for(caller.tenant, key)
        requested = call.task.ttl if call.task is not None else None
        new, record, event = await self.tasks.open(
            caller,
            spec,
            call.arguments,
            run_id,
            task=True,
            ttl_ms=task_ttl_ms(requested, self.tasks.retention_s),
            key=key,
            progress_token=progress_token_from_params(params),
        )
        log.info(
            "MCP task",
            extra={"tenant_id": caller.tenant, "tool": spec.lookup_key, "run_id": run_id,
                   "caller": caller.identity.name, "new": new},
        )  # fmt: skip
        if new:
            await self.tasks.submit(record, event)
        seen = await self.tasks.see(record, act=not new)
        return created_task_result(self.tasks.task(seen), spec.lookup_key)

    def _tasks_caller(self, ctx: ServerRequestContext[Any, Any], method: str) -> Caller:
        if _modern(ctx):
            raise MCPError(
                types.METHOD_NOT_FOUND,
                f"{method} is served on the 2025-11-25 revision only: connect with the "
                "initialize handshake",
            )
        return self._caller(ctx, method)

    async def get_task(
        self, ctx: ServerRequestContext[Any, Any], params: types.GetTaskRequestParams
    ) -> dict[str, Any]:
        """``tasks/get``: the task as the fleet's state says it is now."""
        return await self.tasks.get(self._tasks_caller(ctx, "tasks/get"), params.task_id)

    async def task_result(
        self, ctx: ServerRequestContext[Any, Any], params: types.GetTaskPayloadRequestParams
    ) -> dict[str, Any]:
        """``tasks/result``: the call's result once the task is terminal. While it waits, each
        change of the task's status goes down this request's stream as
        ``notifications/tasks/status`` (the stream this replica holds; a client polling
        ``tasks/get`` elsewhere learns the same)."""
        caller = self._tasks_caller(ctx, "tasks/result")

        async def notify(task: dict[str, Any]) -> None:
            params = types.TaskStatusNotificationParams.model_validate(task)
            try:
                # Not in the package's union of server notifications (2.x dropped tasks from
                # its tables); the session sends any notification model as it is.
                await ctx.session.send_notification(
                    types.TaskStatusNotification(params=params),  # type: ignore[arg-type]
                    related_request_id=ctx.request_id,
                )
            except Exception:  # a client gone meanwhile: its result waits for its next ask
                log.debug("task status not sent", exc_info=True)

        record = await self.tasks.find(caller, params.task_id)
        async with self._task_progress(ctx, record):
            return await self.tasks.settled(record, notify=notify)

    async def list_tasks(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams
    ) -> dict[str, Any]:
        """``tasks/list``: the caller's tenant's tasks, newest first, a page at a time."""
        return await self.tasks.list(self._tasks_caller(ctx, "tasks/list"), params.cursor)

    async def cancel_task(
        self, ctx: ServerRequestContext[Any, Any], params: types.CancelTaskRequestParams
    ) -> dict[str, Any]:
        """``tasks/cancel`` (operator role): the task is cancelled, and its call on the
        fleet."""
        return await self.tasks.cancel(self._tasks_caller(ctx, "tasks/cancel"), params.task_id)
