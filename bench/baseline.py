"""Another commit's toolfleet beside this checkout's, in the same bench run (``--baseline REF``).

The commit's tree is written out with ``git archive`` into ``.artifacts/bench-baseline/<sha>``
(git-ignored; a later run reuses it), and its services run from there: that directory is their
working directory and first on PYTHONPATH, so every top-level package and the bench's tool
module (``bench.tools``) come from the commit, not from the virtualenv's editable install of
this checkout. The driver (load generator, turn-result reader) stays this checkout's: model
responses and turn results are the public wire contract, which both sides must read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from bench.procs import REPO, source_path

HOME = REPO / ".artifacts" / "bench-baseline"
"""Where the baselines' trees are kept, one folder per commit (git-ignored)."""

COMPLETE = ".bench-baseline"
"""Written last into a tree, holding its commit: a tree without it was cut short."""

PACKAGES = ("toolfleet", "kernel", "planner", "executors", "aggregator", "reconciler", "schemas")
"""The top-level packages a service imports, and with ``bench.tools`` what must come from the
baseline's tree."""


class BaselineError(RuntimeError):
    """The baseline commit could not be found, written out, or imported from its tree."""


@dataclass(frozen=True)
class Baseline:
    """A commit's source tree on disk."""

    ref: str
    """What the user named (``4da064b``, a tag, ``HEAD~3``)."""
    sha: str
    root: Path

    @property
    def short(self) -> str:
        """The abbreviated commit id shown in the report."""
        return self.sha[:7]

    @property
    def system(self) -> str:
        """Its system name in the results: ``toolfleet@<short sha>``."""
        return f"toolfleet@{self.short}"

    def imports(self) -> dict[str, str]:
        """Where a child started as the baseline's services are imports each package from
        (module -> file): the proof that PYTHONPATH wins over the editable install."""
        names = [*PACKAGES, "bench.tools"]
        code = (
            "import importlib, json, sys\n"
            f"names = {names!r}\n"
            "print(json.dumps({n: importlib.import_module(n).__file__ for n in names}))\n"
        )
        env = {**os.environ, "PYTHONPATH": source_path(self.root)}
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            cwd=self.root,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if done.returncode != 0:
            raise BaselineError(
                f"importing toolfleet from {self.root} failed: {done.stderr.strip()[-2000:]}"
            )
        found: dict[str, str] = json.loads(done.stdout)
        return found

    def check_imports(self) -> dict[str, str]:
        """``imports``, raising if any module resolves outside the baseline's tree."""
        found = self.imports()
        stray = {n: f for n, f in found.items() if not Path(f).resolve().is_relative_to(self.root)}
        if stray:
            raise BaselineError(
                f"the baseline's services would import {stray} from outside {self.root}: "
                "something ahead of PYTHONPATH on sys.path (a .pth file?) shadows it"
            )
        return found


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False, timeout=120
    )
    if done.returncode != 0:
        raise BaselineError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def resolve(ref: str) -> str:
    """The full commit id ``ref`` names in this clone."""
    try:
        return _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except BaselineError:
        shallow = _git("rev-parse", "--is-shallow-repository") == "true"
        hint = " (a shallow clone: `git fetch --unshallow` first)" if shallow else ""
        raise BaselineError(
            f"no commit {ref!r} in this clone{hint}; name another with --baseline REF "
            "(BENCH_BASELINE=REF for make bench), or run without one (BENCH_BASELINE=)"
        ) from None


def materialise(ref: str, home: Path = HOME) -> Baseline:
    """The tree of commit ``ref`` under ``home/<sha>``, written out once and reused."""
    sha = resolve(ref)
    root = (home / sha).resolve()
    if (root / COMPLETE).is_file() and (root / COMPLETE).read_text().strip() == sha:
        return Baseline(ref, sha, root)
    home.mkdir(parents=True, exist_ok=True)
    for stale in [*home.glob(f".{sha}.*"), root]:  # what a run that was killed left behind
        shutil.rmtree(stale, ignore_errors=True)
    partial = home / f".{sha}.{os.getpid()}"
    partial.mkdir()
    try:
        _extract(sha, partial)
        (partial / COMPLETE).write_text(sha + "\n")
        partial.rename(root)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return Baseline(ref, sha, root)


def _extract(sha: str, into: Path) -> None:
    """``git archive SHA`` unpacked into ``into`` (streamed: nothing but the tree on disk)."""
    archive = subprocess.Popen(
        ["git", "-C", str(REPO), "archive", "--format=tar", sha],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert archive.stdout is not None
    try:
        with tarfile.open(fileobj=archive.stdout, mode="r|") as tar:
            tar.extractall(into, filter="data")
    finally:
        archive.stdout.close()
        _, err = archive.communicate(timeout=120)
    if archive.returncode != 0:
        raise BaselineError(f"git archive {sha} failed: {err.decode(errors='replace').strip()}")
