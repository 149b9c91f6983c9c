"""The Grafana dashboard and the alerts the chart ships use only metrics the services serve.

Every query is parsed by a real PromQL parser (``promql-parser``, the Prometheus grammar):
a query that would not parse in Prometheus fails here, and the metric names are read off
its syntax tree (every vector selector, bare or ``{__name__="..."}``), so function names,
label names, keywords, durations and strings never pass for metrics. Each name must be a
sample name one of the services exposes: the registry's families after importing every
service module, with each family's exposition names derived from its type (a counter is
served as ``_total``, a histogram as ``_bucket``/``_count``/``_sum``), so a labelled metric
no code has touched yet still counts. ``up`` is Prometheus's own.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest

from kernel.adapters.metrics import REGISTRY
from tests.chart.test_chart import CHART, FULL, _objects, _render

DASHBOARD = CHART / "dashboards" / "toolfleet.json"

SERVICE_MODULES = (
    "planner.service",
    "executors.worker",
    "aggregator.service",
    "reconciler.service",
    "kernel.adapters.bus",
    "kernel.adapters.lag",
    "kernel.stores.admitting",
    "kernel.stores.circuit",
    "toolfleet.app.service",
)
"""Every module that runs in a service process: importing them registers every metric."""

PROMETHEUS_OWN = {"up"}
"""Series Prometheus writes itself for each scrape target; no service registers them."""

GRAFANA_DURATIONS = ("$__rate_interval", "$__interval", "$__range")
"""Grafana's built-in range variables, replaced by a duration before parsing."""

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
}


