#!/bin/sh
# The Temporal CLI, whose `temporal server start-dev` is the Temporal baseline of the bench
# (bench/temporal_peer.py). Built with `go install` from the Go module proxy into
# $(go env GOPATH)/bin: this machine reaches the proxy but not GitHub's release downloads.
# It takes about five minutes the first time (a large module graph), then nothing. A binary
# built this way reports `0.0.0-DEV` as its own version (the server inside is 1.29.1).
set -eu
# Go is not always on PATH in a non-login shell; /usr/local/go is where it is installed here.
PATH="$PATH:/usr/local/go/bin"
export PATH
bin="$(go env GOPATH)/bin"
if [ -x "$bin/temporal" ]; then
  found="$bin/temporal"
elif found="$(command -v temporal 2>/dev/null)"; then
  :
else
  echo "installing the temporal CLI (go install, first time only, ~5 min)..." >&2
  go install github.com/temporalio/cli/cmd/temporal@v1.5.1
  found="$bin/temporal"
fi
"$found" --version >/dev/null
echo "temporal: $found"
