"""The door's ASGI application: MCP Streamable HTTP, stateless, behind an OAuth 2.1 resource
server's bearer check.

Assembled from the ``mcp`` package's own parts, as its ``Server.streamable_http_app`` does,
because that helper only checks bearer tokens when an authorization server is configured,
and a small install has static tokens only:

- ``StreamableHTTPSessionManager(stateless=True)``: a fresh transport per request, so any
  replica answers any request behind a plain load balancer;
- ``BearerAuthBackend`` + ``RequireAuthMiddleware`` with the door's ``Verifier``: no token,
  or one that does not check out, is 401 with ``WWW-Authenticate: Bearer`` (and the
  ``resource_metadata`` URL when there is an issuer);
- ``Gate``: the tenant and the role, 403 otherwise;
- RFC 9728 protected-resource metadata (``/.well-known/oauth-protected-resource<path>``)
  naming the console's OpenID Connect issuer, when one is configured.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from urllib.parse import urlsplit

from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.routes import build_resource_metadata_url, create_protected_resource_routes
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE, TransportSecuritySettings
from pydantic import AnyHttpUrl, ConfigDict, TypeAdapter
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from kernel.adapters.redis import connect_redis
from kernel.settings import Settings
from kernel.stores.door import Stores
from toolfleet.app.identity import ROLES
from toolfleet.app.mcp._calls import CallLimits, Calls
from toolfleet.app.mcp._gate import Gate
from toolfleet.app.mcp._server import Door
from toolfleet.app.mcp._tasks import TaskLimits, Tasks
from toolfleet.app.mcp._tokens import Verifier
from toolfleet.client import FleetClient

log = logging.getLogger(__name__)

DEFAULT_PATH = "/mcp"
"""Where the door serves MCP when ``TOOLFLEET_MCP_PUBLIC_URL`` names no path of its own."""


@dataclass(frozen=True)
class DoorOptions:
    """How one door process serves."""

    limits: CallLimits = field(default_factory=CallLimits)
    """How long a plain call waits for its call to settle."""
    task_limits: TaskLimits = field(default_factory=TaskLimits)
    """How long ``tasks/result`` waits, and how often a wait reads the ledger again."""
    max_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_SIZE
    """Largest request body accepted (the ``mcp`` package's default, 4 MiB)."""
    directory_within_s: float = 10.0
    """How long start-up waits to read the tool directory to its end."""


def path_of(settings: Settings) -> str:
    """The path MCP is served at: the public URL's, else ``/mcp``."""
    public = settings.mcp_public_url
    path = urlsplit(public).path.rstrip("/") if public else ""
    return path or DEFAULT_PATH


def _toolfleet_version() -> str:
    try:
        return version("toolfleet")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "0"


def create_app(settings: Settings, options: DoorOptions | None = None) -> Starlette:
    """The door as an ASGI application over ``settings``' fleet.

    Its lifespan starts a ``FleetClient`` (the tool directory is read before the first
    request is served) and the stateless MCP transport; tasks and idempotency keys read and
    write the fleet's Redis (``REDIS_URL``) through its stores. ConfigurationError when the settings
    give the door no way to authenticate its callers.
    """
    options = options or DoorOptions()
    verifier = Verifier(settings)
    client = FleetClient(settings)
    redis = connect_redis(settings)
    tasks = Tasks(client, Stores(redis, settings), options.task_limits)
    door = Door(client, Calls(client, options.limits), tasks, version=_toolfleet_version())
    manager = StreamableHTTPSessionManager(
        app=door.server,
        stateless=True,
        json_response=False,
        # Host and Origin are checked by the gate's Origin rule only: every request carries
        # a bearer token, which a DNS-rebinding page does not have.
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        max_request_body_size=options.max_body_bytes,
    )
    path = path_of(settings)
    issuer, public = settings.console_oidc_issuer, settings.mcp_public_url
    metadata_url = str(build_resource_metadata_url(_url(public))) if public else None
    gate = Gate(
        StreamableHTTPASGIApp(manager),
        tenant_header=settings.mcp_tenant_header,
        resource_metadata_url=metadata_url if issuer else None,
        max_body_bytes=options.max_body_bytes,
        allowed_origins=_origins(public),
    )
    endpoint = RequireAuthMiddleware(
        gate, [], _url(metadata_url) if metadata_url and issuer else None
    )
    routes: list[BaseRoute] = [
        Route(path, endpoint=endpoint, methods=["GET", "POST", "DELETE"]),
        Route("/healthz", endpoint=_healthz, methods=["GET"]),
    ]
    if issuer and public:
        routes += create_protected_resource_routes(
            resource_url=_url(public),
            authorization_servers=[_url(issuer)],
            scopes_supported=list(ROLES),
            resource_name="toolfleet MCP door",
        )

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            async with client:
                await client.tool_specs(within=options.directory_within_s)
                async with manager.run():
                    log.info(
                        "MCP door serving",
                        extra={"path": path, "oidc": bool(issuer), "tokens": len(verifier.tokens)},
                    )
                    yield
        finally:
            await redis.aclose()

    return Starlette(
        routes=routes,
        middleware=[Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(verifier))],
        lifespan=lifespan,
    )


async def _healthz(_request: Request) -> Response:
    """200 once the door serves (its lifespan started the fleet client)."""
    return PlainTextResponse("ok")


_URL = TypeAdapter(AnyHttpUrl, config=ConfigDict(url_preserve_empty_path=True))


def _url(value: str) -> AnyHttpUrl:
    """``value`` as a URL, spelled as given: an issuer is compared as a string (RFC 8414), so
    no trailing slash may be added to it."""
    return _URL.validate_python(value)


def _origins(public: str | None) -> tuple[str, ...]:
    """The browser origins allowed to call the door: the public URL's, and loopback."""
    found = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
    if public:
        parts = urlsplit(public)
        found.append(f"{parts.scheme}://{parts.netloc}")
    return tuple(found)
