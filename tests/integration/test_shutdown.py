"""Health and shutdown as a platform sees them: ``/livez``, ``/readyz`` and SIGTERM.

A worker terminated under load (as Kubernetes stops a pod) stops taking commands, lets its
running calls finish, commits its offsets and exits 0: no call is lost and none runs twice.
``/readyz`` follows the service's dependencies: 503 while Redis is away (behind a proxy the
test cuts), 200 once it is back; ``/livez`` answers 200 throughout.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from kernel.settings import Settings
from tests.integration.crash_tools import effects_key
from tests.integration.proxy import Proxy
from tests.integration.test_pipeline import turn
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client

pytestmark = [pytest.mark.integration, pytest.mark.single_redis]

TOOLS = "tests.integration.crash_tools:tools"


def _status(url: str) -> tuple[int, dict[str, bool]]:
    """The status and, for the health endpoints, the JSON body of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    return status, json.loads(body) if body.startswith(b"{") else {}


async def _until(url: str, code: int, within: float = 30.0) -> dict[str, bool]:
    deadline = time.monotonic() + within
    while True:
        status, body = await asyncio.to_thread(_status, url)
        if status == code:
            return body
        assert time.monotonic() < deadline, f"{url} stayed {status} {body}, not {code}"
        await asyncio.sleep(0.2)  # wait-ok: polling interval of a deadline-bounded wait


# --- /readyz follows Redis ----------------------------------------------------------------
@pytest.fixture
async def proxied(settings: Settings) -> AsyncIterator[tuple[Proxy, Settings]]:
    host, port = settings.redis_address().removeprefix("redis://").split("/")[0].split(":")
    proxy = Proxy(host, int(port))
    own_port = await proxy.start()
    yield proxy, settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{own_port}/0"})
    await proxy.stop()


async def test_readyz_is_503_while_redis_is_down_and_200_after_it_returns(
    proxied: tuple[Proxy, Settings], topics: list[str]
) -> None:
    proxy, settings = proxied
    with LocalFleet(settings, tools=TOOLS, workers=0) as fleet:
        base = f"http://127.0.0.1:{await _served(fleet, 'planner')}"
        ready = await _until(f"{base}/readyz", 200, within=60)
        assert ready == {"ready": True, "kafka": True, "redis": True, "assigned": True,
                         "serving": True}  # fmt: skip
        proxy.sever()
        down = await _until(f"{base}/readyz", 503)
        assert down["redis"] is False and down["kafka"] is True
        assert (await asyncio.to_thread(_status, f"{base}/livez"))[0] == 200  # alive meanwhile
        proxy.heal()
        await _until(f"{base}/readyz", 200, within=60)
        assert (await asyncio.to_thread(_status, f"{base}/nowhere"))[0] == 404


async def _served(fleet: LocalFleet, name: str, within: float = 30.0) -> int:
    deadline = time.monotonic() + within
    while (port := fleet.metrics_port(name)) is None:
        assert time.monotonic() < deadline, f"{name} never served its endpoints"
        await asyncio.sleep(0.1)  # wait-ok: polling interval of a deadline-bounded wait
    return port


# --- SIGTERM under load -------------------------------------------------------------------
@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    with LocalFleet(settings, tools=TOOLS, workers=2) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


async def test_a_worker_terminated_under_load_loses_no_call_and_runs_none_twice(
    fleet: LocalFleet, client: FleetClient, redis: Redis
) -> None:
    await fleet.ready()
    prefix = uuid.uuid4().hex[:8]
    events = [
        turn(("c", "charge", {"amount": n, "hold_ms": 300}), run_id=f"term-{prefix}-{n}")
        for n in range(40)
    ]
    for event in events:
        await client.submit(event)
    call_ids = [e.function_calls[0].call_id for e in events]

    async def done() -> int:
        return sum([int(await redis.get(effects_key(c)) or 0) for c in call_ids])

    deadline = time.monotonic() + 60
    while await done() < 5:  # under load: calls running on both workers
        assert time.monotonic() < deadline, "the calls never started"
        await asyncio.sleep(0.05)  # wait-ok: polling interval of a deadline-bounded wait
    code = await asyncio.to_thread(fleet.terminate, "worker-0")
    assert code == 0  # stopped taking work, finished what it ran, committed, exited cleanly
    results = [await client.result(e.run_id, 0, within=90) for e in events]
    assert [r.status for r in results] == ["completed"] * len(events)
    assert [r.outputs[0].output for r in results] == [f"charged {n}" for n in range(40)]
    effects = [int(await redis.get(effects_key(c)) or 0) for c in call_ids]
    assert effects == [1] * len(events)  # none lost, none run twice
    fleet.start_worker(0)  # the module's fleet, whole again
