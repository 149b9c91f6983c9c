"""A real Kubernetes control plane for the chart's install test: etcd (Debian's etcd-server)
and kube-apiserver (built from the Go modules of k8s.io/kubernetes by
``scripts/install-kube-test-tools.sh``, which ``make chart-tools`` runs), on loopback ports.

No scheduler, controller-manager or kubelet runs: the test plays the two parts a hook Job
needs from them (see :class:`HookJobRunner`), through the API server, whose admission plugins
and validation are the real ones.
"""

from __future__ import annotations

import base64
import datetime
import os
import secrets
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
TOOLS = CACHE / "toolfleet" / "kube-test-tools"
"""Where scripts/install-kube-test-tools.sh puts kube-apiserver and the CRDs."""
KUBE_APISERVER = TOOLS / "bin" / "kube-apiserver"
CRDS = TOOLS / "crds"
STARTUP_S = 60.0
"""How long etcd and the API server may take to answer (a cold start takes about 5 s)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _require(path: Path | None, what: str) -> Path:
    if path is None or not path.exists():
        pytest.fail(f"{what} is not installed: run `make chart-tools`")
    return path


def _wait_until(ready: Any, what: str, log: Path, within: float = STARTUP_S) -> None:
    deadline = time.monotonic() + within
    last: object = None
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.2)  # wait-ok: polling interval of a deadline-bounded wait
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    pytest.fail(f"{what} did not become ready within {within:.0f} s ({last}); its log:\n{tail}")


@dataclass
class ApiServer:
    """A running kube-apiserver: its URL, CA, an admin token and a kubeconfig for helm."""

    url: str
    ca: Path
    token: str
    kubeconfig: Path
    client: httpx.Client = field(repr=False)

    def get(self, path: str) -> dict[str, Any] | None:
        """The object at ``path``, or None when the API server says it does not exist."""
        response = self.client.get(path)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    def create(self, path: str, obj: dict[str, Any]) -> httpx.Response:
        """POSTs ``obj`` to the collection at ``path`` (the caller judges the answer)."""
        return self.client.post(path, json=obj)

    def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patches the object at ``path``."""
        response = self.client.patch(
            path, json=patch, headers={"Content-Type": "application/merge-patch+json"}
        )
        if response.is_error:
            raise AssertionError(f"PATCH {path}: {response.status_code} {response.text}")
        body: dict[str, Any] = response.json()
        return body

    def install_crds(self, paths: list[Path]) -> None:
        """Creates the CRDs and waits until the API server serves each (Established)."""
        names = []
        for path in paths:
            crd = yaml.safe_load(path.read_text())
            answer = self.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            if answer.is_error:
                raise AssertionError(f"CRD {path.name}: {answer.status_code} {answer.text}")
            names.append(crd["metadata"]["name"])

        def established() -> bool:
            for name in names:
                crd = self.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                conditions = ((crd or {}).get("status") or {}).get("conditions") or []
                if {"type": "Established", "status": "True"} not in [
                    {"type": c["type"], "status": c["status"]} for c in conditions
                ]:
                    return False
            return True

        _wait_until(established, "the CRDs", Path("/nonexistent"))


