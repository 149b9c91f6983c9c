#!/usr/bin/env sh
# Installs Debian's chromium (the console's browser tests drive it headless through
# Playwright) unless it is already on PATH. Debian/Ubuntu only; Playwright's own browser
# downloads are never used.
set -eu
sh "$(dirname "$0")/apt-install.sh" chromium chromium \
    "install chromium with your package manager (the console's browser tests expect it at /usr/bin/chromium)."
