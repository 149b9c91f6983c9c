"""Serving an ASGI application with uvicorn: the console's and the MCP door's one way."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any


async def serve_asgi(
    app: Any,
    *,
    host: str,
    port: int,
    path: str,
    grace_s: float,
    listening: Callable[[str], None],
) -> None:
    """Serve ``app`` on ``host``:``port`` (0 picks a free port; an IPv6 address works too)
    until SIGINT or SIGTERM (uvicorn's own handlers, which also end open connections, given
    ``grace_s`` to close); ``listening`` is called with the URL of ``path`` once it answers."""
    import uvicorn  # with the command that serves, not with every service process

    class Server(uvicorn.Server):
        """uvicorn's server, saying where it listens once it does."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                listening(url)

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
    # sockets whose proto says TCP, and with it on, every response on a kept-alive connection
    # waited ~40 ms for the client's delayed ACK (bench/results/console-history.md).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=int(grace_s),
        lifespan="on",
    )
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    url = f"http://{shown}:{bound}{path}"
    await Server(config).serve(sockets=[sock])
