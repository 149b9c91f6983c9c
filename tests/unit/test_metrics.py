"""What every service's /metrics carries besides its own counters: the process, the build,
consumer lag and the backlog gauges; and the optional tool label of histograms."""

from __future__ import annotations

import platform
from importlib import metadata

from prometheus_client import generate_latest

from kernel.adapters import metrics
from kernel.adapters.metrics import REGISTRY, configure_metrics, tool_label
from kernel.settings import Settings


def _families() -> dict[str, str]:
    return {family.name: family.type for family in REGISTRY.collect()}


def test_the_registry_serves_process_platform_and_gc_collectors() -> None:
    families = _families()
    for name in ("process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds"):
        assert name in families, name
    assert "python_info" in families
    assert "python_gc_collections" in families
    exposed = generate_latest(REGISTRY).decode()
    assert "\nprocess_resident_memory_bytes " in exposed


def test_the_registry_has_lag_build_and_backlog_metrics() -> None:
    families = _families()
    assert families["toolfleet_consumer_lag"] == "gauge"
    assert families["toolfleet_build_info"] == "gauge"
    assert families["toolfleet_human_tasks_open"] == "gauge"
    assert families["toolfleet_unknown_effects_unresolved"] == "gauge"
    assert families["toolfleet_unknown_effects_oldest_age_seconds"] == "gauge"
    assert families["toolfleet_tenant_calls"] == "gauge"  # waiting and admitted per tenant


def test_build_info_names_the_version_python_and_service() -> None:
    configure_metrics("planner")
    configure_metrics("worker-default")  # one service per process: the last one counts
    (family,) = [f for f in REGISTRY.collect() if f.name == "toolfleet_build_info"]
    (sample,) = family.samples
    assert sample.value == 1
    assert sample.labels == {
        "version": metadata.version("toolfleet"),
        "python": platform.python_version(),
        "service": "worker-default",
    }


def test_the_tool_label_of_histograms_can_be_one_constant() -> None:
    assert Settings().metrics_tool_label is True
    try:
        configure_metrics("worker-default", tool_label=True)
        assert tool_label("create_ticket") == "create_ticket"
        configure_metrics("worker-default", tool_label=False)
        assert tool_label("create_ticket") == metrics.ALL_TOOLS == "*"
    finally:
        configure_metrics("worker-default", tool_label=True)


def test_labelled_counts_in_the_same_series_as_labels() -> None:
    series = ("worker-unit", "unit-tool", "succeeded", "applied")
    names = {"service": series[0], "tool": series[1], "status": series[2], "effect": series[3]}
    metrics.OUTCOMES.labels(*series).inc()
    metrics.labelled(metrics.OUTCOMES, *series).inc()
    metrics.labelled(metrics.OUTCOMES, *series).inc()
    assert metrics.labelled(metrics.OUTCOMES, *series) is metrics.OUTCOMES.labels(*series)
    assert REGISTRY.get_sample_value("toolfleet_outcomes_total", names) == 3
