"""Topics owned on purpose: with auto-creation off, a service that finds its topics missing
waits (not ready), naming them and how to create them; ``toolfleet topics apply`` creates
them, and the service starts serving."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
import uuid

import pytest

from kernel.settings import Settings
from toolfleet.testing import LocalFleet

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]


def _ready(fleet: LocalFleet, name: str) -> int | None:
    port = fleet.metrics_port(name)
    if port is None:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return None


async def _until(condition: object, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(condition):  # type: ignore[arg-type]
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.2)  # wait-ok: polling interval of a deadline-bounded wait


async def test_a_service_waits_for_missing_topics_until_topics_apply_creates_them(
    settings: Settings,
) -> None:
    own = settings.model_copy(update={"topic_prefix": f"owned-{uuid.uuid4().hex[:6]}."})
    env = {"TOOLFLEET_TOPICS_AUTO_CREATE": "false"}
    with LocalFleet(own, tools="tests.integration.crash_tools:tools", workers=0,
                    extra_env=env) as fleet:  # fmt: skip
        await _until(lambda: "missing Kafka topics:" in fleet.logs("planner"))
        log = fleet.logs("planner")
        assert f"{own.topic_prefix}model-responses" in log
        assert "toolfleet topics apply --pool default" in log
        assert fleet.alive("planner") and _ready(fleet, "planner") == 503  # waiting, no crash loop
        plan = fleet.cli("topics", "plan").stdout
        assert f"{own.topic_prefix}commands.default" in plan
        applied = fleet.cli("topics", "apply").stdout
        assert applied.count("created  ") == len(plan.splitlines()) - 1
        await _until(lambda: _ready(fleet, "planner") == 200)
        again = fleet.cli("topics", "apply").stdout
        assert "created" not in again and again.count("exists   ") == len(plan.splitlines()) - 1
