"""A small MCP server (stdio) for the differential suite: ``-m tests.integration.mcp_server``.

Its tools count their runs in Redis under the side that started the server (``MCP_SIDE``:
"sdk" for the test process, "fleet" for a worker), keyed by their argument, so a test can
compare how often each side ran the same call.
"""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

from tests.integration.side_effects import side_effects

server = MCPServer(name="toolfleet-test")


def runs_key(side: str, city: str) -> str:
    """Redis counter: how many times ``mcp_book`` ran for ``city`` on ``side``."""
    return f"test:mcp:{side}:book:{city}"


@server.tool()
def mcp_weather(city: str) -> str:
    """The weather in a city (read-only)."""
    return f"sunny in {city}"


@server.tool()
def mcp_book(city: str) -> str:
    """Books a trip to a city (counts its runs)."""
    side_effects().incr(runs_key(os.environ.get("MCP_SIDE", "unknown"), city))
    return f"booked {city}"


if __name__ == "__main__":
    server.run("stdio")
