"""The console's live feed shows calls' progress from the real ``progress`` topic: each event
once, a retried attempt's told apart, and only the console's tenant's."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from kernel.adapters.bus import KafkaBus
from kernel.settings import Settings
from schemas import ProgressEvent
from tests.conftest import wait_for
from tests.integration.console_support import bearer, served_console, tokens_setting
from toolfleet.app.console import ConsoleOptions

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]


def _progress(run: str, attempt: int, sequence: int, tenant: str = "acme") -> ProgressEvent:
    return ProgressEvent(
        tenant_id=tenant, run_id=run, turn_id=0, call_id=f"{run}-c", tool_name="reindex",
        attempt=attempt, sequence=sequence, done=float(sequence), total=4.0,
        message=f"batch {sequence} of 4", at=time.time(),
    )  # fmt: skip


async def test_the_console_shows_each_progress_event_once_and_only_its_tenants(
    settings: Settings, topics: list[str], bus: KafkaBus
) -> None:
    tokens = {"console_tokens": SecretStr(tokens_setting())}
    scoped = ConsoleOptions(tenant="acme")
    run = f"progress-{time.monotonic_ns()}"
    async with (
        served_console(settings.model_copy(update=tokens), scoped) as url,
        httpx.AsyncClient(base_url=url, timeout=10, headers=bearer("root")) as http,
    ):
        # One run id, one partition: the records arrive in this order.
        for event in [
            _progress(run, 1, 1),
            _progress(run, 1, 1),  # a duplicate
            _progress(run, 1, 1, tenant="globex"),  # another tenant's run of the same id
            _progress(run, 2, 1),  # the fleet's retry, counting from 1 again
            _progress(run, 1, 2),  # attempt 1, late
            _progress(run, 2, 2),
        ]:
            await bus.publish_and_wait("progress", run, event)

        async def shown() -> list[dict[str, Any]] | None:
            answer = await http.get("/api/recent", params={"run": run})
            rows = [e for e in answer.json()["events"] if e["kind"] == "progress"]
            return rows if any((e["attempt"], e["sequence"]) == (2, 2) for e in rows) else None

        rows = await wait_for(shown)
        assert rows is not None
        assert [(e["tenant_id"], e["attempt"], e["sequence"]) for e in rows] == [
            ("acme", 1, 1), ("acme", 2, 1), ("acme", 2, 2),
        ]  # fmt: skip
        assert (rows[-1]["done"], rows[-1]["total"], rows[-1]["message"]) == (
            2.0, 4.0, "batch 2 of 4",
        )  # fmt: skip
        turns_only = await http.get("/api/recent", params={"run": run, "outcomes": "0"})
        assert turns_only.json()["events"] == []  # progress comes with the outcomes
