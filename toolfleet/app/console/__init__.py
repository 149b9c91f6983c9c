"""The live console: a small web application for operators (``toolfleet console``).

It shows turns and outcomes as they happen (its own Kafka consumer of ``turn-results`` and
``outcomes``, pushed to the browser as server-sent events, filtered by tenant, run or tool), a
call's ledger entry, audit chain, upstream reference and trace link, the human task queue and
the calls waiting for approval, and circuits and tool versions. Its decisions (resolve a task,
approve or reject a call, resume a circuit, roll a tool back) are the operator commands' own
(``toolfleet.app.operations``), signed for the identity that is signed in.

Nobody uses it anonymously: people sign in with OpenID Connect, scripts send an API token, or
a trusted proxy (one that knows the proxy secret) names the person; on one's own machine, with
none of these configured, it serves 127.0.0.1 only and prints a login URL for that process
(docs/console-access.md). Every identity has a role (viewer, operator, admin) and tenants.

- ``create_app(settings, options)``: the ASGI application;
- ``ConsoleOptions``: the console's tenant, the local login token, buffer sizes;
- ``serve``: run it with uvicorn; ``console``: the click command;
- ``Identity``, ``Role``: who is signed in; ``CSRF_HEADER``: what the page sends with a
  decision; ``NotAuthenticatedError`` (401) and ``CrossSiteRequestError`` (403).
"""

from typing import TYPE_CHECKING, Any

from kernel.errors import MissingExtraError
from toolfleet.app.console._access import (
    CSRF_HEADER,
    CrossSiteRequestError,
    NotAuthenticatedError,
)
from toolfleet.app.console._command import console, serve
from toolfleet.app.identity import Identity, Role

if TYPE_CHECKING:
    from toolfleet.app.console._app import ConsoleOptions, create_app


def __getattr__(name: str) -> Any:
    """The application, imported on first use: every ``toolfleet`` command (a service
    process too) imports this package for its ``console`` command, Starlette need not."""
    if name in ("ConsoleOptions", "create_app"):
        try:
            from toolfleet.app.console import _app
        except ModuleNotFoundError as exc:  # Starlette and the rest come with the extra
            raise MissingExtraError("the console", extra="console", missing=exc.name) from exc

        return getattr(_app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CSRF_HEADER",
    "ConsoleOptions",
    "CrossSiteRequestError",
    "Identity",
    "NotAuthenticatedError",
    "Role",
    "console",
    "create_app",
    "serve",
]
