"""Two releases side by side: the baseline's services from a git worktree, the current ones
from this checkout, as child processes on one Kafka and one Redis state.

A process of a release runs ``python -m toolfleet`` with the release's tree as its working
directory and first on PYTHONPATH, so every top-level package (``kernel``, ``planner``, ...,
``toolfleet``) is that release's, whatever the virtualenv's editable install points at; the
upgrade test's tool module (``served/upgrade_tools.py``) is on PYTHONPATH for both.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from toolfleet.testing import LocalFleet
from toolfleet.testing._fleet import ChildProcess

REPO = Path(__file__).resolve().parents[2]
SERVED = Path(__file__).resolve().parent / "served"
PACKAGES = ("kernel", "planner", "executors", "aggregator", "reconciler", "schemas", "toolfleet")


def baseline_commit() -> str:
    """The baseline release's commit, as the repository records it."""
    with (REPO / "kernel" / "stores" / "baseline.toml").open("rb") as f:
        return str(tomllib.load(f)["commit"])


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False, timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def add_worktree(commit: str, where: Path) -> Path:
    """Check ``commit`` out into ``where`` (a detached worktree of this clone); a shallow
    clone that lacks it fetches it first."""
    try:
        _git("cat-file", "-e", f"{commit}^{{commit}}")
    except RuntimeError:
        if _git("rev-parse", "--is-shallow-repository") != "true":
            raise
        _git("fetch", "--depth=1", "origin", commit)
    _git("worktree", "prune")  # what a run that was killed left behind
    _git("worktree", "add", "--detach", str(where), commit)
    return where


def remove_worktree(where: Path) -> None:
    """Remove a worktree ``add_worktree`` made (and git's record of it)."""
    _git("worktree", "remove", "--force", str(where))


@dataclass(frozen=True)
class Release:
    """A release's source tree: the baseline's worktree or this checkout."""

    name: str
    root: Path

    def env(self) -> dict[str, str]:
        """What a process of this release gets on top of the fleet's environment."""
        return {"PYTHONPATH": f"{self.root}:{SERVED}"}

    def resolved(self, base_env: dict[str, str]) -> dict[str, str]:
        """Where each top-level package (and the test's tool module) comes from in a process
        started as this release's processes are."""
        code = (
            "import importlib, json\n"
            f"names = {[*PACKAGES, 'upgrade_tools']!r}\n"
            "print(json.dumps({n: importlib.import_module(n).__file__ for n in names}))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            env={**base_env, **self.env()},
            cwd=self.root,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        found: dict[str, str] = json.loads(done.stdout)
        return found


@dataclass
class RollingFleet(LocalFleet):
    """A LocalFleet whose processes each run one release; named ``<role>@<release>``."""

    releases: dict[str, Release] = field(default_factory=dict)
    """Process name -> its release (set by ``start_as``)."""

    def start_as(self, release: Release, role: str, args: list[str]) -> str:
        """Start ``toolfleet ARGS`` of ``release`` as the process ``<role>@<release>``."""
        name = f"{role}@{release.name}"
        self.releases[name] = release
        log = (self.log_dir / f"{name}.log").open("ab")
        argv = [sys.executable, "-m", "toolfleet", *args]
        proc = ChildProcess(name, argv, log)
        proc.popen = subprocess.Popen(
            argv, env={**self.env(), **release.env()}, cwd=release.root, stdout=log, stderr=log
        )
        self._procs[name] = proc
        return name

    def cli_as(self, release: Release, *args: str) -> str:
        """Run an operator's command of ``release`` against this fleet; its stdout."""
        done = subprocess.run(
            [sys.executable, "-m", "toolfleet", *args],
            env={**self.env(), **release.env()},
            cwd=release.root,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if done.returncode != 0:
            raise AssertionError(f"toolfleet {' '.join(args)} ({release.name}): {done.stderr}")
        return done.stdout

    def stop_one(self, name: str, timeout: float = 90.0) -> int:
        """SIGTERM one process, as Kubernetes stops a pod; wait for its exit; its status.
        It is forgotten (``check`` no longer looks at it)."""
        status = self.terminate(name, timeout)
        self._procs.pop(name).log.close()
        return status

    async def until_ready(self, name: str, within: float = 120.0) -> None:
        """Wait until the process answers /readyz with 200, as a Deployment's rollout does."""
        deadline = time.monotonic() + within
        while True:
            self.check()
            port = self.metrics_port(name)
            if port is not None and await asyncio.to_thread(_ready, port):
                return
            if time.monotonic() > deadline:
                tail = "\n".join(self.logs(name).splitlines()[-15:])
                raise AssertionError(f"{name} not ready within {within:.0f} s:\n{tail}")
            await asyncio.sleep(0.1)  # wait-ok: polling interval of a deadline-bounded wait

    def tails(self, lines: int = 25) -> str:
        """The last lines of every process's log (for a failure's report)."""
        parts = []
        for path in sorted(self.log_dir.glob("*.log")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"== {path.name}\n" + "\n".join(tail))
        return "\n".join(parts)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False
