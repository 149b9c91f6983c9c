#!/usr/bin/env sh
# Installs Debian's chromium (the console's browser tests drive it headless through
# Playwright) unless it is already on PATH. Debian/Ubuntu only; Playwright's own browser
# downloads are never used.
set -eu

if command -v chromium >/dev/null 2>&1; then
    echo "chromium already installed: $(command -v chromium)"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "apt-get not found: install chromium with your package manager" >&2
    echo "(the console's browser tests expect it at /usr/bin/chromium)." >&2
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
$as_root apt-get install -y --no-install-recommends chromium
echo "installed $(chromium --version 2>/dev/null || echo chromium)"
