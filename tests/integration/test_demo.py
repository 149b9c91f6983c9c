"""`toolfleet demo`, as a newcomer runs it: a completed turn and nothing alarming printed."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from kernel.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]


def test_the_demo_completes_its_turn_on_fresh_topics_without_error_lines(
    settings: Settings,
) -> None:
    env = dict(
        os.environ,
        KAFKA_BOOTSTRAP_SERVERS=settings.kafka_servers(),
        REDIS_URL=settings.redis_address(),
        TOOLFLEET_TOPIC_PREFIX=f"demo-{uuid.uuid4().hex[:8]}.",  # fresh topics, as on day one
        TOOLFLEET_DECISION_AUTH="off",
    )
    done = subprocess.run(
        [sys.executable, "-m", "toolfleet", "demo"], env=env, capture_output=True, text=True,
        timeout=180, check=False,
    )  # fmt: skip
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed
    assert '"status": "completed"' in done.stdout
    assert "Error" not in printed and "Traceback" not in printed, printed
