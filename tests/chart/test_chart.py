"""The Helm chart, checked as CI and a platform team would: ``helm lint --strict``,
``helm template`` with the default values and with every optional part switched on
(helm/toolfleet/ci/full-values.yaml), ``kubeconform -strict`` on the output against the
Kubernetes JSON schemas of the ``kubernetes-validate`` package (offline) and, for the custom
resources, against KEDA's and the Prometheus Operator's CRDs, the values schema refusing what
the API server would refuse, and what every Deployment must carry. The alerts and the Grafana
dashboard are checked in ``test_dashboards.py``, the hooks' dependencies in ``test_hooks.py``,
the values' effects in ``test_values.py``, and a real install in ``test_install.py``.

helm, kubeconform, kube-apiserver and the CRDs come from ``make chart-tools``, which
``make test`` runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kernel.settings import Settings
from tests.chart._crd_schemas import CUSTOM_KINDS, write_crd_schemas

CHART = Path(__file__).resolve().parents[2] / "helm" / "toolfleet"
FULL = CHART / "ci" / "full-values.yaml"
BAD_POOL = CHART / "ci" / "bad-pool-values.yaml"
KUBERNETES = "1.31.0"
"""The Kubernetes version the manifests are validated against (the chart's kubeVersion is
>=1.27)."""


def _tool(name: str) -> str:
    gopath = subprocess.run(["go", "env", "GOPATH"], capture_output=True, text=True, check=False)
    candidates = [shutil.which(name), Path(gopath.stdout.strip() or "~/go") / "bin" / name]
    for found in candidates:
        if found and Path(found).expanduser().is_file():
            return str(Path(found).expanduser())
    pytest.fail(f"{name} is not installed: run `make chart-tools` (go install)")


def _helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_tool("helm"), *args], capture_output=True, text=True, check=check, timeout=120
    )


def _render(*values: Path, sets: tuple[str, ...] = ()) -> str:
    args = ["template", "fleet", str(CHART), "--namespace", "agents", "--kube-version", KUBERNETES]
    for path in values:
        args += ["-f", str(path)]
    for item in sets:
        args += ["--set", item]
    return _helm(*args).stdout


def _objects(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _deployments(text: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in _objects(text) if o["kind"] == "Deployment"}


@pytest.mark.parametrize("values", [(), (FULL,)], ids=["defaults", "full"])
def test_helm_lint_strict_passes(values: tuple[Path, ...]) -> None:
    args = ["lint", "--strict", str(CHART)] + [a for v in values for a in ("-f", str(v))]
    done = _helm(*args, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def _standalone_schemas(objects: list[dict[str, Any]], into: Path) -> Path:
    """kubeconform-readable schemas of the rendered kinds, from kubernetes-validate's.

    The package's schemas point into one shared ``/api/_definitions.json`` (its own resolver's
    layout); kubeconform reads one self-contained file per kind, so each gets the definitions
    inlined and its references made local.
    """
    source = (
        Path(kubernetes_validate.__file__).parent
        / "kubernetes-json-schema"
        / f"v{KUBERNETES}-local-strict"
    )
    definitions = (source / "_definitions.json").read_text().replace("/api/_definitions.json#", "#")
    shared = json.loads(definitions)["$defs"]
    into.mkdir(parents=True, exist_ok=True)
    for obj in objects:
        group, _, version = obj["apiVersion"].rpartition("/")
        suffix = f"-{group.split('.')[0]}-{version}" if group else f"-{version}"
        name = f"{obj['kind'].lower()}{suffix}.json"
        if (into / name).exists() or not (source / name).exists():
            continue
        schema = json.loads((source / name).read_text().replace("/api/_definitions.json#", "#"))
        schema["$defs"] = shared
        (into / name).write_text(json.dumps(schema))
    return into


def _kubeconform(rendered: str, into: Path) -> subprocess.CompletedProcess[str]:
    """kubeconform -strict over ``rendered``: the built-in kinds against kubernetes-validate's
    schemas, the custom resources against their CRDs' (tests/chart/_crd_schemas.py)."""
    schemas = _standalone_schemas(_objects(rendered), into)
    kinds = write_crd_schemas(into)
    missing = set(CUSTOM_KINDS) - set(kinds)
    if missing:
        pytest.fail(f"the CRDs of {sorted(missing)} are not installed: run `make chart-tools`")
    location = f"{schemas}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json"
    return subprocess.run(
        [_tool("kubeconform"), "-strict", "-verbose", "-summary", "-output", "json",
         "-kubernetes-version", KUBERNETES, "-schema-location", location, "-"],
        input=rendered, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


def _validated(done: subprocess.CompletedProcess[str]) -> dict[str, list[str]]:
    """kubeconform's verdict per status (valid, invalid, error, skipped): 'Kind name' lists."""
    verdicts: dict[str, list[str]] = {}
    for resource in json.loads(done.stdout)["resources"]:
        verdicts.setdefault(resource["status"].removeprefix("status"), []).append(
            f"{resource['kind']} {resource['name']}: {resource.get('msg', '')}".rstrip(": ")
        )
    return verdicts


@pytest.mark.parametrize("values", [(), (FULL,)], ids=["defaults", "full"])
def test_kubeconform_strict_accepts_every_rendered_object(
    values: tuple[Path, ...], tmp_path: Path
) -> None:
    rendered = _render(*values)
    done = _kubeconform(rendered, tmp_path / "schemas")
    verdicts = _validated(done)
    assert done.returncode == 0 and set(verdicts) == {"Valid"}, verdicts
    if values:  # every custom resource was checked against its CRD, none skipped
        checked = {entry.split()[0] for entry in verdicts["Valid"]}
        assert set(CUSTOM_KINDS) <= checked


def test_the_crd_schemas_refuse_a_misplaced_field(tmp_path: Path) -> None:
    """The CRD schemas have teeth: the ScaledObject with authenticationRef under the trigger's
    metadata (where KEDA would ignore it) and a PrometheusRule with a misspelt field fail."""
    objects = _objects(_render(FULL))
    (scaled,) = [o for o in objects if o["kind"] == "ScaledObject"]
    trigger = scaled["spec"]["triggers"][0]
    trigger["metadata"]["authenticationRef"] = trigger.pop("authenticationRef")
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    rule["spec"]["groups"][0]["rules"][0]["for_"] = rule["spec"]["groups"][0]["rules"][0].pop("for")
    rendered = yaml.safe_dump_all([scaled, rule])
    verdicts = _validated(_kubeconform(rendered, tmp_path / "schemas"))
    assert sorted(e.split(":")[0] for e in verdicts.get("Invalid", [])) == [
        "PrometheusRule fleet-toolfleet",
        "ScaledObject fleet-toolfleet-worker-default",
    ], verdicts


@pytest.mark.parametrize(
    "how", [("-f", str(BAD_POOL)), ("--set", "workers[0].pool=Payments_EU")], ids=["file", "set"]
)
def test_the_values_schema_rejects_a_pool_name_a_deployment_cannot_carry(
    how: tuple[str, str],
) -> None:
    done = _helm("template", "fleet", str(CHART), "--kube-version", KUBERNETES, *how, check=False)
    assert done.returncode != 0
    assert "values don't meet the specifications of the schema" in done.stderr
    assert "pool" in done.stderr


def test_every_deployment_is_ready_for_production() -> None:
    rendered = _render(FULL)
    deployments = _deployments(rendered)
    console = deployments.pop("fleet-toolfleet-console")
    door = deployments.pop("fleet-toolfleet-mcp")
    assert set(deployments) == {
        "fleet-toolfleet-planner", "fleet-toolfleet-aggregator", "fleet-toolfleet-reconciler",
        "fleet-toolfleet-worker-default", "fleet-toolfleet-worker-payments-eu",
    }  # fmt: skip
    (container,) = console["spec"]["template"]["spec"]["containers"]
    assert container["args"] == [
        "console", "--host", "0.0.0.0", "--port", "8080", "--tenant", "acme",
    ]  # fmt: skip
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TOOLFLEET_TRACE_URL_TEMPLATE"].endswith("traceId={trace_id}")
    assert "fleet-toolfleet-console" not in _deployments(_render())  # off by default
    assert door["spec"]["replicas"] == 3
    pod = door["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["topologySpreadConstraints"]
    (container,) = pod["containers"]
    assert container["args"] == ["mcp", "--host", "0.0.0.0", "--port", "8090"]
    assert container["ports"] == [{"name": "http", "containerPort": 8090}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}, probe
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"secretRef": {"name": "toolfleet-kafka"}} in container["envFrom"]
    assert "fleet-toolfleet-mcp" not in _deployments(_render())  # off by default
    for name, deployment in deployments.items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "fleet", name
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["serviceAccountName"] == "fleet-toolfleet", name
        assert pod["topologySpreadConstraints"], name
        (container,) = pod["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, name
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, name
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", name
        assert container["livenessProbe"]["httpGet"]["path"] == "/livez", name
        assert container["resources"]["requests"], name
        assert {"secretRef": {"name": "toolfleet-kafka"}} in container["envFrom"], name
    kinds = [o["kind"] for o in _objects(rendered)]
    assert kinds.count("PodDisruptionBudget") == 5  # every component with more than one pod
    assert {"ServiceAccount", "Service", "ServiceMonitor", "PrometheusRule", "Job"} <= set(kinds)
    assert "ConfigMap" in kinds  # the Grafana dashboard (tests/chart/test_dashboards.py)


def test_worker_flags_autoscaling_and_topics_come_from_values() -> None:
    rendered = _render(FULL)
    payments = _deployments(rendered)["fleet-toolfleet-worker-payments-eu"]
    (container,) = payments["spec"]["template"]["spec"]["containers"]
    assert container["args"] == [
        "worker", "--tools", "acme.payments:tools", "--pool", "payments-eu",
        "--concurrency", "20", "--lease-s", "60",
    ]  # fmt: skip
    default = _deployments(rendered)["fleet-toolfleet-worker-default"]
    assert "replicas" not in default["spec"]  # KEDA owns the replica count
    assert default["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "registry.example.com/acme/toolfleet-tools:2026.12.1"
    )
    (scaled,) = [o for o in _objects(rendered) if o["kind"] == "ScaledObject"]
    trigger = scaled["spec"]["triggers"][0]["metadata"]
    assert scaled["spec"]["maxReplicaCount"] == 24  # the topic's partitions
    assert trigger["consumerGroup"] == "toolfleet.workers.default"
    assert trigger["topic"] == "toolfleet.commands.default"
    (job,) = [
        o
        for o in _objects(rendered)
        if o["kind"] == "Job" and o["metadata"]["name"] == "fleet-toolfleet-topics"
    ]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == ["topics", "apply", "--pool", "default", "--pool", "payments-eu"]


def test_every_setting_the_chart_sets_exists() -> None:
    names = set()
    for deployment in _deployments(_render(FULL)).values():
        for env in deployment["spec"]["template"]["spec"]["containers"][0]["env"]:
            names.add(env["name"])
    known = {f"TOOLFLEET_{field.upper()}" for field in Settings.model_fields}
    known |= {"KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL", "HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"}
    # OpenTelemetry's own variables, read by its SDK and OTLP exporter.
    known |= {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"}
    assert names - known == set()


def test_tracing_and_the_log_level_come_from_values() -> None:
    (planner,) = [d for name, d in _deployments(_render(FULL)).items() if name.endswith("planner")]
    env = {
        e["name"]: e.get("value")
        for e in planner["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["TOOLFLEET_TRACES"] == "otlp"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4318"
    assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
    assert env["TOOLFLEET_LOG_LEVEL"] == "WARNING"
    defaults = _deployments(_render())["fleet-toolfleet-planner"]
    default_env = {e["name"] for e in defaults["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in default_env  # tracing is off by default
    done = _helm(
        "template", "fleet", str(CHART), "--kube-version", KUBERNETES,
        "--set", "tracing.exporter=otlp", check=False,
    )  # fmt: skip
    assert done.returncode != 0 and "tracing.otlpEndpoint is required" in done.stderr


def test_the_chart_version_and_app_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pyproject = (CHART.parents[1] / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE)
    assert version is not None and chart["appVersion"] == version.group(1)
    assert os.access(CHART.parents[1] / "docker" / "steps.sh", os.X_OK)
