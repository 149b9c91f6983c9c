"""What the chart's values turn into: the defaults give a running fleet, the console's
access (console.auth) and the MCP door's (mcp.auth) are wired from Secrets and required,
KEDA authenticates to a secured Kafka with the services' Secrets, the NetworkPolicies,
extraObjects, and a plain
``helm template`` (no ``--kube-version``) with the helm ``make chart-tools`` builds.
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from executors import ToolRegistry
from kernel.settings import Settings
from tests.chart.test_chart import CHART, FULL, KUBERNETES, _deployments, _helm, _objects, _render

CONSOLE_ON = ("console.enabled=true",)
MCP_TOKENS = ("mcp.enabled=true", "mcp.auth.tokens.existingSecret=agents")


def _fails(*args: str) -> str:
    done = _helm("template", "fleet", str(CHART), "--kube-version", KUBERNETES, *args, check=False)
    assert done.returncode != 0, "rendered, though it should have been refused"
    return done.stderr


def _kind(rendered: str, kind: str) -> list[dict[str, Any]]:
    return [o for o in _objects(rendered) if o["kind"] == kind]


def _console_env(rendered: str) -> dict[str, dict[str, Any]]:
    console = _deployments(rendered)["fleet-toolfleet-console"]
    return {e["name"]: e for e in console["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_a_plain_helm_template_renders_without_a_kube_version() -> None:
    done = _helm("template", "fleet", str(CHART), check=False)
    assert done.returncode == 0, done.stderr
    assert _deployments(done.stdout)


def test_the_default_pool_runs_the_demo_tools_the_image_carries() -> None:
    (worker,) = [d for n, d in _deployments(_render()).items() if "worker" in n]
    args = worker["spec"]["template"]["spec"]["containers"][0]["args"]
    tools = args[args.index("--tools") + 1]
    assert tools == "toolfleet.app.demo:tools"
    module, attribute = tools.split(":")
    assert isinstance(getattr(importlib.import_module(module), attribute), ToolRegistry)


def test_an_enabled_console_without_a_way_in_is_refused_naming_console_auth() -> None:
    stderr = _fails("--set", "console.enabled=true")
    assert "values don't meet the specifications of the schema" in stderr
    assert "/console/auth" in stderr
    # The same refusal when the schema is skipped, in words.
    stderr = _fails("--set", "console.enabled=true", "--skip-schema-validation")
    assert "console.auth: the console is enabled with no way to sign in" in stderr


def test_openid_connect_needs_a_client_id_and_a_session_secret() -> None:
    oidc = ("--set", "console.enabled=true", "--set", "console.auth.oidc.issuer=https://idp")
    assert "/console/auth" in _fails(*oidc)
    stderr = _fails(*oidc, "--set", "console.auth.oidc.clientId=c", "--skip-schema-validation")
    assert "console.auth.sessionSecret.existingSecret" in stderr


def _door_env(rendered: str) -> dict[str, dict[str, Any]]:
    door = _deployments(rendered)["fleet-toolfleet-mcp"]
    return {e["name"]: e for e in door["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_an_enabled_mcp_door_without_a_way_in_is_refused_naming_mcp_auth() -> None:
    assert "/mcp/auth" in _fails("--set", "mcp.enabled=true")
    stderr = _fails("--set", "mcp.enabled=true", "--skip-schema-validation")
    assert "mcp.auth: the MCP door is enabled with no way to authenticate its callers" in stderr
    oidc = ("--set", "mcp.enabled=true", "--set", "mcp.auth.oidc.issuer=https://idp")
    assert "/mcp/publicUrl" in _fails(*oidc)
    stderr = _fails(*oidc, "--skip-schema-validation")
    assert "mcp.publicUrl: the door accepts access tokens of mcp.auth.oidc.issuer" in stderr


def test_the_mcp_door_reads_its_tokens_from_a_secret_as_the_settings_name_them() -> None:
    env = _door_env(_render(FULL))
    assert env["TOOLFLEET_MCP_TOKENS"] == {
        "name": "TOOLFLEET_MCP_TOKENS",
        "valueFrom": {"secretKeyRef": {"name": "toolfleet-mcp-tokens", "key": "tokens.json"}},
    }  # never inlined
    assert env["TOOLFLEET_MCP_PUBLIC_URL"]["value"] == "https://mcp.example.com/mcp"
    assert env["TOOLFLEET_CONSOLE_OIDC_ISSUER"]["value"] == (
        "https://login.example.com/realms/platform"
    )
    assert env["TOOLFLEET_CONSOLE_OIDC_ROLES_CLAIM"]["value"] == "toolfleet_roles"
    tokens_only = _door_env(_render(sets=MCP_TOKENS))
    assert "TOOLFLEET_CONSOLE_OIDC_ISSUER" not in tokens_only
    assert "TOOLFLEET_MCP_PUBLIC_URL" not in tokens_only
    known = {f"TOOLFLEET_{name.upper()}" for name in Settings.model_fields}
    assert {n for n in (*env, *tokens_only) if n.startswith("TOOLFLEET_")} - known == set()


@pytest.mark.parametrize("sets", [MCP_TOKENS, ()], ids=["tokens", "full"])
def test_the_door_starts_on_the_environment_the_chart_gives_it(
    sets: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The door's own start-up checks (``create_app``) accept what the chart renders: its
    Secret-held tokens, the issuer and the public URL it needs with them."""
    from toolfleet.app.mcp import create_app

    rendered = _render(*(() if sets else (FULL,)), sets=sets)
    tokens = '[{"name": "a", "sha256": "' + "0" * 64 + '", "role": "operator", "tenants": ["t"]}]'
    for name in [n for n in os.environ if n.startswith("TOOLFLEET_")]:
        monkeypatch.delenv(name)
    for name, entry in _door_env(rendered).items():
        monkeypatch.setenv(name, entry.get("value", tokens))
    settings = Settings()
    assert settings.mcp_tokens is not None
    assert create_app(settings) is not None


