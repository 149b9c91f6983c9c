#!/usr/bin/env sh
# Installs redis-server (used by `toolfleet infra up`) unless it is already on PATH.
# Debian/Ubuntu only; elsewhere install Redis 7+ yourself or point REDIS_URL at one.
set -eu
here=$(dirname "$0")

if command -v redis-server >/dev/null 2>&1; then
    echo "redis-server already installed: $(command -v redis-server)"
    exit 0
fi
sh "$here/apt-install.sh" redis-server redis-server \
    "install redis-server (Redis 7+) with your package manager, or set REDIS_URL to an existing Redis."
# The distribution's service would hold port 6379; toolfleet runs its own redis-server.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    if [ "$(id -u)" -eq 0 ]; then as_root=""; else as_root="sudo -n"; fi
    $as_root systemctl disable --now redis-server >/dev/null 2>&1 || true
fi
echo "installed $(redis-server --version)"
