"""Deferred completion on a fleet of processes: a tool hands its work to an external system
and returns ``Deferred``; its worker frees the call's slot and exits; the external system
completes the call hours later (here: at once) with a signed completion on ``completions``,
and the other worker of the pool settles the turn. A repeated or forged completion changes
nothing. A completion that never comes: once overdue, the call's effect is unknown and its
probe settles it; a late completion changes nothing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

from kernel.adapters.bus import KafkaBus
from kernel.settings import Settings
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger
from schemas import CompletionMessage, ModelResponseEvent
from tests.conftest import wait_for
from tests.integration.deferred_tools import farm_key, handed_key
from tests.integration.test_pipeline import turn
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client

pytestmark = pytest.mark.integration

TOOLS = "tests.integration.deferred_tools:tools"


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    with LocalFleet(settings, tools=TOOLS, workers=2) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


async def _handed(redis: Redis, event: ModelResponseEvent) -> dict[str, Any]:
    """What the tool handed the external system for the event's one call."""
    key = handed_key(event.function_calls[0].call_id)
    raw = await wait_for(lambda: redis.get(key), within=60)
    handed: dict[str, Any] = json.loads(raw)
    return handed


async def test_a_deferred_call_is_completed_after_the_worker_that_started_it_exited(
    fleet: LocalFleet, client: FleetClient, redis: Redis, bus: KafkaBus, settings: Settings
) -> None:
    ledger = Ledger(redis, Keys.of(settings))
    first = turn(("c1", "render_video", {"title": "launch"}))
    run, call_id = first.run_id, first.function_calls[0].call_id
    await client.submit(first)
    handed = await _handed(redis, first)

    async def deferred() -> bool:
        entry = (await ledger.read("acme", run, [call_id])).get(call_id)
        return entry is not None and entry.state == "deferred"

    await wait_for(deferred, within=60)
    starter = next(n for n in ("worker-0", "worker-1") if fleet.pid(n) == handed["pid"])
    assert fleet.terminate(starter) == 0  # it exits cleanly: it holds no call any more

    done = CompletionMessage(
        tenant_id="acme", handle=handed["handle"], output="rendered launch.mp4",
        completed_by="render-farm",
    )  # fmt: skip
    await bus.publish_and_wait("completions", run, done)
    result = await client.result(run, 0, within=60)
    assert result.status == "completed"
    assert result.outputs[0].output == "rendered launch.mp4"
    assert (result.calls[0].status, result.calls[0].effect) == ("succeeded", "applied")

    # The same completion again, and one with a forged handle: neither changes the call.
    again = done.model_copy(update={"output": "rendered twice"})
    text, _, mac = handed["handle"].partition(".")
    forged = done.model_copy(
        update={"handle": f"{text}.{'0' * len(mac)}", "output": "forged", "completed_by": "x"}
    )
    await bus.publish_and_wait("completions", run, again)
    await bus.publish_and_wait("completions", run, forged)

    # A second deferred call of the same run: its completion, on the same partition (keyed
    # by run), is taken after those two, so once its turn settles they were handled.
    second = turn(("c2", "render_video", {"title": "teaser"}), run_id=run).model_copy(
        update={"turn_id": 1}
    )
    await client.submit(second)
    later = await _handed(redis, second)
    assert later["pid"] != handed["pid"]  # the worker left is the one that runs it
    finish = done.model_copy(update={"handle": later["handle"], "output": "rendered teaser"})
    await bus.publish_and_wait("completions", run, finish)
    settled = await client.result(run, 1, within=60)
    assert settled.outputs[0].output == "rendered teaser"

    entry = (await ledger.read("acme", run, [call_id]))[call_id]
    assert entry.state == "committed"
    assert entry.outcome is not None and entry.outcome.output == "rendered launch.mp4"
    events = [e["event"] for e in await ledger.audit("acme", run, call_id)]
    assert events.count("started") == 1 and events.count("completed") == 1, events
    assert events.index("deferred") < events.index("completed")


async def test_an_overdue_completion_makes_the_effect_unknown_and_the_probe_settles_it(
    fleet: LocalFleet, client: FleetClient, redis: Redis, bus: KafkaBus, settings: Settings
) -> None:
    ledger = Ledger(redis, Keys.of(settings))
    event = turn(("c1", "render_video", {"title": "trailer", "within": 1}))
    run, call_id = event.run_id, event.function_calls[0].call_id
    await client.submit(event)
    handed = await _handed(redis, event)
    # The farm finished the job but never called back: the probe finds it.
    await redis.set(farm_key(handed["key"]), "done:rendered trailer.mp4")
    result = await client.result(run, 0, within=60)
    assert result.outputs[0].output == "rendered trailer.mp4"
    assert (result.calls[0].status, result.calls[0].effect) == ("succeeded", "applied")
    events = [e["event"] for e in await ledger.audit("acme", run, call_id)]
    assert events.index("deferred") < events.index("deferral_expired"), events
    assert any("probe" in e for e in events), events

    # The callback arrives at last: the call is settled already, and stays as it is.
    late = CompletionMessage(tenant_id="acme", handle=handed["handle"], output="late")
    await bus.publish_and_wait("completions", run, late)
    nudge = turn(("c2", "render_video", {"title": "nudge"}), run_id=run).model_copy(
        update={"turn_id": 1}
    )
    await client.submit(nudge)
    finish = late.model_copy(update={"handle": (await _handed(redis, nudge))["handle"]})
    await bus.publish_and_wait("completions", run, finish)
    assert (await client.result(run, 1, within=60)).outputs[0].output == "late"
    entry = (await ledger.read("acme", run, [call_id]))[call_id]
    assert entry.outcome is not None and entry.outcome.output == "rendered trailer.mp4"
    assert "completed" not in [e["event"] for e in await ledger.audit("acme", run, call_id)]


async def test_an_operator_completes_a_deferred_call_by_hand(
    fleet: LocalFleet, client: FleetClient, redis: Redis
) -> None:
    event = turn(("c1", "render_video", {"title": "poster"}))
    run, call_id = event.run_id, event.function_calls[0].call_id
    await client.submit(event)
    await _handed(redis, event)  # deferred: the farm has it, and never answers
    done = fleet.cli(
        "calls", "complete", call_id, "--tenant", "acme", "--run", run,
        "--output", "rendered by hand", "--by", "ops@example.com",
    )  # fmt: skip
    assert f"sent: completion of {call_id} (applied)" in done.stdout
    result = await client.result(run, 0, within=60)
    assert result.outputs[0].output == "rendered by hand"
    assert (result.calls[0].status, result.calls[0].effect) == ("succeeded", "applied")
    again = fleet.cli("calls", "complete", call_id, "--tenant", "acme", "--run", run,
                      "--by", "ops@example.com", check=False)  # fmt: skip
    assert again.returncode != 0 and "not deferred" in again.stderr