def test_the_console_reads_its_secrets_from_secrets_as_the_settings_name_them() -> None:
    env = _console_env(_render(FULL))
    assert env["TOOLFLEET_CONSOLE_OIDC_ISSUER"]["value"] == (
        "https://login.example.com/realms/platform"
    )
    assert env["TOOLFLEET_CONSOLE_PUBLIC_URL"]["value"] == "https://console.example.com"
    assert env["TOOLFLEET_CONSOLE_OIDC_CLIENT_SECRET"]["valueFrom"] == {
        "secretKeyRef": {"name": "toolfleet-console-oidc", "key": "client-secret"}
    }
    assert env["TOOLFLEET_CONSOLE_SESSION_SECRET"]["valueFrom"]["secretKeyRef"]["name"] == (
        "toolfleet-console-session"
    )
    assert "value" not in env["TOOLFLEET_CONSOLE_TOKENS"]  # never inlined
    proxy = _console_env(
        _render(
            sets=(
                *CONSOLE_ON,
                "console.auth.proxy.secret.existingSecret=proxy",
                "console.auth.proxy.rolesHeader=X-Roles",
            )
        )
    )
    assert proxy["TOOLFLEET_CONSOLE_PROXY_SECRET"]["valueFrom"] == {
        "secretKeyRef": {"name": "proxy", "key": "proxy-secret"}
    }
    assert proxy["TOOLFLEET_CONSOLE_PROXY_ROLES_HEADER"]["value"] == "X-Roles"
    assert "TOOLFLEET_CONSOLE_OIDC_ISSUER" not in proxy
    known = {f"TOOLFLEET_{name.upper()}" for name in Settings.model_fields}
    consoles = {n for n in (*env, *proxy) if n.startswith("TOOLFLEET_CONSOLE_")}
    assert consoles - known == set()


