"""Tools a worker serves from an upstream MCP server take their effect class from what the
server says about them, and one that may have applied something is never run again blindly.

The upstream is a real MCP server (the ``mcp`` package's ``MCPServer``) served over Streamable
HTTP by uvicorn on a free port of this process; the worker side reaches it with the Agents
SDK's ``MCPServerStreamableHttp``, through ``ToolRegistry.add_mcp_server``, as an application
would. The fleet is the real one (``InProcessFleet``: Kafka, Redis, planner, workers,
aggregator, reconciler). The upstream counts what it did, so each test compares the fleet's
record with the upstream's truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import uvicorn
from agents.mcp import MCPServerStreamableHttp
from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations
from redis.asyncio import Redis

from executors import ToolRegistry
from kernel.errors import ConfigurationError
from kernel.rules.effects import attendance
from kernel.settings import Settings
from kernel.stores.door import Stores
from kernel.stores.ledger import Ledger, LedgerEntry
from schemas import AgentRef, ModelResponseEvent, ToolSpec
from tests.conftest import wait_for
from toolfleet.testing import InProcessFleet

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]

TENANT = "mcp-upstream"


@dataclass
class Upstream:
    """The upstream's truth: how often each tool ran for each order, and a latch that holds
    the answer of a first run until the test lets it go (an upstream that applies, then
    answers too late)."""

    url: str
    runs: Counter[str] = field(default_factory=Counter)
    release: asyncio.Event = field(default_factory=asyncio.Event)


def orders_server(upstream: Upstream) -> MCPServer:
    """An order system's MCP server: one tool per kind of annotation."""
    server = MCPServer(name="orders")

    async def applied_then_late(key: str) -> None:
        upstream.runs[key] += 1
        if upstream.runs[key] == 1:
            await upstream.release.wait()  # the first answer is lost to the client's timeout

    @server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=True))
    def lookup_order(order: str) -> str:
        """The state of an order."""
        upstream.runs[f"lookup_order:{order}"] += 1
        return f"order {order}: open"

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True))
    async def set_address(order: str, address: str) -> str:
        """Sets an order's delivery address (setting it twice changes nothing more)."""
        await applied_then_late(f"set_address:{order}")
        return f"order {order} ships to {address}"

    @server.tool(annotations=ToolAnnotations(destructive_hint=True))
    async def cancel_order(order: str) -> str:
        """Cancels an order and refunds it."""
        await applied_then_late(f"cancel_order:{order}")
        return f"order {order} cancelled"

    @server.tool()
    def add_note(order: str, note: str) -> str:
        """Adds a note to an order (says nothing about its effect)."""
        upstream.runs[f"add_note:{order}"] += 1
        return f"noted on {order}"

    return server


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    """The order system, served over Streamable HTTP on a free port until the test ends."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    found = Upstream(url=f"http://127.0.0.1:{sock.getsockname()[1]}/mcp")
    app = orders_server(found).streamable_http_app()
    config = uvicorn.Config(app, log_config=None, access_log=False, timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    await wait_for(lambda: _started(server), within=30)
    try:
        yield found
    finally:
        found.release.set()
        server.should_exit = True
        await serving


async def _started(server: uvicorn.Server) -> bool:
    return server.started


def client_of(upstream: Upstream, *, retries: int = 0) -> MCPServerStreamableHttp:
    """The worker's client of the order system, as an application builds it; it gives up on
    an answer after a second."""
    return MCPServerStreamableHttp(
        {"url": upstream.url},
        name="orders",
        client_session_timeout_seconds=1.0,
        max_retry_attempts=retries,
    )


@contextlib.asynccontextmanager
async def opened(registry: ToolRegistry) -> AsyncIterator[dict[str, ToolSpec]]:
    """The registry connected to its MCP servers (as a worker's start does); its specs."""
    await registry.open()
    try:
        yield {spec.name: spec for spec in registry.specs("default")}
    finally:
        await registry.close()


async def test_the_effect_class_comes_from_the_servers_annotations(upstream: Upstream) -> None:
    registry = ToolRegistry()
    registry.add_mcp_server(client_of(upstream))  # nothing declared
    async with opened(registry) as specs:
        classes = {name: spec.effect_class for name, spec in specs.items()}
        assert classes == {
            "lookup_order": "read_only",  # read-only, even though it reaches the open world
            "set_address": "idempotent",
            "cancel_order": "non_idempotent",  # destructive
            "add_note": "non_idempotent",  # the server says nothing
        }
        # What may have applied something and cannot be probed waits for a person.
        unattended = {name: attendance(spec)[0] for name, spec in specs.items()}
        assert unattended == {
            "lookup_order": True,
            "set_address": True,
            "cancel_order": False,
            "add_note": False,
        }


async def test_an_explicit_declaration_wins(upstream: Upstream) -> None:
    registry = ToolRegistry()
    registry.add_mcp_server(
        client_of(upstream),
        effects={"lookup_order": "non_idempotent", "cancel_order": "irreversible"},
        default_effect="idempotent",
    )
    async with opened(registry) as specs:
        assert {name: spec.effect_class for name, spec in specs.items()} == {
            "lookup_order": "non_idempotent",
            "set_address": "idempotent",
            "cancel_order": "irreversible",
            "add_note": "idempotent",
        }


async def test_a_client_that_retries_by_itself_cannot_serve_a_destructive_tool(
    upstream: Upstream,
) -> None:
    registry = ToolRegistry()
    registry.add_mcp_server(client_of(upstream, retries=2))
    with pytest.raises(ConfigurationError, match="max_retry_attempts=2") as refused:
        await registry.open()
    assert "'cancel_order' (non_idempotent: destructiveHint" in str(refused.value)
    assert "cancel_order" not in registry  # nothing of that server is served

    # Declared replay-safe (the operator vouches for every tool), the same client may serve.
    vouched = ToolRegistry()
    vouched.add_mcp_server(client_of(upstream, retries=2), default_effect="read_only")
    async with opened(vouched) as specs:
        assert {spec.effect_class for spec in specs.values()} == {"read_only"}


def one_call(tool: str, arguments: dict[str, str]) -> ModelResponseEvent:
    """A model response with one call of ``tool``, in a run of its own."""
    run = f"run-{uuid.uuid4().hex[:12]}"
    return ModelResponseEvent(
        tenant_id=TENANT,
        run_id=run,
        turn_id=0,
        agent=AgentRef(name="clerk"),
        response_id=f"resp-{run}",
        items=[
            {"type": "function_call", "call_id": "c1", "name": tool,
             "arguments": json.dumps(arguments)}
        ],
    )  # fmt: skip


async def test_an_unknown_effect_is_retried_only_for_a_tool_the_server_calls_idempotent(
    settings: Settings, redis: Redis, upstream: Upstream
) -> None:
    """Both calls apply upstream and then lose their answer to the client's timeout: their
    effect is unknown. The idempotent one is sent again (the upstream's hint says a repeat
    changes nothing more) and ends applied; the destructive one is never sent again: it goes
    to a person, and the upstream ran it once."""
    registry = ToolRegistry()
    # Served unattended (a recorded reason) so that no approval stands between the call and
    # what the test looks at: what happens after its effect became unknown.
    registry.add_mcp_server(client_of(upstream), unattended="the test's order system")
    await registry.open()
    try:
        async with InProcessFleet(settings, registry) as fleet:
            ledger = Ledger(redis, fleet.keys)
            stores = Stores(redis, fleet.settings)

            idempotent = one_call("set_address", {"order": "o-1", "address": "Quay 3"})
            destructive = one_call("cancel_order", {"order": "o-2"})
            for event in (idempotent, destructive):
                result = await fleet.client.run_turn(event, within=60)
                assert result.calls[0].effect == "unknown"

            async def entry(event: ModelResponseEvent) -> LedgerEntry:
                return (await ledger.read(TENANT, event.run_id, ["c1"]))["c1"]

            async def resubmitted_and_applied() -> bool:
                outcome = (await entry(idempotent)).outcome
                return outcome is not None and outcome.attempt == 2 and outcome.effect == "applied"

            await wait_for(resubmitted_and_applied, within=60)
            assert upstream.runs["set_address:o-1"] == 2

            async def human_task() -> bool:
                return any(
                    stored.task.run_id == destructive.run_id and stored.task.call_id == "c1"
                    for stored in await stores.tasks().all()
                )

            await wait_for(human_task, within=60)
            settled = await entry(destructive)
            assert settled.attempts == 1
            assert settled.outcome is not None and settled.outcome.effect == "unknown"
            assert upstream.runs["cancel_order:o-2"] == 1
    finally:
        upstream.release.set()
        await registry.close()
