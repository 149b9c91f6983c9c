#!/usr/bin/env sh
# Installs redis-server (used by `toolfleet infra up`) unless it is already on PATH.
# Debian/Ubuntu only; elsewhere install Redis 7+ yourself or point REDIS_URL at one.
set -eu

if command -v redis-server >/dev/null 2>&1; then
    echo "redis-server already installed: $(command -v redis-server)"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "apt-get not found: install redis-server (Redis 7+) with your package manager," >&2
    echo "or set REDIS_URL to an existing Redis." >&2
    exit 1
fi

# Root runs apt-get directly; anyone else needs passwordless sudo (-n: never prompt in CI).
if [ "$(id -u)" -eq 0 ]; then
    as_root=""
else
    as_root="sudo -n"
fi

export DEBIAN_FRONTEND=noninteractive
$as_root apt-get update
$as_root apt-get install -y --no-install-recommends redis-server
# The distribution's service would hold port 6379; toolfleet runs its own redis-server.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $as_root systemctl disable --now redis-server >/dev/null 2>&1 || true
fi
echo "installed $(redis-server --version)"
