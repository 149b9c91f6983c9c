"""``toolfleet mcp``: serve the MCP front door with uvicorn."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import TYPE_CHECKING

import click

from kernel.adapters.logs import configure_logging
from kernel.errors import ConfigurationError
from kernel.settings import Settings

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

    app = create_app(settings, options)
    import uvicorn

    from toolfleet.app.mcp._app import path_of

    class Server(uvicorn.Server):
        """uvicorn's server, saying where it listens once it does."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                click.echo(f"mcp: {url}")

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=int(_GRACE_S),
        lifespan="on",
    )
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    url = f"http://{shown}:{bound}{path_of(settings)}"
    await Server(config).serve(sockets=[sock])


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
