#!/usr/bin/env sh
# Installs the OpenID Connect provider the console's login tests start (panva's
# oidc-provider, in tests/integration/oidc), exactly as its package-lock.json pins it
# (npm ci; npm's own cache serves a second install). Nothing to do when the installed
# packages are newer than the lock file.
set -eu
dir="$(cd "$(dirname "$0")/.." && pwd)/tests/integration/oidc"
if ! command -v npm >/dev/null 2>&1; then
    echo "install-oidc-provider: npm is missing: install Node.js 20 or later (the console's" \
         "login tests run oidc-provider on it)" >&2
    exit 1
fi
installed="$dir/node_modules/.package-lock.json"
if [ -f "$installed" ] && [ "$installed" -nt "$dir/package-lock.json" ]; then
    exit 0
fi
npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error