def served_metrics() -> set[str]:
    """Every sample name the services' registry can expose."""
    for module in SERVICE_MODULES:
        importlib.import_module(module)
    names: set[str] = set()
    for family in REGISTRY.collect():
        names |= {sample.name for sample in family.samples}
        names |= {family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",))}
    return names


def metrics_in(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (raises ValueError if it does not parse)."""
    for variable in GRAFANA_DURATIONS:
        expr = expr.replace(variable, "5m")
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            name = node.name or next(
                (
                    m.value
                    for m in node.matchers.matchers
                    if m.name == "__name__" and m.op == promql_parser.MatchOp.Equal
                ),
                None,
            )
            assert name, f"a selector without one metric name in {expr!r}"
            found.add(name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # a collapsed row holds its panels


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())  # type: ignore[no-any-return]


def dashboard_queries(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable."""
    for panel in _panels(board["panels"]):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        query = query["query"] if isinstance(query, dict) else query
        # Grafana's label_values(selector, label): only the selector is PromQL.
        values = re.fullmatch(r"label_values\((.+),\s*[a-zA-Z_]\w*\)", query.strip())
        yield f"variable {variable['name']!r}", values.group(1) if values else query


def alert_rules(values: tuple[Path, ...] = (FULL,)) -> list[dict[str, Any]]:
    (rule,) = [o for o in _objects(_render(*values)) if o["kind"] == "PrometheusRule"]
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def _unserved(queries: list[tuple[str, str]]) -> list[str]:
    served = served_metrics() | PROMETHEUS_OWN
    return [
        f"{where} uses {name}, which no service serves: {expr}"
        for where, expr in queries
        for name in sorted(metrics_in(expr) - served)
    ]


def test_the_metric_extraction_reads_the_syntax_tree() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, tool) (rate(a_seconds_bucket{tool=~"$tool", '
        'le!="+Inf"}[$__rate_interval]))) / on (job, instance) group_left (service) b_info '
        'or vector(0) and deriv(max(c_total offset 1h)[30m:1m]) > 0 unless {__name__="d"}'
    )
    assert metrics_in(expr) == {"a_seconds_bucket", "b_info", "c_total", "d"}
    assert metrics_in("sum without (pool) (rate(x_total[5m])) > bool 1") == {"x_total"}
    with pytest.raises(ValueError):
        metrics_in("sum by (le (rate(x[5m]))")  # what Prometheus would refuse, refused here
    with pytest.raises(ValueError):
        metrics_in("histogram_quantil(0.9, x)")  # an unknown function


def test_the_check_reports_a_metric_nobody_serves() -> None:
    problems = _unserved([("here", "sum(rate(toolfleet_no_such_thing_total[5m]))")])
    assert problems == [
        "here uses toolfleet_no_such_thing_total, which no service serves: "
        "sum(rate(toolfleet_no_such_thing_total[5m]))"
    ]
    # Served names follow the exposition: counters as _total, histograms by their parts.
    served = served_metrics()
    assert "toolfleet_outcomes_total" in served and "toolfleet_outcomes" not in served
    assert {
        "toolfleet_call_duration_seconds_bucket",
        "toolfleet_call_duration_seconds_count",
    } < served
    assert "toolfleet_call_duration_seconds" not in served


def test_every_dashboard_query_uses_metrics_the_services_serve() -> None:
    queries = list(dashboard_queries(dashboard()))
    assert len(queries) > 40
    assert _unserved(queries) == []


def test_every_alert_uses_metrics_the_services_serve() -> None:
    rules = alert_rules()
    assert _unserved([(f"alert {r['alert']}", r["expr"]) for r in rules]) == []
    used = set().union(*(metrics_in(r["expr"]) for r in rules))
    assert "kafka_consumergroup_lag" not in used  # the services measure their own lag
    assert {
        "up", "toolfleet_consumer_lag", "toolfleet_dead_letters_total", "toolfleet_circuit_open",
        "toolfleet_unknown_effects_unresolved", "toolfleet_unknown_effects_oldest_age_seconds",
        "toolfleet_human_tasks_open", "toolfleet_outcomes_total",
    } <= used  # fmt: skip


def test_every_alert_says_what_it_means_and_what_to_do() -> None:
    for rule in alert_rules():
        assert rule["alert"].startswith("Toolfleet"), rule
        assert rule["labels"]["severity"] in {"page", "ticket"}, rule["alert"]
        annotations = rule["annotations"]
        assert annotations["summary"], rule["alert"]
        assert "Next:" in annotations["description"], rule["alert"]


def test_the_alerts_look_at_this_release_only_unless_told_otherwise() -> None:
    for rule in alert_rules():
        assert 'job="fleet-toolfleet-metrics", namespace="agents"' in rule["expr"], rule["alert"]
    rules = _objects(_render(FULL, sets=('prometheusRule.selector=cluster="eu-1"',)))
    (rule,) = [o for o in rules if o["kind"] == "PrometheusRule"]
    for group in rule["spec"]["groups"]:
        for alert in group["rules"]:
            assert 'cluster="eu-1"' in alert["expr"] and "job=" not in alert["expr"]


def test_the_chart_ships_the_dashboard_for_grafanas_sidecar() -> None:
    def dashboards(rendered: str) -> list[dict[str, Any]]:
        return [
            o
            for o in _objects(rendered)
            if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboards")
        ]

    assert not dashboards(_render())  # off by default
    (config,) = dashboards(_render(FULL))
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config["metadata"]["annotations"] == {"grafana_folder": "toolfleet"}
    assert json.loads(config["data"]["toolfleet.json"]) == dashboard()
    label = ("grafana.dashboards.label=dashboards", "grafana.dashboards.labelValue=toolfleet")
    relabelled = _render(FULL, sets=label)
    (config,) = dashboards(relabelled)
    assert config["metadata"]["labels"]["dashboards"] == "toolfleet"


def test_the_dashboard_is_portable_and_covers_every_hop() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert {"namespace", "pool", "tenant"} <= set(variables)
    panels = [p for p in _panels(board["panels"]) if p["type"] != "row"]
    assert len({p["id"] for p in _panels(board["panels"])}) == len(list(_panels(board["panels"])))
    for panel in panels:
        # No data source is hard-wired: the importing Grafana picks its own Prometheus.
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
        assert panel["targets"], panel["title"]
    titles = {p["title"] for p in panels}
    assert {
        "Messages consumed", "Commands", "Outcomes by status", "Outcomes by effect", "Plan",
        "Admission wait", "Call", "Turn", "Unknown effects", "Circuits open",
        "Consumer lag per group", "Waiting for admission per tenant",
        "Admitted (running) per tenant", "Human tasks open", "Dead letters", "CPU",
        "Resident memory",
    } <= titles  # fmt: skip
