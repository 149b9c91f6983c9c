"""The MCP front door (``toolfleet mcp``) driven by real MCP clients.

The door is the application ``toolfleet mcp`` serves (``toolfleet.app.mcp.create_app``),
served by uvicorn on a free port of this process, in front of a real fleet
(``InProcessFleet``: Kafka, Redis, planner, workers, aggregator, reconciler). The clients are
the ``mcp`` package's own (Streamable HTTP, the 2025-11-25 handshake) and the Agents SDK's
``MCPServerStreamableHttp`` inside an agent run; the bearer checks are driven with plain HTTP
too, to read the status and ``WWW-Authenticate`` the MCP authorization specification asks
for. What a call did is read back from the fleet's ledger, under the tenant it ran for.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import uvicorn
from agents import Agent, Runner
from agents.mcp import MCPServerStreamableHttp
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tracing import set_tracing_disabled
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import SecretStr
from redis.asyncio import Redis

from executors import ToolRegistry
from kernel.settings import Settings
from kernel.stores.ledger import Ledger
from tests.conftest import wait_for
from tests.integration.console_support import OidcProvider
from toolfleet.app.mcp import create_app
from toolfleet.testing import InProcessFleet

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]

set_tracing_disabled(True)

TENANT_A, TENANT_B = "door-a", "door-b"
TOKENS: dict[str, tuple[str, list[str]]] = {
    "agent-a": ("operator", [TENANT_A]),
    "agent-b": ("operator", [TENANT_B]),
    "watcher-a": ("viewer", [TENANT_A]),
    "both": ("operator", [TENANT_A, TENANT_B]),
}
"""The door's static tokens in these tests: name -> (role, tenants); a token's value is
``door-secret-NAME``."""

tools = ToolRegistry()


@tools.tool(effect="read_only", timeout=10.0)
async def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: 21°C, clear"


@tools.tool(effect="non_idempotent", timeout=10.0)
async def book_trip(city: str) -> str:
    """Books a trip (no probe: every call waits for a person's approval)."""
    return f"booked {city}"


def token(name: str) -> str:
    """The value of a test token."""
    return f"door-secret-{name}"


def tokens_setting() -> str:
    """TOOLFLEET_MCP_TOKENS for ``TOKENS``: only each value's sha256 is configured."""
    return json.dumps(
        [
            {"name": name, "sha256": hashlib.sha256(token(name).encode()).hexdigest(),
             "role": role, "tenants": tenants}
            for name, (role, tenants) in TOKENS.items()
        ]
    )  # fmt: skip


@pytest.fixture(scope="module")
async def fleet(settings: Settings, topics: list[str]) -> AsyncIterator[InProcessFleet]:
    async with InProcessFleet(settings, tools) as running:
        yield running


def free_socket() -> socket.socket:
    """A socket bound to a free port of 127.0.0.1, for uvicorn to serve on."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def base_of(sock: socket.socket) -> str:
    """The base URL of a server on ``sock``."""
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


@asynccontextmanager
async def served(app: Any, sock: socket.socket) -> AsyncIterator[str]:
    """``app`` served by uvicorn on ``sock`` until the block ends; its base URL."""
    base = base_of(sock)
    config = uvicorn.Config(app, log_config=None, access_log=False, timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))

    async def started() -> bool:
        if serving.done():
            serving.result()  # start-up failed: raise its error here
        return server.started

    await wait_for(started, within=60)
    try:
        yield base
    finally:
        server.should_exit = True
        await serving


@pytest.fixture(scope="module")
async def door(fleet: InProcessFleet) -> AsyncIterator[str]:
    """The door over the fleet, with the test tokens; its MCP endpoint's URL."""
    door_settings = fleet.settings.model_copy(update={"mcp_tokens": SecretStr(tokens_setting())})
    async with served(create_app(door_settings), free_socket()) as base:
        yield f"{base}/mcp"


@asynccontextmanager
async def mcp_client(
    url: str,
    name: str,
    *,
    tenant: str | None = None,
    bearer: str | None = None,
    mode: str = "legacy",
) -> AsyncIterator[Client]:
    """The ``mcp`` package's client of the door, sending ``name``'s token (or ``bearer``)
    and the tenant header when given, on the 2025-11-25 handshake (``mode="legacy"``) or
    whatever the client negotiates (``"auto"``: 2026-07-28 with a server that offers it)."""
    headers = {"Authorization": f"Bearer {bearer or token(name)}"}
    if tenant is not None:
        headers["X-Toolfleet-Tenant"] = tenant
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,
    ):
        yield client


