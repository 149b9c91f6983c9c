"""Every object a hook uses exists before the hook runs, read off the rendered manifests.

Helm creates a release's hooks of an event (pre-install, pre-upgrade, ...) one weight after
another, waits for each, and only then the release's ordinary resources. So an object a
pre-install hook's pod needs (its ServiceAccount, a RoleBinding that grants it, a Secret or
ConfigMap it reads) that the chart itself creates must be a hook of the same event with a
lower weight. Objects the chart does not create (Secrets the values name) are the
installer's to create beforehand. ``test_install.py`` checks the same against a real API
server; this check needs no cluster and covers every combination below.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart._kube import referenced_config
from tests.chart.test_chart import FULL, _objects, _render

BEFORE_THE_RELEASE = {"pre-install", "pre-upgrade", "pre-rollback"}
"""Events whose hooks run before the release's ordinary resources are (re)applied."""

POD_HOLDERS = {"Pod": (), "Job": ("spec", "template"), "CronJob": ("spec", "jobTemplate")}


def _hook(obj: dict[str, Any]) -> tuple[set[str], int] | None:
    annotations = obj["metadata"].get("annotations") or {}
    if "helm.sh/hook" not in annotations:
        return None
    events = {e.strip() for e in annotations["helm.sh/hook"].split(",")}
    return events, int(annotations.get("helm.sh/hook-weight", "0"))


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    if obj["kind"] not in POD_HOLDERS:
        return None
    node = obj
    for key in POD_HOLDERS[obj["kind"]]:
        node = node[key]
    if obj["kind"] == "CronJob":
        node = node["spec"]["template"]
    spec: dict[str, Any] = node["spec"]
    return spec


def hook_dependency_problems(objects: list[dict[str, Any]]) -> list[str]:
    """What a hook uses that will not exist when it runs, one line each (empty: none)."""
    rendered = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    problems = []
    for obj in objects:
        hook, spec = _hook(obj), _pod_spec(obj)
        if hook is None or spec is None:
            continue
        events, weight = hook
        account = spec.get("serviceAccountName") or "default"
        needs = {("ServiceAccount", account)} | referenced_config(spec)
        needs |= {
            (binding["kind"], binding["metadata"]["name"])
            for binding in objects
            if binding["kind"] in {"RoleBinding", "ClusterRoleBinding"}
            and {"kind": "ServiceAccount", "name": account}
            in [{"kind": s["kind"], "name": s["name"]} for s in binding.get("subjects", [])]
        }
        for kind, name in sorted(needs):
            dependency = rendered.get((kind, name))
            if dependency is None:
                continue  # not the chart's: created before the install
            its_hook = _hook(dependency)
            for event in sorted(events & BEFORE_THE_RELEASE):
                if its_hook is None or event not in its_hook[0]:
                    problems.append(
                        f"{obj['kind']} {obj['metadata']['name']} ({event}) uses {kind} {name}, "
                        f"which is not a {event} hook: it is created after the hook runs"
                    )
                elif its_hook[1] >= weight:
                    problems.append(
                        f"{obj['kind']} {obj['metadata']['name']} ({event}, weight {weight}) "
                        f"uses {kind} {name}, a hook of weight {its_hook[1]}: not earlier"
                    )
    return problems


CASES = {
    "defaults": ((), ()),
    "full": ((FULL,), ()),
    "own-service-account": ((FULL,), ("serviceAccount.create=false", "serviceAccount.name=ops")),
    "no-topics-job": ((), ("topics.applyJob=false",)),
    "no-jobs": ((), ("topics.applyJob=false", "migrations.job=false")),
}


