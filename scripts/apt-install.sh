#!/usr/bin/env sh
# Installs Debian packages for the local set-up: `apt-install.sh COMMAND PACKAGE HINT` does
# nothing when COMMAND is already on PATH, else installs PACKAGE with apt-get (as root, or
# through passwordless sudo: -n never prompts in CI). Without apt-get it prints HINT and fails.
set -eu
command_name=$1 package=$2 hint=$3

if command -v "$command_name" >/dev/null 2>&1; then
    echo "$command_name already installed: $(command -v "$command_name")"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "apt-get not found: $hint" >&2
    exit 1
fi

if [ "$(id -u)" -eq 0 ]; then
    as_root=""
else
    as_root="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
# Set-up targets may run side by side (make -j2 setup chart-tools): one apt at a time, the
# others wait for it (flock, util-linux) rather than failing on apt's lock.
lock=""
if command -v flock >/dev/null 2>&1; then
    lock="flock ${TMPDIR:-/tmp}/toolfleet-apt.lock"
fi
$as_root $lock apt-get update
$as_root $lock apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends "$package"
