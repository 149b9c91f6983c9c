#!/usr/bin/env bash
# The steps of the Dockerfile, runnable without Docker (make image-check runs them here).
#   docker/steps.sh wheels DIR     build toolfleet's wheel and every dependency's into DIR
#   docker/steps.sh install DIR    install toolfleet from DIR only (no index), as the image does
#   docker/steps.sh check          what the image's entrypoint must do: toolfleet --help
set -euo pipefail
step="$1"
case "$step" in
  wheels)
    out="$2"
    python -m pip wheel --no-cache-dir --wheel-dir "$out" .
    ;;
  install)
    from="$2"
    python -m pip install --no-cache-dir --no-index --find-links "$from" toolfleet
    ;;
  check)
    toolfleet --help >/dev/null
    toolfleet worker --help >/dev/null
    python -c "import toolfleet, executors, planner, aggregator, reconciler, schemas, kernel"
    ;;
  *)
    echo "unknown step: $step (wheels DIR | install DIR | check)" >&2
    exit 2
    ;;
esac
