"""The Agents SDK's source distribution: downloaded once, checked against a pinned digest,
its tests and examples extracted for a run."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

VERSION = "0.24.0"
"""The openai-agents release whose own test suite the harness runs (toolfleet pins it)."""
SDIST = f"openai_agents-{VERSION}.tar.gz"
SHA256 = "4b4b285f4fed81fdf1b4ac426a9101658d9cd29b4fb1aaeee18f639b77e704e3"
"""The digest of ``SDIST`` as PyPI serves it: a different file is refused, not run."""
EXTRACTED = ("tests", "examples", "pyproject.toml")
"""What a run needs from the sdist: the suite, the examples it imports, its pytest settings."""


def cache_dir() -> Path:
    """Where the sdist is kept between runs (``~/.cache/toolfleet/sdk-suite``)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "toolfleet" / "sdk-suite"


def digest(path: Path) -> str:
    """The sha256 of a file, in hex."""
    sha = hashlib.sha256()
    with path.open("rb") as data:
        for block in iter(lambda: data.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def fetch(python: str = sys.executable) -> Path:
    """The verified sdist, downloaded with pip into the cache when it is not there yet."""
    target = cache_dir()
    path = target / SDIST
    if not path.exists():
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                python, "-m", "pip", "download", "--quiet", "--no-deps",
                "--no-binary", ":all:", f"openai-agents=={VERSION}", "--dest", str(target),
            ],
            check=True,
        )  # fmt: skip
    found = digest(path)
    if found != SHA256:
        raise SystemExit(
            f"{path} has sha256 {found}, not the pinned {SHA256}: delete it and run again to "
            "download it anew (if PyPI serves a different file, find out why before pinning it)"
        )
    return path


def extract(sdist: Path, into: Path) -> Path:
    """``EXTRACTED`` from the sdist, into a fresh ``into/openai_agents-<version>``."""
    root = into / f"openai_agents-{VERSION}"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    prefix = f"openai_agents-{VERSION}/"
    with tarfile.open(sdist) as tar:
        members = []
        for member in tar.getmembers():
            name = member.name.removeprefix(prefix)
            if name.split("/", 1)[0] in EXTRACTED:
                member.name = name
                members.append(member)
        tar.extractall(root, members=members, filter="data")
    return root
