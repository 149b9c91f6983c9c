"""``helm install`` and ``helm upgrade`` of the chart against a real Kubernetes API server
(kube-apiserver with etcd, started here; see ``_kube.py``), as a platform team runs them.

What it proves that rendering cannot: the pre-install/pre-upgrade hooks run before the
release's ordinary resources exist, so every object a hook Job uses must already be there
when its pod is created. The test plays the Job controller and the kubelet for the hook
Jobs (no nodes run here): the API server's own ServiceAccount admission refuses a pod whose
ServiceAccount is missing, and the kubelet's part refuses one whose Secrets or ConfigMaps are
missing. The custom resources (KEDA's ScaledObject and TriggerAuthentication, the Prometheus
Operator's ServiceMonitor and PrometheusRule) are created against their published CRDs, so the
API server validates them with the CRDs' own schemas and warns of any field they lack.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart._kube import CRDS, ApiServer, HookJobRunner, api_server
from tests.chart.test_chart import CHART, FULL, _tool

PATHS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "Secret": "/api/v1/namespaces/{ns}/secrets",
    "Service": "/api/v1/namespaces/{ns}/services",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "Job": "/apis/batch/v1/namespaces/{ns}/jobs",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
    "Ingress": "/apis/networking.k8s.io/v1/namespaces/{ns}/ingresses",
    "ScaledObject": "/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledobjects",
    "TriggerAuthentication": "/apis/keda.sh/v1alpha1/namespaces/{ns}/triggerauthentications",
    "ServiceMonitor": "/apis/monitoring.coreos.com/v1/namespaces/{ns}/servicemonitors",
    "PrometheusRule": "/apis/monitoring.coreos.com/v1/namespaces/{ns}/prometheusrules",
}
"""Where each kind the chart renders lives in the API."""

USER_SECRETS = {
    "toolfleet-kafka": {
        "TOOLFLEET_KAFKA_SASL_USERNAME": "fleet",
        "TOOLFLEET_KAFKA_SASL_PASSWORD": "pw",
    },
    "toolfleet-kafka-ca": {"ca.crt": "CA"},
    "toolfleet-redis": {"REDIS_URL": "rediss://fleet:pw@redis.redis:6379/0"},
    "toolfleet-redis-tls": {"ca.crt": "CA", "tls.crt": "CERT", "tls.key": "KEY"},
    "toolfleet-decision-keys": {"TOOLFLEET_DECISION_KEYS": "{}"},
    "toolfleet-console-oidc": {"client-secret": "s"},
    "toolfleet-console-session": {"session-secret": "s" * 32},
    "toolfleet-console-tokens": {"tokens.json": "[]"},
    "toolfleet-mcp-tokens": {"tokens.json": "[]"},
}
"""The Secrets ci/full-values.yaml names, created before the install as the chart's README
asks (the chart reads them; it never creates them)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """A fresh API server with the CRDs of the custom resources the chart renders."""
    with api_server(tmp_path_factory.mktemp("kube")) as api:
        crds = sorted(CRDS.glob("*.yaml"))
        if len(crds) < 4:
            pytest.fail(f"the CRDs are not in {CRDS}: run `make chart-tools`")
        api.install_crds(crds)
        yield api


def _namespace(api: ApiServer, name: str, secrets: dict[str, dict[str, str]]) -> None:
    answer = api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    assert answer.is_success, answer.text
    for secret, data in secrets.items():
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        answer = api.create(
            f"/api/v1/namespaces/{name}/secrets", {"metadata": {"name": secret}, "data": encoded}
        )
        assert answer.is_success, answer.text
    pull = {"auths": {"registry.example.com": {"auth": base64.b64encode(b"u:p").decode()}}}
    answer = api.create(
        f"/api/v1/namespaces/{name}/secrets",
        {
            "metadata": {"name": "registry"},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(json.dumps(pull).encode()).decode()},
        },
    )
    assert answer.is_success, answer.text


def _helm_with_hooks(
    api: ApiServer, namespace: str, *args: str
) -> tuple[subprocess.CompletedProcess[str], HookJobRunner]:
    """Runs helm while a HookJobRunner plays the Job controller and kubelet for its hooks."""
    with HookJobRunner(api, namespace) as runner:
        done = subprocess.run(
            [_tool("helm"), *args, "--namespace", namespace, "--kubeconfig", str(api.kubeconfig),
             "--timeout", "90s"],
            capture_output=True, text=True, check=False, timeout=180,
        )  # fmt: skip
    assert runner.error is None, f"the hook runner failed: {runner.error!r}"
    return done, runner


