"""The README's blocks, run as a newcomer copy-pastes them after `make demo`'s set-up.

Every shell and Python block runs in order in one real shell (tests/docs/readme.py), against
the real Kafka and Redis of the test session: the services the README starts are real
processes, the turn and the agent's approval go through them, and what each Python block
prints is checked against the output block under it. Only blocks marked
``<!-- not run: reason -->`` are skipped, and the README has no other kind of block.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from kernel.settings import Settings
from tests.docs.readme import read_blocks, run_readme

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]

README = Path(__file__).parents[2] / "README.md"
# Variables of the developer's shell that would point the README's services elsewhere.
FOREIGN = ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL", "VIRTUAL_ENV", "PYTHONHOME")


def test_every_readme_block_is_run_or_says_why_not() -> None:
    blocks = read_blocks(README.read_text())
    unknown = [b.line for b in blocks if b.kind is None]
    assert not unknown, f"README blocks at lines {unknown} are neither shell nor Python"
    assert any(b.runs and b.kind == "shell" for b in blocks)
    assert any(b.runs and b.kind == "python" for b in blocks)
    skipped = [b for b in blocks if not b.runs]
    assert len(skipped) <= 1, "blocks not run: " + "; ".join(
        f"line {b.line}: {b.not_run}" for b in skipped
    )


def test_the_readme_five_minute_path_runs_as_written(
    settings: Settings, topics: list[str], tmp_path: Path
) -> None:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("TOOLFLEET_") and key not in FOREIGN
    }
    env.update(
        # The platform's Kafka and Redis: `toolfleet infra up` starts nothing and exports them.
        KAFKA_BOOTSTRAP_SERVERS=settings.kafka_servers(),
        REDIS_URL=settings.redis_address(),
        # This session's topics and keys (deleted when it ends), so nothing else is touched.
        TOOLFLEET_TOPIC_PREFIX=settings.topic_prefix,
    )
    run = run_readme(README, workdir=tmp_path, venv=Path(sys.prefix), env=env, timeout=240)
    assert not run.leftovers, f"the README left processes running: {run.leftovers}"