@contextmanager
def api_server(workdir: Path) -> Iterator[ApiServer]:
    """etcd and kube-apiserver on free loopback ports, stopped (and waited for) on exit."""
    etcd = _require(Path(p) if (p := _which("etcd")) else None, "etcd (Debian's etcd-server)")
    apiserver = _require(KUBE_APISERVER, "kube-apiserver")
    workdir.mkdir(parents=True, exist_ok=True)
    certs = workdir / "certs"
    certs.mkdir()
    token = secrets.token_hex(16)
    (certs / "tokens.csv").write_text(f"{token},admin,admin,system:masters\n")
    subprocess.run(
        ["openssl", "genrsa", "-out", str(certs / "service-accounts.key"), "2048"],
        check=True, capture_output=True,
    )  # fmt: skip
    client_port, peer_port, secure_port = _free_port(), _free_port(), _free_port()
    etcd_url = f"http://127.0.0.1:{client_port}"
    processes: list[subprocess.Popen[bytes]] = []
    etcd_log, apiserver_log = workdir / "etcd.log", workdir / "kube-apiserver.log"
    try:
        with etcd_log.open("wb") as out:
            processes.append(subprocess.Popen(
                [str(etcd), "--data-dir", str(workdir / "etcd"), "--name", "chart-test",
                 "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                 "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                 "--initial-cluster", f"chart-test=http://127.0.0.1:{peer_port}"],
                stdout=out, stderr=subprocess.STDOUT,
            ))  # fmt: skip
        _wait_until(
            lambda: httpx.get(f"{etcd_url}/health", timeout=2).json().get("health") == "true",
            "etcd", etcd_log,
        )  # fmt: skip
        with apiserver_log.open("wb") as out:
            processes.append(subprocess.Popen(
                [str(apiserver), "--etcd-servers", etcd_url,
                 "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
                 "--secure-port", str(secure_port), "--cert-dir", str(certs),
                 "--token-auth-file", str(certs / "tokens.csv"),
                 "--authorization-mode", "RBAC",
                 "--service-account-issuer", "https://kubernetes.default.svc",
                 "--service-account-key-file", str(certs / "service-accounts.key"),
                 "--service-account-signing-key-file", str(certs / "service-accounts.key"),
                 "--service-cluster-ip-range", "10.96.0.0/24",
                 # No node runs, so the endpoints of the default/kubernetes Service stay empty.
                 "--endpoint-reconciler-type", "none"],
                stdout=out, stderr=subprocess.STDOUT,
            ))  # fmt: skip
        url = f"https://127.0.0.1:{secure_port}"
        ca = certs / "apiserver.crt"  # self-signed by the API server, with its CA, at start
        headers = {"Authorization": f"Bearer {token}"}

        def ready() -> bool:
            if not ca.exists():
                return False
            tls = ssl.create_default_context(cafile=str(ca))
            return httpx.get(f"{url}/readyz", verify=tls, headers=headers, timeout=2).text == "ok"

        _wait_until(ready, "kube-apiserver", apiserver_log)
        kubeconfig = workdir / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {
                "server": url,
                "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode(),
            }}],
            "users": [{"name": "admin", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
        }))  # fmt: skip
        kubeconfig.chmod(0o600)
        tls = ssl.create_default_context(cafile=str(ca))
        with httpx.Client(base_url=url, verify=tls, headers=headers, timeout=30) as client:
            yield ApiServer(url, ca, token, kubeconfig, client)
    finally:
        for process in reversed(processes):  # the API server first, then etcd
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def _which(name: str) -> str | None:
    for folder in [*os.environ.get("PATH", "").split(os.pathsep), "/usr/bin", "/usr/sbin"]:
        candidate = Path(folder) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def referenced_config(pod_spec: dict[str, Any]) -> set[tuple[str, str]]:
    """The (kind, name) of every Secret and ConfigMap a pod needs before its containers start:
    env, envFrom, volumes (projected ones too) and image pull secrets; optional ones aside."""
    found: set[tuple[str, str]] = set()

    def add(kind: str, ref: dict[str, Any] | None, name_key: str = "name") -> None:
        if ref and not ref.get("optional", False):
            found.add((kind, ref[name_key]))

    for container in pod_spec.get("initContainers", []) + pod_spec.get("containers", []):
        for env in container.get("env", []):
            source = env.get("valueFrom", {})
            add("Secret", source.get("secretKeyRef"))
            add("ConfigMap", source.get("configMapKeyRef"))
        for env_from in container.get("envFrom", []):
            add("Secret", env_from.get("secretRef"))
            add("ConfigMap", env_from.get("configMapRef"))
    for volume in pod_spec.get("volumes", []):
        add("Secret", volume.get("secret"), "secretName")
        add("ConfigMap", volume.get("configMap"))
        for source in volume.get("projected", {}).get("sources", []):
            add("Secret", source.get("secret"))
            add("ConfigMap", source.get("configMap"))
    for pull in pod_spec.get("imagePullSecrets", []):
        found.add(("Secret", pull["name"]))
    return found


