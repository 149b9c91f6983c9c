#!/usr/bin/env bash
# The steps of the Dockerfile, runnable without Docker (make image-check runs them here).
#   docker/steps.sh wheels DIR     build toolfleet's wheel and every dependency's into DIR
#   docker/steps.sh install DIR    install toolfleet from DIR only (no index), as the image does
#   docker/steps.sh check          what the image's entrypoint must do: toolfleet --help, and
#                                  each installed extra's part imports
# TOOLFLEET_EXTRAS names the extras the image carries (comma separated; the Dockerfile's EXTRAS
# build argument): by default the console, the MCP door, OTLP export and the Agents SDK (SDK
# tools on workers).
set -euo pipefail
step="$1"
extras="${TOOLFLEET_EXTRAS-agents,console,mcp,otlp}"
case "$step" in
  wheels)
    out="$2"
    python -m pip wheel --no-cache-dir --wheel-dir "$out" ".${extras:+[$extras]}"
    ;;
  install)
    from="$2"
    python -m pip install --no-cache-dir --no-index --find-links "$from" \
      "toolfleet${extras:+[$extras]}"
    ;;
  check)
    toolfleet --help >/dev/null
    toolfleet worker --help >/dev/null
    toolfleet console --help >/dev/null
    python -c "import toolfleet, executors, planner, aggregator, reconciler, schemas, kernel"
    if [[ ",$extras," == *,all,* ]]; then extras="agents,console,mcp,otlp,containers"; fi
    IFS=, read -ra wanted <<<"$extras"
    for extra in "${wanted[@]}"; do
      case "$extra" in
        agents) python -c "from toolfleet.agents import FleetRunner" ;;
        console) python -c "from toolfleet.app.console import create_app" ;;
        mcp) toolfleet mcp --help >/dev/null && python -c "from toolfleet.app.mcp import create_app" ;;
        otlp) python -c "import opentelemetry.exporter.otlp.proto.http.trace_exporter" ;;
        containers) python -c "import testcontainers.kafka, testcontainers.redis" ;;
        *) echo "unknown extra: $extra" >&2; exit 2 ;;
      esac
    done
    ;;
  *)
    echo "unknown step: $step (wheels DIR | install DIR | check)" >&2
    exit 2
    ;;
esac
