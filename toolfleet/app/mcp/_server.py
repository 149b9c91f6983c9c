"""The door's MCP server: the ``mcp`` package's low-level ``Server`` with toolfleet's handlers.

``tools/list`` is the tool directory the workers publish (``FleetClient.tool_specs``, the
compacted ``tools`` topic), each tool with annotations from its effect class; ``tools/call``
is a one-call turn for the caller's tenant (``Calls``). Every handler reads its caller from
the request (the gate put it there); none trusts a field of the request for who or which
tenant.

Stateless: every request is served by a fresh transport (``stateless_http``), so any replica
answers any request. What is still to come plugs in here: the client's idempotency key
(``_meta["io.toolfleet/idempotency-key"]``, read in ``Door.call_tool`` and turned into the run
by ``kernel.rules.mcp.run_id_for``, its record in a task store the door opens beside its
``FleetClient``); task handlers (``Server.add_request_handler`` for ``tasks/*``, a
``Server.middleware`` entry for a task-augmented ``tools/call``, answered through
``Calls.settle`` and the ledger) and the ``capabilities.tasks`` they advertise (a
``Server`` subclass's ``get_capabilities``); ``tasks/cancel`` already needs the operator
role at the gate.
"""

from __future__ import annotations

import logging
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from kernel.rules.mcp import listed, unknown_tool_result
from toolfleet.app.mcp._calls import Calls
from toolfleet.app.mcp._gate import CALLER_KEY, Caller, Refused, check_role
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


class Door:
    """The handlers of ``toolfleet mcp`` over one started ``FleetClient``."""

    def __init__(self, client: FleetClient, calls: Calls, *, version: str) -> None:
        self.client = client
        self.calls = calls
        self.server: Server[Any] = Server(
            SERVER_NAME,
            version=version,
            title="toolfleet",
            description="The tools of a toolfleet fleet: every call a one-call turn, with the "
            "fleet's ledger, at-most-once execution, approvals and effect truth.",
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        """Every enabled tool the fleet serves, in one page."""
        caller_of(ctx)
        specs = await self.client.tool_specs()
        return types.ListToolsResult.model_validate({"tools": listed(specs)})

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        """One call of a tool, run on the fleet for the caller's tenant; its result once the
        call settled. A tool the fleet does not serve is an error result (nothing runs)."""
        caller = caller_of(ctx)
        try:
            check_role(caller.identity, "tools/call")  # the gate checked it already
        except Refused as refused:
            raise MCPError(types.INVALID_REQUEST, refused.message) from None
        specs = await self.client.tool_specs()
        spec = specs.get(params.name)
        if spec is None or not spec.enabled:
            return types.CallToolResult.model_validate(unknown_tool_result(params.name))
        log.info(
            "MCP tool call",
            extra={"tenant_id": caller.tenant, "tool": spec.lookup_key,
                   "caller": caller.identity.name},
        )  # fmt: skip
        result = await self.calls.call(caller, spec, params.arguments)
        return types.CallToolResult.model_validate(result)
