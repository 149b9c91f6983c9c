"""The MCP front door (``toolfleet mcp``): the fleet's tools for any MCP client.

A Streamable HTTP MCP server (the ``mcp`` package, 2.x): ``tools/list`` is the tool directory
the workers publish, each tool with annotations from its declared effect class; ``tools/call``
is a one-call turn on the fleet for the caller's tenant, with every guarantee a FleetClient
turn has. Stateless, so any number of replicas serve behind a load balancer. Callers
authenticate as the MCP authorization specification asks of a resource server: a bearer
token, static (``TOOLFLEET_MCP_TOKENS``) or a JWT access token of the console's OpenID
Connect provider issued for the door's URL; the tenant and the role come from the token.

- ``create_app(settings, options)``: the ASGI application;
- ``DoorOptions``: how long a call waits, the body limit; ``TaskLimits``: how tasks wait and
  page;
- ``serve``: run it with uvicorn; ``mcp``: the click command.
"""

from typing import TYPE_CHECKING, Any

from kernel.errors import MissingExtraError
from toolfleet.app.mcp._command import mcp, serve

if TYPE_CHECKING:
    from toolfleet.app.mcp._app import DoorOptions, create_app
    from toolfleet.app.mcp._tasks import TaskLimits


def __getattr__(name: str) -> Any:
    """The application, imported on first use: every ``toolfleet`` command (a service
    process too) imports this package for its ``mcp`` command, the mcp package need not."""
    if name in ("DoorOptions", "create_app", "TaskLimits"):
        try:
            from toolfleet.app.mcp import _app, _tasks
        except ModuleNotFoundError as exc:  # the mcp package and the rest come with the extra
            raise MissingExtraError("the MCP door", extra="mcp", missing=exc.name) from exc

        return getattr(_tasks if name == "TaskLimits" else _app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DoorOptions", "TaskLimits", "create_app", "mcp", "serve"]
