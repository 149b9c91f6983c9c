"""``toolfleet console``: serve the live console with uvicorn."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import secrets
from typing import TYPE_CHECKING

import click

from kernel.adapters.logs import configure_logging
from kernel.errors import ConfigurationError
from kernel.settings import Settings
from toolfleet.app.asgi import serve_asgi
from toolfleet.app.console._auth import configured

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
    prints ``console: URL`` on stdout once it answers (with the local login token in it, for
    a console with local login)."""
    from toolfleet.app.console._app import create_app

    def listening(url: str) -> None:
        login = f"?token={options.local_token}" if options.local_token else ""
        click.echo(f"console: {url}{login}")
        how = "local login URL" if options.local_token else "configured sign-in"
        log.info("console serving", extra={"url": url, "tenant": options.tenant, "sign_in": how})

    await serve_asgi(
        create_app(settings, options),
        host=host,
        port=port,
        path="/",
        grace_s=_GRACE_S,
        listening=listening,
    )


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, help="Port (0 picks a free one).")
@click.option("--tenant", default=None, help="Show and act for this tenant only.")
@click.option(
    "--refresh-s", default=2.0, show_default=True, help="How often task and circuit pages refresh."
)
def console(*, host: str, port: int, tenant: str | None, refresh_s: float) -> None:
    """The live console: turns and outcomes as they happen, a call's ledger entry and audit
    chain, human tasks and approvals, circuits and tool versions (a web page).

    Nobody uses it without signing in. Configure OpenID Connect
    (TOOLFLEET_CONSOLE_OIDC_ISSUER), API tokens (TOOLFLEET_CONSOLE_TOKENS) or a trusted proxy
    (TOOLFLEET_CONSOLE_PROXY_SECRET); with none of them, the console serves 127.0.0.1 only
    and prints a login URL that signs you in as an admin, for as long as this process runs
    (docs/console-access.md).
    """
    from toolfleet.app.console._app import ConsoleOptions

    settings = Settings()
    configure_logging("console", settings.log_level)
    local_token = None
    if not configured(settings):
        if not _loopback(host):
            raise click.UsageError(
                f"no sign-in is configured, so the console serves your own machine only "
                f"(--host 127.0.0.1), not {host}: to serve others, set "
                "TOOLFLEET_CONSOLE_OIDC_ISSUER (OpenID Connect), TOOLFLEET_CONSOLE_TOKENS "
                "(API tokens) or TOOLFLEET_CONSOLE_PROXY_SECRET (a trusted proxy); see "
                "docs/console-access.md"
            )
        local_token = secrets.token_urlsafe(32)
    options = ConsoleOptions(tenant=tenant or None, local_token=local_token, refresh_s=refresh_s)
    try:
        asyncio.run(serve(settings, options, host=host, port=port))
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None


def _loopback(host: str) -> bool:
    """Whether ``host`` is an address of this machine only (127.0.0.1, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
