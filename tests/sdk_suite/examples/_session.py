"""The examples' pytest session, as the harness runs it (``python -m tests.sdk_suite
examples``, and ``run`` under ``make sdk-suite``).

It runs in the harness's virtualenv (the ``sdk-suite`` extra: the Agents SDK, toolfleet, the
test tools), from the repository, with ``SDK_SUITE_EXAMPLES`` naming the unpacked sdist, and
records one JSON line per test with the harness's record plugin.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tests.sdk_suite import _session

REPO = Path(__file__).resolve().parents[3]
TESTS = Path(__file__).resolve().parent


def run(python: str, root: Path, record: Path, *, timeout: float = 60.0) -> _session.Session:
    """The examples' tests against the sdist unpacked at ``root``, recorded in ``record``
    (its log beside it, ``.log``)."""
    record = record.resolve()
    command = [
        python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "sdk_suite_record",
        "--timeout", str(2 * timeout), str(TESTS.relative_to(REPO)),
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(_session.PLUGINS), os.environ.get("PYTHONPATH")])
        ),
        "SDK_SUITE_EXAMPLES": str(root.resolve()),
        "SDK_SUITE_REPORT": str(record),
        "SDK_SUITE_TEST_LIMIT": str(timeout),
    }
    for name in ("SDK_SUITE_SELECTION", "SDK_SUITE_APPEND"):
        env.pop(name, None)
    log = record.with_suffix(".log")
    began = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(
            command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, check=False
        )
    return _session.Session(_session.read(record), time.monotonic() - began, done.returncode, log)