def _released_objects(manifest: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def _manifest(api: ApiServer, namespace: str) -> str:
    """The manifest of release "fleet" as helm stored it."""
    return subprocess.run(
        [_tool("helm"), "get", "manifest", "fleet", "--namespace", namespace,
         "--kubeconfig", str(api.kubeconfig)],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip


def _install_and_upgrade(api: ApiServer, namespace: str, values: tuple[Path, ...]) -> str:
    """Installs then upgrades release "fleet"; returns what the install printed."""
    files = [a for v in values for a in ("-f", str(v))]
    printed = ""
    for verb in ("install", "upgrade"):
        done, runner = _helm_with_hooks(api, namespace, verb, "fleet", str(CHART), *files)
        ran = [(run.job, run.pod_answer, run.missing) for run in runner.runs]
        # pre-<verb>: the topics Job, then migrate; post-<verb>: migrate --finish.
        assert ran == [
            (f"fleet-toolfleet-{job}", "created", [])
            for job in ("topics", "migrate", "migrate-finish")
        ], f"{verb}: a hook Job's pod could not run when its hook ran: {ran}\n" + done.stderr
        assert done.returncode == 0, f"helm {verb}: {done.stdout}{done.stderr}"
        printed = printed or done.stdout
        # The API server warns of a field a CRD's (or a built-in kind's) schema lacks.
        assert "unknown field" not in done.stderr, done.stderr
        # The hooks cleaned up after themselves (hook-succeeded): the Job and its account.
        ns = namespace
        for job in ("topics", "migrate", "migrate-finish"):
            assert api.get(f"/apis/batch/v1/namespaces/{ns}/jobs/fleet-toolfleet-{job}") is None
        assert api.get(f"/api/v1/namespaces/{ns}/serviceaccounts/fleet-toolfleet-topics") is None
    objects = _released_objects(_manifest(api, namespace))
    assert objects
    for obj in objects:
        kind, name = obj["kind"], obj["metadata"]["name"]
        assert kind in PATHS, f"the test does not know where {kind} lives"
        stored = api.get(PATHS[kind].format(ns=namespace) + f"/{name}")
        assert stored is not None, f"{kind} {name} of the release is not in the cluster"
        assert stored["metadata"]["annotations"]["meta.helm.sh/release-name"] == "fleet"
    return printed


def test_install_and_upgrade_with_every_optional_part(cluster: ApiServer) -> None:
    _namespace(cluster, "agents", USER_SECRETS)
    notes = _install_and_upgrade(cluster, "agents", (FULL,))
    assert "Sign-in: OpenID Connect (https://login.example.com/realms/platform) API tokens." in (
        notes
    )
    kinds = {o["kind"] for o in _released_objects(_manifest(cluster, "agents"))}
    # Accepted by the API server against their CRDs' schemas.
    assert {"ScaledObject", "TriggerAuthentication", "ServiceMonitor", "PrometheusRule"} <= kinds
    scaled = cluster.get(
        "/apis/keda.sh/v1alpha1/namespaces/agents/scaledobjects/fleet-toolfleet-worker-default"
    )
    assert scaled is not None
    assert scaled["spec"]["triggers"][0]["authenticationRef"]["name"] == "fleet-toolfleet-kafka"


def test_install_and_upgrade_with_the_default_values(cluster: ApiServer) -> None:
    _namespace(cluster, "defaults", {})
    _install_and_upgrade(cluster, "defaults", ())


def test_a_hook_whose_secret_the_release_creates_later_fails_the_install(
    cluster: ApiServer, tmp_path: Path
) -> None:
    """The runner's kubelet part is no formality: a Secret the Job reads that is an ordinary
    object of the release (extraObjects) is not there when the pre-install hook runs."""
    _namespace(cluster, "late", {})
    values = tmp_path / "late.yaml"
    values.write_text(yaml.safe_dump({
        "envFrom": [{"secretRef": {"name": "made-by-the-release"}}],
        "extraObjects": [{"apiVersion": "v1", "kind": "Secret",
                          "metadata": {"name": "made-by-the-release"}, "stringData": {"K": "v"}}],
    }))  # fmt: skip
    install = ("install", "fleet", str(CHART), "-f", str(values))
    done, runner = _helm_with_hooks(cluster, "late", *install)
    assert [(r.job, r.missing) for r in runner.runs] == [
        ("fleet-toolfleet-topics", ["Secret made-by-the-release"])
    ]
    assert done.returncode != 0
    assert "failed pre-install" in done.stderr, done.stderr