@dataclass
class HookRun:
    """What the runner saw of one hook Job."""

    job: str
    pod_answer: str
    missing: list[str]


class HookJobRunner:
    """Plays the Job controller and the kubelet for the hook Jobs of one namespace, while
    ``helm install`` or ``helm upgrade`` waits for them.

    For each Job that appears it does what they would: the Job controller creates the Job's
    pod from its template through the API server (whose ServiceAccount admission refuses a pod
    whose ServiceAccount does not exist: that is how a hook that runs before its
    ServiceAccount fails in a real cluster); the kubelet starts the containers only when every
    Secret and ConfigMap they read exists. When both pass, the pod and the Job are marked
    succeeded, as they would be after the container exits 0 (the image itself is not run: the
    topics it would create are tested elsewhere); otherwise the Job is marked failed, with the
    reason, and helm reports it.
    """

    def __init__(self, api: ApiServer, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.runs: list[HookRun] = []
        self._seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> HookJobRunner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(0.1):
                jobs = self.api.get(f"/apis/batch/v1/namespaces/{self.namespace}/jobs") or {}
                for job in jobs.get("items", []):
                    uid = job["metadata"]["uid"]
                    if uid not in self._seen and not job.get("status", {}).get("conditions"):
                        self._seen.add(uid)
                        self.runs.append(self._run(job))
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc

    def _run(self, job: dict[str, Any]) -> HookRun:
        name, ns = job["metadata"]["name"], self.namespace
        template = job["spec"]["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{name}-",
                "labels": {**template["metadata"].get("labels", {}), "job-name": name},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": template["spec"],
        }
        answer = self.api.create(f"/api/v1/namespaces/{ns}/pods", pod)
        missing: list[str] = []
        if answer.is_success:
            created = answer.json()
            plural = {"Secret": "secrets", "ConfigMap": "configmaps"}
            for kind, ref in sorted(referenced_config(created["spec"])):
                if self.api.get(f"/api/v1/namespaces/{ns}/{plural[kind]}/{ref}") is None:
                    missing.append(f"{kind} {ref}")
            phase = "Failed" if missing else "Succeeded"
            self.api.merge_patch(
                f"/api/v1/namespaces/{ns}/pods/{created['metadata']['name']}/status",
                {"status": {"phase": phase}},
            )
            pod_answer = "created"
        else:
            pod_answer = f"{answer.status_code}: {answer.json().get('message', answer.text)}"
        now = _now()
        if answer.is_success and not missing:
            reason, message = "CompletionsReached", "Reached expected number of succeeded pods"
            conditions = ["SuccessCriteriaMet", "Complete"]
            counts = {"succeeded": 1}
        else:
            reason = "BackoffLimitExceeded"
            message = f"the pod could not run: {pod_answer if not answer.is_success else missing}"
            conditions = ["FailureTarget", "Failed"]
            counts = {"failed": 1} if answer.is_success else {}
        status: dict[str, Any] = {
            "startTime": now,
            **counts,
            "conditions": [
                {
                    "type": kind,
                    "status": "True",
                    "reason": reason,
                    "message": message,
                    "lastProbeTime": now,
                    "lastTransitionTime": now,
                }
                for kind in conditions
            ],
        }
        if "Complete" in conditions:
            status["completionTime"] = now
        self.api.merge_patch(
            f"/apis/batch/v1/namespaces/{ns}/jobs/{name}/status", {"status": status}
        )
        return HookRun(name, pod_answer, missing)
