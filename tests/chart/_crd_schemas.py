"""JSON schemas for kubeconform from the CRDs of the custom resources the chart renders
(KEDA's, the Prometheus Operator's; ``scripts/install-kube-test-tools.sh`` puts them in
``~/.cache/toolfleet/kube-test-tools/crds``).

A CRD's ``openAPIV3Schema`` is an OpenAPI schema with Kubernetes extensions; the conversion
does what kubeconform's own ``openapi2jsonschema`` does for CRDs, strictly: an object with
declared properties admits no other field (as the API server prunes and warns of it) unless
it says ``x-kubernetes-preserve-unknown-fields``, ``x-kubernetes-int-or-string`` admits an
integer or a string, and ``nullable`` admits null.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from tests.chart._kube import CRDS

CUSTOM_KINDS = ("ScaledObject", "TriggerAuthentication", "ServiceMonitor", "PrometheusRule")
"""The custom resources the chart renders; each must have a schema here."""


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    schema = {key: _strict(value) for key, value in node.items()}
    if schema.pop("x-kubernetes-int-or-string", False):
        schema.pop("type", None)
        schema.pop("anyOf", None)
        schema["oneOf"] = [{"type": "integer"}, {"type": "string"}]
    preserve = schema.pop("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in schema and "additionalProperties" not in schema and not preserve:
        schema["additionalProperties"] = False
    if schema.pop("nullable", False) and isinstance(schema.get("type"), str):
        schema["type"] = [schema["type"], "null"]
    for key in [k for k in schema if k.startswith("x-kubernetes-")]:
        del schema[key]
    return schema


def write_crd_schemas(into: Path) -> list[str]:
    """Writes one kubeconform schema per served version of each CRD, named as kubeconform's
    ``{{ .ResourceKind }}{{ .KindSuffix }}.json`` finds it; returns the kinds written."""
    into.mkdir(parents=True, exist_ok=True)
    kinds = []
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if not version.get("served", True):
                continue
            schema = _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
            schema["properties"]["apiVersion"] = {"enum": [f"{group}/{version['name']}"]}
            schema["properties"]["kind"] = {"enum": [kind]}
            name = f"{kind.lower()}-{group.split('.')[0]}-{version['name']}.json"
            (into / name).write_text(json.dumps(schema))
        kinds.append(kind)
    return kinds
