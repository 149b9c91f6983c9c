#!/usr/bin/env sh
# Installs the PostgreSQL server (used by the bench's DBOS baseline, bench/dbos_peer.py) unless
# its binaries are already there. Debian/Ubuntu only; elsewhere install PostgreSQL 13+ yourself
# (initdb and postgres on PATH).
set -eu
here=$(dirname "$0")

# Debian keeps initdb, pg_ctl and postgres under /usr/lib/postgresql/<version>/bin, off PATH
# (pg_ctlcluster wraps them; it comes with postgresql-common, which can be there without any
# server), so look for initdb itself: on PATH elsewhere, in the versioned directory on Debian.
find_initdb() {
    if command -v initdb >/dev/null 2>&1; then
        command -v initdb
        return 0
    fi
    ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1
}

found=$(find_initdb)
if [ -n "$found" ]; then
    echo "PostgreSQL server already installed: $found"
    exit 0
fi
# initdb is never on PATH on Debian, so apt-install.sh does not skip the install.
sh "$here/apt-install.sh" initdb postgresql \
    "install the PostgreSQL server (13+, with initdb and postgres) with your package manager."

# The package creates and starts a cluster of its own on port 5432; the bench runs a private
# one (127.0.0.1:15432, its own directory) only while it needs it, so that one is not wanted.
if [ "$(id -u)" -eq 0 ]; then as_root=""; else as_root="sudo -n"; fi
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $as_root systemctl disable --now postgresql >/dev/null 2>&1 || true
elif command -v pg_lsclusters >/dev/null 2>&1; then
    pg_lsclusters --no-header 2>/dev/null | while read -r version cluster _port status _rest; do
        if [ "$cluster" = main ] && [ "$status" = online ]; then
            $as_root pg_ctlcluster "$version" main stop || true
        fi
    done
fi
found=$(find_initdb)
if [ -z "$found" ]; then
    echo "postgresql installed, but no initdb found" >&2
    exit 1
fi
echo "installed $("$(dirname "$found")/postgres" --version)"
