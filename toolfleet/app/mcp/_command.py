"""``toolfleet mcp``: serve the MCP front door with uvicorn."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import click

from kernel.adapters.logs import configure_logging
from kernel.errors import ConfigurationError
from kernel.settings import Settings
from toolfleet.app.asgi import serve_asgi

if TYPE_CHECKING:
    from toolfleet.app.mcp._app import DoorOptions

# uvicorn, Starlette and the mcp package are imported when the door starts, not with the
# ``toolfleet`` command every service process runs.

log = logging.getLogger(__name__)

_GRACE_S = 2.0
"""How long open calls may take to close when the door stops (a client retries elsewhere)."""


async def serve(
    settings: Settings,
    options: DoorOptions | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8090,
) -> None:
    """Serve the door on ``host``:``port`` (0 picks a free port) until SIGINT or SIGTERM;
    prints ``mcp: URL`` on stdout once it answers."""
    # Through the package, first: without the mcp extra, the error names it (uvicorn comes
    # with the mcp package).
    from toolfleet.app.mcp import create_app
    from toolfleet.app.mcp._app import path_of

    await serve_asgi(
        create_app(settings, options),
        host=host,
        port=port,
        path=path_of(settings),
        grace_s=_GRACE_S,
        listening=lambda url: click.echo(f"mcp: {url}"),
    )


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8090, show_default=True, help="Port (0 picks a free one).")
def mcp(*, host: str, port: int) -> None:
    """The MCP front door: the fleet's tools for any MCP client (Streamable HTTP).

    Every tool call is a one-call turn on the fleet for the caller's tenant, with the
    fleet's guarantees. Stateless: run as many replicas as you like behind a load balancer.
    Callers send a bearer token: a static token (TOOLFLEET_MCP_TOKENS) or an access token of
    the console's OpenID Connect provider issued for TOOLFLEET_MCP_PUBLIC_URL (docs/mcp.md).
    """
    settings = Settings()
    configure_logging("mcp", settings.log_level)
    try:
        asyncio.run(serve(settings, host=host, port=port))
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None
