"""A cut-off instance lets go: a planner that cannot reach Redis while its peer can gives up
its partitions after a bounded time, the peer plans every turn, and it rejoins once Redis is
back (seen before: two instances left against a Redis that had gone away held their
partitions and retried forever, and every turn on those partitions stalled)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from kernel.settings import Settings
from tests.conftest import wait_for
from tests.integration.proxy import Proxy
from tests.integration.test_pipeline import turn
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client, result_of

# The cut-off proxy stands in front of one Redis server: the single-Redis pass runs it.
pytestmark = [pytest.mark.integration, pytest.mark.single_redis]


@pytest.fixture(scope="module")
async def proxy(settings: Settings) -> AsyncIterator[tuple[Proxy, int]]:
    host, port = settings.redis_address().removeprefix("redis://").split("/")[0].split(":")
    running = Proxy(host, int(port))
    yield running, await running.start()
    await running.stop()


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str], proxy: tuple[Proxy, int]) -> Iterator[LocalFleet]:
    env = {"TOOLFLEET_CUT_OFF_AFTER_S": "3", "TOOLFLEET_SESSION_TIMEOUT_MS": "6000"}
    with LocalFleet(
        settings, tools="tests.integration.fleet_tools:tools", workers=1, extra_env=env
    ) as running:
        # A second planner whose Redis goes through the proxy.
        running.extra_env["REDIS_URL"] = f"redis://127.0.0.1:{proxy[1]}/0"
        running.start("planner-cut", ["planner"])
        running.extra_env.pop("REDIS_URL")
        yield running
        # Not stopped with the others: once rejoined, its Redis calls through the proxy time
        # out and it does not finish a SIGTERM within the stop's 20 s (not what this test is
        # about; see the notes of the observability issue). Killed, as its pod would be.
        running.kill("planner-cut")


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


@pytest.mark.timeout(300)
async def test_a_planner_cut_off_from_redis_gives_up_its_partitions_and_rejoins(
    fleet: LocalFleet, client: FleetClient, proxy: tuple[Proxy, int]
) -> None:
    cut = proxy[0]

    async def owns_some() -> bool:  # both planners share the group's partitions
        return "model-responses:" in _assignments(fleet.logs("planner-cut"))

    await wait_for(owns_some, within=60)
    cut.sever()
    # Turns on every partition: those the cut-off planner holds stall until it lets go.
    events = [turn(("a", "sleep_then_echo", {"text": f"t{i}"})) for i in range(12)]
    for event in events:
        await client.submit(event)
    for i, event in enumerate(events):
        result = await result_of(fleet, client, event.run_id, within=120)
        assert result.outputs[0].output == f"t{i}"
    assert "giving up its partitions" in fleet.logs("planner-cut")
    cut.heal()

    async def rejoined() -> bool:
        return "reachable again: rejoining" in fleet.logs("planner-cut")

    await wait_for(rejoined, within=120)
    fleet.check()  # the cut-off planner did not exit: it waited and came back
    again = turn(("b", "sleep_then_echo", {"text": "after"}))
    assert (await client.run_turn(again, within=60)).outputs[0].output == "after"


def _assignments(log: str) -> str:
    """The latest assignment the planner logged ('' before its first)."""
    lines = [line for line in log.splitlines() if '"consumer assignment"' in line]
    return lines[-1] if lines else ""