def test_keda_authenticates_with_the_services_kafka_secrets() -> None:
    rendered = _render(FULL)  # SASL_SSL, SCRAM-SHA-512, a CA
    (auth,) = _kind(rendered, "TriggerAuthentication")
    assert auth["spec"]["secretTargetRef"] == [
        {
            "parameter": "username",
            "name": "toolfleet-kafka",
            "key": "TOOLFLEET_KAFKA_SASL_USERNAME",
        },
        {
            "parameter": "password",
            "name": "toolfleet-kafka",
            "key": "TOOLFLEET_KAFKA_SASL_PASSWORD",
        },
        {"parameter": "ca", "name": "toolfleet-kafka-ca", "key": "ca.crt"},
    ]
    (scaled,) = _kind(rendered, "ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["metadata"]["sasl"] == "scram_sha512"
    assert trigger["metadata"]["tls"] == "enable"
    assert trigger["authenticationRef"] == {
        "name": "fleet-toolfleet-kafka",
        "kind": "TriggerAuthentication",
    }


def test_keda_with_a_plaintext_kafka_or_an_authentication_of_ones_own() -> None:
    scale = ("workerDefaults.autoscaling.enabled=true",)
    plain = _render(sets=scale)
    (trigger,) = _kind(plain, "ScaledObject")[0]["spec"]["triggers"]
    assert "authenticationRef" not in trigger and "sasl" not in trigger["metadata"]
    assert not _kind(plain, "TriggerAuthentication")
    own = _render(
        FULL,
        sets=(
            "workers[0].autoscaling.authenticationRef.name=msk-iam",
            "workers[0].autoscaling.authenticationRef.kind=ClusterTriggerAuthentication",
        ),
    )
    (trigger,) = _kind(own, "ScaledObject")[0]["spec"]["triggers"]
    assert trigger["authenticationRef"] == {
        "name": "msk-iam",
        "kind": "ClusterTriggerAuthentication",
    }
    assert not _kind(own, "TriggerAuthentication")  # nothing else uses the chart's
    mtls = _render(
        sets=(
            *scale,
            "kafka.securityProtocol=SSL",
            "kafka.tls.secret=kafka-tls",
            "kafka.tls.certKey=tls.crt",
            "kafka.tls.keyKey=tls.key",
        )
    )
    (auth,) = _kind(mtls, "TriggerAuthentication")
    assert [(r["parameter"], r["key"]) for r in auth["spec"]["secretTargetRef"]] == [
        ("ca", "ca.crt"),
        ("cert", "tls.crt"),
        ("key", "tls.key"),
    ]


def test_keda_cannot_guess_sasl_credentials_it_was_not_given() -> None:
    scale = (
        "--set",
        "workerDefaults.autoscaling.enabled=true",
        "--set",
        "kafka.securityProtocol=SASL_SSL",
    )
    assert "kafka.credentialsSecret: KEDA needs the SASL credentials" in _fails(*scale)
    oauth = _fails(*scale, "--set", "kafka.saslMechanism=OAUTHBEARER")
    assert "workers[default].autoscaling.authenticationRef" in oauth


def test_the_network_policies_admit_only_what_the_values_name() -> None:
    policies = {p["metadata"]["name"]: p["spec"] for p in _kind(_render(FULL), "NetworkPolicy")}
    assert set(policies) == {
        "fleet-toolfleet-egress",
        "fleet-toolfleet-ingress",
        "fleet-toolfleet-console",
        "fleet-toolfleet-mcp",
        "fleet-toolfleet-worker-payments-eu-egress",
    }
    egress = policies["fleet-toolfleet-egress"]
    assert egress["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "toolfleet",
        "app.kubernetes.io/instance": "fleet",
    }
    ports = [[p["port"] for p in rule["ports"]] for rule in egress["egress"]]
    assert ports == [[53, 53], [9096], [6379], [4318]]  # DNS, Kafka, Redis, OTLP
    assert egress["egress"][1]["to"] == [{"ipBlock": {"cidr": "10.20.0.0/16"}}]
    console = policies["fleet-toolfleet-console"]
    (rule,) = console["ingress"]
    assert rule["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "ingress-nginx"
    }
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert console["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "console"
    door = policies["fleet-toolfleet-mcp"]
    (rule,) = door["ingress"]
    agents = {"namespaceSelector": {"matchLabels": {"toolfleet.dev/agents": "true"}}}
    assert rule["from"] == [agents]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert door["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "mcp"
    (kept_out,) = policies["fleet-toolfleet-ingress"]["podSelector"]["matchExpressions"]
    assert kept_out["values"] == ["console", "mcp"]  # each takes its own callers
    pool = policies["fleet-toolfleet-worker-payments-eu-egress"]
    assert pool["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == (
        "worker-payments-eu"
    )
    untraced = {
        p["metadata"]["name"]: p["spec"]
        for p in _kind(_render(sets=("networkPolicy.enabled=true",)), "NetworkPolicy")
    }
    assert set(untraced) == {"fleet-toolfleet-egress", "fleet-toolfleet-ingress"}
    assert len(untraced["fleet-toolfleet-egress"]["egress"]) == 3  # no OTLP without tracing
    assert untraced["fleet-toolfleet-ingress"]["ingress"] == []  # nothing may connect
    assert not _kind(_render(), "NetworkPolicy")  # off by default


def test_a_network_policy_that_would_lock_out_the_console_or_prometheus_is_refused() -> None:
    on = ("--set", "networkPolicy.enabled=true")
    console = ("--set", "console.enabled=true", "--set", "console.auth.tokens.existingSecret=t")
    assert "networkPolicy.console.from: name who may reach the console" in _fails(*on, *console)
    door = ("--set", "mcp.enabled=true", "--set", "mcp.auth.tokens.existingSecret=t")
    assert "networkPolicy.mcp.from: name who may reach the MCP door" in _fails(*on, *door)
    monitor = ("--set", "metrics.serviceMonitor.enabled=true")
    assert "networkPolicy.metrics.from: metrics.serviceMonitor is enabled" in _fails(*on, *monitor)


def test_extra_objects_are_rendered_with_tpl(tmp_path: Path) -> None:
    rendered = _render(FULL)
    (runbook,) = [o for o in _kind(rendered, "ConfigMap") if "runbook" in o["metadata"]["name"]]
    assert runbook["metadata"]["name"] == "fleet-toolfleet-runbook"
    (ingress,) = _kind(rendered, "Ingress")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == "fleet-toolfleet-console"
    values = tmp_path / "v.yaml"
    values.write_text(yaml.safe_dump({"extraObjects": ["apiVersion: v1\nkind: Namespace\n"]}))
    assert _kind(_render(values), "Namespace") == [{"apiVersion": "v1", "kind": "Namespace"}]


def _leaves(node: Any, path: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [leaf for key, value in node.items() for leaf in _leaves(value, f"{path}.{key}")]
    if path == ".workers":
        return [f".workers[].{key}" for key in node[0]]
    return [path]


def test_the_readme_documents_every_value() -> None:
    """Each value of values.yaml is in the README's table, itself or a parent of it (a
    row for `planner.resources` covers `planner.resources.requests.cpu`)."""
    readme = (CHART / "README.md").read_text()
    table = readme[readme.index("## Values") :]
    rows = set(re.findall(r"`([A-Za-z][A-Za-z0-9.\[\]*]*)`", table))
    rows |= {f"{name}.{key}" for name in ("planner", "aggregator", "reconciler")
             for key in ("replicas", "resources", "pdb")}  # fmt: skip
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    undocumented = []
    for leaf in (path.lstrip(".") for path in _leaves(values)):
        parts = leaf.split(".")
        if not any(".".join(parts[:n]) in rows for n in range(1, len(parts) + 1)):
            undocumented.append(leaf)
    assert undocumented == []
