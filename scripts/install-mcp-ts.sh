#!/usr/bin/env sh
# Installs the official TypeScript MCP SDK the MCP door's tests drive with Node
# (@modelcontextprotocol/sdk, in tests/integration/mcp_ts), exactly as its package-lock.json
# pins it (npm ci; npm's own cache serves a second install). Nothing to do when the
# installed packages are newer than the lock file.
set -eu
dir="$(cd "$(dirname "$0")/.." && pwd)/tests/integration/mcp_ts"
if ! command -v npm >/dev/null 2>&1; then
    echo "install-mcp-ts: npm is missing: install Node.js 20 or later (the MCP door's tests" \
         "run the TypeScript SDK's client on it)" >&2
    exit 1
fi
installed="$dir/node_modules/.package-lock.json"
if [ -f "$installed" ] && [ "$installed" -nt "$dir/package-lock.json" ]; then
    exit 0
fi
npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error
