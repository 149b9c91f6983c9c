"""One pytest session of the SDK's own suite, in its own virtualenv, recorded test by test."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PLUGINS = Path(__file__).parent / "plugins"
"""The plugins loaded into the SDK's session (imported there by top-level name)."""

COMMON_OPTIONS = (
    "-q",
    "-p",
    "no:cacheprovider",
    # One event loop for every async test: the fleet's services live on it. The in-process
    # run uses it too, so the two runs differ only in the runner.
    "-o",
    "asyncio_default_test_loop_scope=session",
)


@dataclass(frozen=True)
class Session:
    """What one session did: every test's line of the record, and how long it took."""

    tests: dict[str, dict[str, Any]]
    seconds: float
    returncode: int
    log: Path


def run(
    python: str,
    root: Path,
    record: Path,
    *,
    fleet: bool,
    paths: Sequence[str],
    selection: Path | None = None,
    timeout: float = 60.0,
    extra: Sequence[str] = (),
) -> Session:
    """Run the SDK's tests under ``root`` (``paths`` relative to it; ``selection``, a file of
    node ids, keeps only those), with the runner on the fleet when ``fleet``."""
    record = record.resolve()  # the session runs in ``root``
    plugins = ["-p", "sdk_suite_fleet"] if fleet else []
    command = [
        python, "-m", "pytest", *COMMON_OPTIONS,
        *plugins, "-p", "sdk_suite_record",
        "--timeout", str(2 * timeout), *extra, *paths,
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])),
        "SDK_SUITE_REPORT": str(record),
        # The record plugin cancels an async test after this; pytest-timeout (twice as long)
        # is the backstop for sync tests.
        "SDK_SUITE_TEST_LIMIT": str(timeout),
    }
    if selection is not None:
        env["SDK_SUITE_SELECTION"] = str(selection.resolve())
    else:
        env.pop("SDK_SUITE_SELECTION", None)
    log = record.with_suffix(".log")
    began = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(
            command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, check=False
        )
        returncode = done.returncode
        # A session that dies (an interpreter error while reporting a failure, a crash) leaves
        # the test it was running "crashed" and the rest without a line: the rest run on in a
        # new session (and a new fleet), each of which reports its own crash the same way.
        left = -1
        while selection is not None and returncode not in (0, 1):
            wanted = [n for n in selection.read_text().splitlines() if n.strip()]
            recorded = read(record)
            rest = [n for n in wanted if n not in recorded]
            if not rest or len(rest) == left:  # done, or a session that ran nothing
                break
            left = len(rest)
            out.write(f"\n== the session died (exit {returncode}); {len(rest)} tests go on\n")
            out.flush()
            remaining = record.with_suffix(".rest.txt")
            remaining.write_text("\n".join(rest) + "\n")
            resumed = {**env, "SDK_SUITE_SELECTION": str(remaining), "SDK_SUITE_APPEND": "1"}
            returncode = subprocess.run(
                command, cwd=root, env=resumed, stdout=out, stderr=subprocess.STDOUT, check=False
            ).returncode
    seconds = time.monotonic() - began
    return Session(read(record), seconds, returncode, log)


def read(record: Path) -> dict[str, dict[str, Any]]:
    """Every test's line of a record, by node id (a test recorded twice keeps its last)."""
    if not record.exists():
        return {}
    tests = {}
    for line in record.read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            tests[entry["nodeid"]] = entry
    return tests
