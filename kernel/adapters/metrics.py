"""Prometheus metrics of every service, in one registry served on ``/metrics``."""

from __future__ import annotations

import functools
import json
import logging
import platform
import threading
from collections.abc import Iterable
from importlib import metadata
from typing import Any, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    make_wsgi_app,
)
from prometheus_client.exposition import ThreadingWSGIServer

from kernel.adapters.health import HEALTH

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)
"""The registry every toolfleet metric lives in; one process serves one service."""

# The process's own health beside the fleet's: CPU and resident memory (process_*, from
# /proc), the interpreter (python_info) and the garbage collector (python_gc_*; the services
# tune it, see toolfleet.app.service.tune_gc). prometheus_client's default instances,
# registered here too: this registry, not the default one, is what /metrics serves.
for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_collector)

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

MESSAGES = Counter(
    "toolfleet_messages_total",
    "Messages consumed, by topic and result (processed, dead_lettered, retried; rewound "
    "counts a partition read again from its committed offset after a lost Redis connection).",
    ["service", "topic", "result"],
    registry=REGISTRY,
)
DEAD_LETTERS = Counter(
    "toolfleet_dead_letters_total",
    "Messages sent to the dead-letter topic, by original topic.",
    ["service", "topic"],
    registry=REGISTRY,
)
COMMANDS = Counter(
    "toolfleet_commands_total",
    "Execution commands emitted (planner, reconciler) or received (worker), by kind.",
    ["service", "pool", "kind"],
    registry=REGISTRY,
)
IN_FLIGHT = Gauge(
    "toolfleet_calls_in_flight",
    "Tool calls currently running in this worker process.",
    ["pool"],
    registry=REGISTRY,
)
OUTCOMES = Counter(
    "toolfleet_outcomes_total",
    "Call outcomes written, by transport status and business effect.",
    ["service", "tool", "status", "effect"],
    registry=REGISTRY,
)
CALL_LATENCY = Histogram(
    "toolfleet_call_duration_seconds",
    "Time a tool call took inside the worker, from start to outcome written.",
    ["pool", "tool"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
TURN_LATENCY = Histogram(
    "toolfleet_turn_duration_seconds",
    "Time from a turn's plan to its TurnResult.",
    ["status"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
PLAN_LATENCY = Histogram(
    "toolfleet_plan_duration_seconds",
    "Time the planner took to plan one model response.",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)


CIRCUIT_OPEN = Gauge(
    "toolfleet_circuit_open",
    "1 while the circuit of a tool version is open (alert on this).",
    ["tool_version"],
    registry=REGISTRY,
)
HUMAN_TASKS = Counter(
    "toolfleet_human_tasks_total",
    "Human tasks filed, by kind.",
    ["kind"],
    registry=REGISTRY,
)


def serve_metrics(port: int, host: str = "0.0.0.0") -> int:
    """Serve ``/metrics``, ``/livez`` and ``/readyz`` on ``port`` (0 picks a free one), from a
    thread; returns the bound port. Any other path is 404."""
    metrics = make_wsgi_app(REGISTRY)

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        if path == "/livez":
            ok = HEALTH.live()
            return _answer(start_response, ok, {"live": ok})
        if path == "/readyz":
            ready, checks = HEALTH.ready()
            return _answer(start_response, ready, {"ready": ready, **checks})
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: /metrics, /livez, /readyz\n"]

    server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True, name="metrics").start()
    bound = int(server.server_address[1])
    log.info("serving metrics", extra={"port": bound})
    return bound


def _answer(start_response: Any, ok: bool, body: dict[str, bool]) -> list[bytes]:
    status = "200 OK" if ok else "503 Service Unavailable"
    start_response(status, [("Content-Type", "application/json")])
    return [json.dumps(body).encode() + b"\n"]


class _QuietHandler(WSGIRequestHandler):
    """No access log line per probe or scrape."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


ADMITTED = Counter(
    "toolfleet_admitted_total",
    "Calls admitted to Kafka by the planners' admission, per pool.",
    ["pool"],
    registry=REGISTRY,
)
ADMISSION_WAIT = Histogram(
    "toolfleet_admission_wait_seconds",
    "Time a call waited for admission (capacity, quotas, rate limits), per pool.",
    ["pool"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
THROTTLED = Counter(
    "toolfleet_throttled_total",
    "HTTP 429s from a tool that slowed its rate buckets, per tool.",
    ["tool"],
    registry=REGISTRY,
)
TENANT_CALLS = Gauge(
    "toolfleet_tenant_calls",
    "Calls running (admitted) and waiting for admission, fleet-wide, for the 10 tenants with "
    'the most waiting and the rest as tenant="other" (every planner reports the same).',
    ["tenant", "state"],
    registry=REGISTRY,
)
CONSUMER_LAG = Gauge(
    "toolfleet_consumer_lag",
    "Records of a partition this process owns that its consumer group has not committed yet "
    "(the partition's last stable offset minus the group's committed offset), sampled every "
    "few seconds by kernel.adapters.lag.",
    ["group", "topic", "partition"],
    registry=REGISTRY,
)
HUMAN_TASKS_OPEN = Gauge(
    "toolfleet_human_tasks_open",
    "Human tasks waiting for an operator, fleet-wide, by kind (every reconciler reports the same).",
    ["kind"],
    registry=REGISTRY,
)
UNKNOWN_EFFECTS = Gauge(
    "toolfleet_unknown_effects_unresolved",
    "Calls whose effect is unknown and not resolved yet (probing, waiting for a retry or for a "
    "human), fleet-wide (every reconciler reports the same).",
    registry=REGISTRY,
)
UNKNOWN_EFFECTS_AGE = Gauge(
    "toolfleet_unknown_effects_oldest_age_seconds",
    "How long the oldest unresolved unknown effect has been unknown (0 when there is none).",
    registry=REGISTRY,
)
BUILD_INFO = Gauge(
    "toolfleet_build_info",
    "Always 1: the toolfleet version, the Python version and the service of this process.",
    ["version", "python", "service"],
    registry=REGISTRY,
)

ALL_TOOLS = "*"
"""The ``tool`` label's value on histograms when ``metrics_tool_label`` is off.

Prometheus fixes a metric's label names, so the label stays and carries this one constant:
every query that groups or filters by ``tool`` keeps working (``tool=~".*"`` matches it), and
a fleet with many tools exports one histogram per pool instead of one per tool."""


class _Options:
    """What ``configure_metrics`` set for this process (one service per process)."""

    tool_label = True


_OPTIONS = _Options()


def configure_metrics(service: str, *, tool_label: bool = True) -> None:
    """What this process's metrics say about it: ``toolfleet_build_info`` for ``service``,
    and whether histograms carry each call's tool (``Settings.metrics_tool_label``)."""
    _OPTIONS.tool_label = tool_label
    BUILD_INFO.clear()
    BUILD_INFO.labels(build_version(), platform.python_version(), service).set(1)


_M = TypeVar("_M", Counter, Gauge, Histogram)


@functools.lru_cache(maxsize=4096)
def labelled(metric: _M, *values: str) -> _M:
    """``metric.labels(*values)``, looked up once per label set: the services count every
    call, and prometheus_client validates and locks on each ``labels`` call. Only for
    metrics that are never cleared (a cleared metric's cached child would count unseen)."""
    return metric.labels(*values)


def tool_label(name: str) -> str:
    """The ``tool`` label value of a histogram sample: the tool's name, or ``ALL_TOOLS``."""
    return name if _OPTIONS.tool_label else ALL_TOOLS


def build_version() -> str:
    """The toolfleet release this process runs (``0`` from a source tree never installed)."""
    try:
        return metadata.version("toolfleet")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0"
