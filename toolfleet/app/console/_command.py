"""``toolfleet console``: serve the live console with uvicorn."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import TYPE_CHECKING

import click

from kernel.adapters.logs import configure_logging
from kernel.settings import Settings

if TYPE_CHECKING:
    from toolfleet.app.console._app import ConsoleOptions

# uvicorn, Starlette and the application are imported when the console starts, not with the
# ``toolfleet`` command every service process runs.

log = logging.getLogger(__name__)

_GRACE_S = 2.0
"""How long open live connections may take to close when the console stops."""


async def serve(
    settings: Settings, options: ConsoleOptions, *, host: str = "127.0.0.1", port: int = 8080
) -> None:
    """Serve the console on ``host``:``port`` (0 picks a free port) until SIGINT or SIGTERM;
    prints ``console: URL`` on stdout once it answers."""
    import uvicorn

    from toolfleet.app.console._app import create_app

    class Server(uvicorn.Server):
        """uvicorn's server, saying where it listens once it does (SIGINT and SIGTERM stop
        it: uvicorn's own handlers, which also end the live connections)."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                click.echo(f"console: {url}")
                log.info("console serving", extra={"url": url, "tenant": options.tenant})

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(settings, options),
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=int(_GRACE_S),
        lifespan="on",
    )
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    url = f"http://{shown}:{bound}/"
    await Server(config).serve(sockets=[sock])


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, help="Port (0 picks a free one).")
@click.option("--tenant", default=None, help="Show and act for this tenant only.")
@click.option(
    "--operator",
    default=None,
    help="A fixed operator name for every decision (a console on your own machine).",
)
@click.option(
    "--operator-header",
    default="X-Forwarded-User",
    show_default=True,
    help="The request header the auth proxy in front of the console sets to the operator "
    "('' for none).",
)
@click.option(
    "--refresh-s", default=2.0, show_default=True, help="How often task and circuit pages refresh."
)
def console(
    *,
    host: str,
    port: int,
    tenant: str | None,
    operator: str | None,
    operator_header: str,
    refresh_s: float,
) -> None:
    """The live console: turns and outcomes as they happen, a call's ledger entry and audit
    chain, human tasks and approvals, circuits and tool versions (a web page)."""
    from toolfleet.app.console._app import ConsoleOptions

    settings = Settings()
    configure_logging("console", settings.log_level)
    options = ConsoleOptions(
        tenant=tenant or None,
        operator=operator or None,
        operator_header=operator_header or None,
        refresh_s=refresh_s,
    )
    asyncio.run(serve(settings, options, host=host, port=port))