def rpc(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """A JSON-RPC request, as an MCP client posts it."""
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}


async def post(url: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    """One POST to the door, as a Streamable HTTP client sends it."""
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.post(
            url,
            json=body,
            headers={"Accept": "application/json, text/event-stream", **headers},
        )


def call_meta(result: Any) -> dict[str, Any]:
    """What the fleet recorded for a call, from a CallToolResult's ``_meta``."""
    meta: dict[str, Any] = (result.meta or {})["io.toolfleet/call"]
    return meta


async def test_the_mcp_client_lists_the_fleets_tools_with_annotations_and_calls_one(
    door: str, fleet: InProcessFleet, redis: Redis
) -> None:
    async with mcp_client(door, "agent-a") as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(listed) == {"weather", "book_trip"}
        weather_tool, booking = listed["weather"], listed["book_trip"]
        assert weather_tool.description == "The weather in a city."
        assert weather_tool.input_schema["properties"]["city"]["type"] == "string"
        assert weather_tool.annotations is not None and booking.annotations is not None
        assert weather_tool.annotations.read_only_hint is True
        assert weather_tool.annotations.destructive_hint is False
        assert booking.annotations.destructive_hint is True
        assert booking.annotations.idempotent_hint is False
        assert (weather_tool.meta or {})["io.toolfleet/effect-class"] == "read_only"
        assert (booking.meta or {})["io.toolfleet/gated"] is True

        result = await client.call_tool("weather", {"city": "Oslo"})
    assert result.is_error is False
    assert [block.text for block in result.content] == ["Oslo: 21°C, clear"]  # type: ignore[union-attr]
    meta = call_meta(result)
    assert meta["status"] == "succeeded" and meta["effect"] == "applied"
    assert meta["attempts"] == 1 and meta["resolved"] is True
    entry = (await Ledger(redis, fleet.keys).read(TENANT_A, meta["run_id"], [meta["run_id"]]))[
        meta["run_id"]
    ]
    assert entry.state in ("finished", "committed") and entry.tool_name == "weather"
    assert entry.outcome is not None and entry.outcome.output == "Oslo: 21°C, clear"


async def test_a_client_of_the_2026_revision_lists_and_calls(door: str) -> None:
    async with mcp_client(door, "agent-a", mode="auto") as client:
        assert client.session.protocol_version == "2026-07-28"
        assert {t.name for t in (await client.list_tools()).tools} == {"weather", "book_trip"}
        result = await client.call_tool("weather", {"city": "Baku"})
    assert result.is_error is False
    assert call_meta(result)["status"] == "succeeded"


async def test_the_agents_sdk_gets_the_tools_output_inside_an_agent_run(door: str) -> None:
    model = ScriptedModel(
        [
            [function_call("weather", {"city": "Lima"}, call_id="w1")],
            [assistant_message("done")],
        ]
    )
    async with MCPServerStreamableHttp(
        {"url": door, "headers": {"Authorization": f"Bearer {token('agent-a')}"}},
        name="fleet",
        client_session_timeout_seconds=60,
    ) as server:
        agent = Agent(name="traveller", model=model, mcp_servers=[server])
        result = await Runner.run(agent, "How is the weather in Lima?")
    assert result.final_output == "done"
    outputs = [
        i
        for i in model.calls[-1].input
        if isinstance(i, dict) and i.get("type") == "function_call_output"
    ]
    assert [o["call_id"] for o in outputs] == ["w1"]
    assert outputs[0]["output"] == [{"type": "input_text", "text": "Lima: 21°C, clear"}]


async def test_a_request_without_a_valid_token_is_401_with_www_authenticate(door: str) -> None:
    body = rpc("tools/list")
    for headers in ({}, {"Authorization": "Bearer not-a-door-token"},
                    {"Authorization": f"Basic {token('agent-a')}"}):  # fmt: skip
        answer = await post(door, body, **headers)
        assert answer.status_code == 401, (headers, answer.text)
        challenge = answer.headers["www-authenticate"]
        assert challenge.startswith("Bearer ") and 'error="invalid_token"' in challenge
    # The console's tokens are not the door's: a name the door does not list is refused.
    assert (await post(door, body, Authorization="Bearer secret-alice")).status_code == 401


async def test_a_call_runs_for_the_tenant_of_the_token_and_no_other(
    door: str, fleet: InProcessFleet, redis: Redis
) -> None:
    ledger = Ledger(redis, fleet.keys)
    async with mcp_client(door, "agent-a") as client:
        run_a = call_meta(await client.call_tool("weather", {"city": "Rome"}))["run_id"]
    async with mcp_client(door, "agent-b") as client:
        run_b = call_meta(await client.call_tool("weather", {"city": "Bonn"}))["run_id"]
    assert set(await ledger.read(TENANT_A, run_a, [run_a])) == {run_a}
    assert await ledger.read(TENANT_B, run_a, [run_a]) == {}
    assert set(await ledger.read(TENANT_B, run_b, [run_b])) == {run_b}
    assert await ledger.read(TENANT_A, run_b, [run_b]) == {}

    # A tenant header cannot take a token outside its tenants.
    refused = await post(
        door,
        rpc("tools/call", {"name": "weather", "arguments": {"city": "Nice"}}),
        Authorization=f"Bearer {token('agent-a')}",
        **{"X-Toolfleet-Tenant": TENANT_B},
    )
    assert refused.status_code == 403
    assert (
        f"tenant {TENANT_B} is not in the scope of token:agent-a"
        in refused.json()["error"]["message"]
    )


async def test_a_token_of_several_tenants_names_one_with_the_tenant_header(
    door: str, fleet: InProcessFleet, redis: Redis
) -> None:
    unnamed = await post(door, rpc("tools/list"), Authorization=f"Bearer {token('both')}")
    assert unnamed.status_code == 403
    assert "send the X-Toolfleet-Tenant header" in unnamed.json()["error"]["message"]
    async with mcp_client(door, "both", tenant=TENANT_B) as client:
        run = call_meta(await client.call_tool("weather", {"city": "Kyiv"}))["run_id"]
    ledger = Ledger(redis, fleet.keys)
    assert set(await ledger.read(TENANT_B, run, [run])) == {run}
    assert await ledger.read(TENANT_A, run, [run]) == {}


async def test_a_viewer_lists_but_cannot_call(door: str) -> None:
    async with mcp_client(door, "watcher-a") as client:
        assert {t.name for t in (await client.list_tools()).tools} == {"weather", "book_trip"}
    refused = await post(
        door,
        rpc("tools/call", {"name": "weather", "arguments": {"city": "Oslo"}}),
        Authorization=f"Bearer {token('watcher-a')}",
    )
    assert refused.status_code == 403
    challenge = refused.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge and 'scope="operator"' in challenge
    assert "tools/call needs the operator role" in refused.json()["error"]["message"]
    # The client shows the reason (the 403's body is a JSON-RPC error).
    async with mcp_client(door, "watcher-a") as client:
        with pytest.raises(MCPError, match="tools/call needs the operator role"):
            await client.call_tool("weather", {"city": "Oslo"})


async def test_a_page_of_another_origin_is_refused(door: str) -> None:
    """The Streamable HTTP transport asks a server to refuse an invalid Origin: a page of
    another site never reaches the door, whatever token it found."""
    bearer = f"Bearer {token('agent-a')}"
    refused = await post(
        door, rpc("tools/list"), Authorization=bearer, Origin="https://evil.example"
    )
    assert refused.status_code == 403
    assert (
        "origin https://evil.example may not call this door" in refused.json()["error"]["message"]
    )
    local = await post(
        door, rpc("tools/list"), Authorization=bearer, Origin="http://localhost:3000"
    )
    assert local.status_code == 200


async def test_an_unknown_tool_is_an_error_result_and_nothing_runs(door: str) -> None:
    async with mcp_client(door, "agent-a") as client:
        result = await client.call_tool("teleport", {"to": "Mars"})
    assert result.is_error is True
    assert [block.text for block in result.content] == ["Tool 'teleport' not found."]  # type: ignore[union-attr]
    assert result.meta is None or "io.toolfleet/call" not in result.meta


async def test_a_call_that_waits_for_approval_says_who_may_approve_it(
    door: str, fleet: InProcessFleet, redis: Redis
) -> None:
    async with mcp_client(door, "agent-a") as client:
        result = await client.call_tool("book_trip", {"city": "Cusco"})
    assert result.is_error is True
    meta = call_meta(result)
    assert (meta["status"], meta["effect"]) == ("pending_approval", "not_executed")
    assert "book_trip waits for approval" in result.content[0].text  # type: ignore[union-attr]
    entry = (await Ledger(redis, fleet.keys).read(TENANT_A, meta["run_id"], [meta["run_id"]]))[
        meta["run_id"]
    ]
    assert entry.pending_approval and entry.attempts == 0  # held for a person, never run


async def test_the_door_serves_health_without_a_token(door: str) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        answer = await http.get(door.removesuffix("/mcp") + "/healthz")
    assert answer.status_code == 200 and answer.text == "ok"


# --- access tokens of the console's OpenID Connect provider ----------------------------------

AGENT_CLIENT = "mcp-agent"
NOBODY_CLIENT = "mcp-nobody"
OTHER_RESOURCE = "http://other.example/mcp"


def machine_client(client_id: str) -> dict[str, Any]:
    """An oidc-provider client that gets access tokens with the client credentials grant."""
    return {
        "client_id": client_id,
        "client_secret": f"{client_id}-secret-0123456789abcdef",
        "grant_types": ["client_credentials"],
        "redirect_uris": [],
        "response_types": [],
        "token_endpoint_auth_method": "client_secret_post",
    }


async def access_token(issuer: str, client_id: str, resource: str) -> str:
    """A JWT access token of ``client_id`` for ``resource`` (RFC 8707), from the provider's
    token endpoint (found by discovery)."""
    async with httpx.AsyncClient(timeout=30) as http:
        found = (await http.get(f"{issuer}/.well-known/openid-configuration")).json()
        answer = await http.post(
            found["token_endpoint"],
            data={
                "grant_type": "client_credentials",
                "client_id": client_id,
                "client_secret": machine_client(client_id)["client_secret"],
                "resource": resource,
                "scope": "mcp",
            },
        )
    assert answer.status_code == 200, answer.text
    value: str = answer.json()["access_token"]
    assert value.count(".") == 2, "the provider issued an opaque token, not a JWT"
    return value


async def test_access_tokens_of_the_identity_provider_issued_for_the_door(
    fleet: InProcessFleet, redis: Redis, tmp_path: Path
) -> None:
    sock = free_socket()
    door_url = f"{base_of(sock)}/mcp"
    provider = OidcProvider(
        [machine_client(AGENT_CLIENT), machine_client(NOBODY_CLIENT)],
        {},
        tmp_path,
        resourceServers=[door_url, OTHER_RESOURCE],
        tokenClaims={
            AGENT_CLIENT: {"toolfleet_roles": ["operator"], "toolfleet_tenants": [TENANT_A]}
        },
    )
    issuer = await provider.start()
    try:
        door_settings = fleet.settings.model_copy(
            update={"console_oidc_issuer": issuer, "mcp_public_url": door_url}
        )
        async with served(create_app(door_settings), sock) as base:
            # RFC 9728: where a client learns which provider issues the door's tokens.
            async with httpx.AsyncClient(timeout=10) as http:
                metadata_url = f"{base}/.well-known/oauth-protected-resource/mcp"
                metadata = (await http.get(metadata_url)).json()
            assert metadata["resource"] == door_url
            assert metadata["authorization_servers"] == [issuer]
            anonymous = await post(door_url, rpc("tools/list"))
            assert anonymous.status_code == 401
            assert f'resource_metadata="{metadata_url}"' in anonymous.headers["www-authenticate"]

            agent_token = await access_token(issuer, AGENT_CLIENT, door_url)
            async with mcp_client(door_url, "", bearer=agent_token) as client:
                result = await client.call_tool("weather", {"city": "Quito"})
            assert result.is_error is False
            run = call_meta(result)["run_id"]
            entry = (await Ledger(redis, fleet.keys).read(TENANT_A, run, [run]))[run]
            assert entry.outcome is not None and entry.outcome.output == "Quito: 21°C, clear"

            # A token of the same provider for another resource is not the door's.
            elsewhere = await access_token(issuer, AGENT_CLIENT, OTHER_RESOURCE)
            refused = await post(door_url, rpc("tools/list"), Authorization=f"Bearer {elsewhere}")
            assert refused.status_code == 401
            # A valid token whose claims give no role may do nothing here.
            roleless = await access_token(issuer, NOBODY_CLIENT, door_url)
            refused = await post(door_url, rpc("tools/list"), Authorization=f"Bearer {roleless}")
            assert refused.status_code == 403
            assert "has no console role" in refused.json()["error"]["message"]
    finally:
        provider.stop()