def _account(job: dict[str, Any]) -> str:
    return str(job["spec"]["template"]["spec"]["serviceAccountName"])


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_every_hook_finds_what_it_uses(case: str) -> None:
    values, sets = CASES[case]
    objects = _objects(_render(*values, sets=sets))
    assert hook_dependency_problems(objects) == []
    jobs = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Job"}
    if case == "no-jobs":
        assert not jobs
        assert [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"] == [
            "fleet-toolfleet"
        ]
        return
    migrate, finish = (
        jobs.pop("fleet-toolfleet-migrate"),
        jobs.pop("fleet-toolfleet-migrate-finish"),
    )
    # Before the release: the hooks' own account; after it: the release's, which exists then.
    assert _account(migrate) == _account(jobs.get("fleet-toolfleet-topics", migrate))
    assert _account(finish) == _account(next(o for o in objects if o["kind"] == "Deployment"))
    if case == "no-topics-job":
        assert not jobs
        return
    job = jobs.pop("fleet-toolfleet-topics")
    assert not jobs
    account = _account(job)
    services = {
        d["spec"]["template"]["spec"]["serviceAccountName"]
        for d in objects
        if d["kind"] == "Deployment"
    }
    if case == "own-service-account":
        # The installer's ServiceAccount, for the Job and the services alike; none rendered.
        assert account == "ops" and services == {"ops"}
        assert not [o for o in objects if o["kind"] == "ServiceAccount"]
    else:
        # The Job's own account is a hook; the services' is an ordinary resource (kept
        # across upgrades, deleted with the release).
        assert account == "fleet-toolfleet-topics" and services == {"fleet-toolfleet"}
        (release_account,) = [
            o
            for o in objects
            if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == "fleet-toolfleet"
        ]
        assert _hook(release_account) is None


def test_the_check_finds_a_service_account_created_after_its_hook() -> None:
    """The layout of the chart before the fix: the Job's ServiceAccount an ordinary resource."""
    objects = copy.deepcopy(_objects(_render()))
    for obj in objects:
        if obj["kind"] == "ServiceAccount":
            obj["metadata"].pop("annotations", None)
    assert hook_dependency_problems(objects) == [
        f"Job fleet-toolfleet-{job} ({event}) uses ServiceAccount fleet-toolfleet-topics, "
        f"which is not a {event} hook: it is created after the hook runs"
        for job in ("migrate", "topics")
        for event in ("pre-install", "pre-upgrade")
    ]


def test_a_secret_the_hook_reads_must_be_an_earlier_hook(tmp_path: Path) -> None:
    """A Secret of extraObjects that every container reads (envFrom): an ordinary object is
    created too late for the topics and migrate Jobs; a hook of an earlier weight is in time."""
    secret: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "fleet-extra"},
        "stringData": {"K": "v"},
    }
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {"envFrom": [{"secretRef": {"name": "fleet-extra"}}], "extraObjects": [secret]}
        )
    )
    late = hook_dependency_problems(_objects(_render(values)))
    assert [p.split(" (")[0] for p in late] == [
        f"Job fleet-toolfleet-{job}" for job in ("migrate", "migrate", "topics", "topics")
    ]
    assert [p.split(" (")[1].split(")")[0] for p in late] == ["pre-install", "pre-upgrade"] * 2
    assert all("uses Secret fleet-extra" in p for p in late)
    secret["metadata"]["annotations"] = {
        "helm.sh/hook": "pre-install,pre-upgrade",
        "helm.sh/hook-weight": "-5",
    }
    values.write_text(
        yaml.safe_dump(
            {"envFrom": [{"secretRef": {"name": "fleet-extra"}}], "extraObjects": [secret]}
        )
    )
    assert hook_dependency_problems(_objects(_render(values))) == []


def test_migrate_runs_before_the_services_change_and_finish_after_them() -> None:
    """``toolfleet migrate`` is a pre-install/pre-upgrade hook after the topics Job; ``--finish``
    a post-install/post-upgrade hook, waiting for the rollout at most finishWaitSeconds. Both
    are one-shot commands: no probe restarts them while they wait."""
    objects = _objects(_render(sets=("migrations.finishWaitSeconds=120",)))
    jobs = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Job"}
    migrate, finish = jobs["fleet-toolfleet-migrate"], jobs["fleet-toolfleet-migrate-finish"]
    topics = _hook(jobs["fleet-toolfleet-topics"])
    assert _hook(migrate) == ({"pre-install", "pre-upgrade"}, 5)
    assert topics is not None and topics[1] < 5
    assert _hook(finish) == ({"post-install", "post-upgrade"}, 0)
    for job, args in ((migrate, ["migrate"]), (finish, ["migrate", "--finish", "--wait", "120"])):
        (container,) = job["spec"]["template"]["spec"]["containers"]
        assert container["args"] == args
        assert not {"startupProbe", "livenessProbe", "readinessProbe", "ports"} & set(container)
