"""Redis primaries with replicas: a failover right after ``started`` never lets a call run
twice, while no replica confirms nothing leaves for Kafka and nothing runs, and a ``started``
no replica confirmed never runs.

A private Redis Cluster (3 primaries, one replica each; its own ports and state dir) holds
the fleet's state. The test tools count their side effects on the session's Redis instead
(``TEST_SIDE_EFFECTS_URL``): the upstream a tool talks to outlives a failover of toolfleet's
state, and the counts must not be lost with the primary the test kills.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis
from redis.asyncio import Redis
from redis.crc import key_slot

from kernel.adapters.redis import connect_redis
from kernel.settings import Settings
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger
from tests.conftest import port_is_free, wait_for
from tests.integration.crash_tools import effects_key, holder_key
from tests.integration.test_pipeline import turn
from toolfleet.app.infra.redis_cluster import cluster_url, start_cluster, stop_cluster
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = [pytest.mark.integration, pytest.mark.own_cluster]

TOOLS = "tests.integration.crash_tools:tools"
WAIT_TIMEOUT_MS = 300
LEASE_S = 20
"""Longer than a failover (cluster-node-timeout 3 s, then an election): the worker's outcome
lands on the new primary while its lease still holds."""


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A running 3-primary cluster with a replica of each (settings of its nodes)."""
    base = next(
        b for b in range(24_000, 25_000, 10)
        if all(port_is_free(p) and port_is_free(p + 10_000) for p in range(b, b + 6))
    )  # fmt: skip
    state: Path = tmp_path_factory.mktemp("replicated")
    nodes = Settings(
        state_dir=state, redis_cluster_masters=3, redis_cluster_replicas=1, redis_cluster_port=base
    )
    start_cluster(nodes)
    try:
        yield nodes
    finally:
        stop_cluster(nodes)


@pytest.fixture(scope="module")
def fleet_settings(settings: Settings, replicated: Settings) -> Settings:
    """The session's settings, with the private cluster as the fleet's Redis."""
    return settings.model_copy(
        update={"redis_url": cluster_url(replicated), "redis_wait_timeout_ms": WAIT_TIMEOUT_MS}
    )


@pytest.fixture(scope="module")
def fleet(settings: Settings, fleet_settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    upstream = {"TEST_SIDE_EFFECTS_URL": settings.redis_address()}
    with LocalFleet(
        fleet_settings,
        tools=TOOLS,
        workers=1,
        worker_args=["--lease-s", str(LEASE_S)],
        extra_env=upstream,
    ) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, fleet_settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, fleet_settings) as fleet_client:
        yield fleet_client


@pytest.fixture
async def state(fleet_settings: Settings) -> AsyncIterator[Redis]:
    """toolfleet's client on the private cluster (the fleet's state)."""
    client = connect_redis(fleet_settings)
    yield client
    await client.aclose()


def _slot_nodes(replicated: Settings, key: str) -> tuple[int, list[int]]:
    """(primary port, replica ports) that serve ``key``'s slot now, by nodes that answer."""
    slot = key_slot(key.encode())
    for port in range(replicated.redis_cluster_port, replicated.redis_cluster_port + 6):
        node = redis.Redis(port=port, socket_connect_timeout=1)
        try:
            ranges = node.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
        except redis.RedisError:
            continue
        finally:
            node.close()
        primary = next(int(p[1]) for low, high, p, *_ in ranges if int(low) <= slot <= int(high))
        owner = redis.Redis(port=primary)
        try:  # replicas connected to it now (CLUSTER SLOTS learns of them by gossip, later)
            role = owner.execute_command("ROLE")  # type: ignore[no-untyped-call]
        finally:
            owner.close()
        return primary, [int(replica[1]) for replica in role[2]]
    raise AssertionError("no node of the private cluster answered CLUSTER SLOTS")


async def _model_responses(fleet: LocalFleet, result: str) -> float:
    """How many model responses the planner counts with ``result`` (its /metrics)."""
    port = fleet.metrics_port("planner")
    assert port is not None
    topic = fleet.settings.topic("model-responses")
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("toolfleet_messages_total{")
        and f'topic="{topic}"' in line
        and f'result="{result}"' in line
    )


def _pid(port: int) -> int:
    node = redis.Redis(port=port)
    try:
        return int(node.info("server")["process_id"])
    finally:
        node.close()


async def test_a_primary_killed_right_after_started_never_lets_the_call_run_twice(
    fleet: LocalFleet,
    client: FleetClient,
    redis: Redis,
    state: Redis,
    replicated: Settings,
) -> None:
    keys = Keys.of(fleet.settings)
    first_node = replicated.redis_cluster_port
    while True:  # a run whose primary is the first node: the one clients know first, too
        event = turn(("c0", "charge", {"amount": 7, "hold_ms": 1500}))
        call_id = event.function_calls[0].call_id
        primary, replicas = _slot_nodes(replicated, keys.call("acme", event.run_id, call_id))
        if primary == first_node:
            break
    assert replicas, "the call's primary has no replica"
    await client.submit(event)
    # The body runs: `started` was written and a replica acknowledged it. Kill the primary.
    await wait_for(lambda: redis.get(holder_key(call_id)), within=60)
    os.kill(_pid(primary), signal.SIGKILL)
    try:
        result = await result_of(fleet, client, event.run_id, within=120)
        new_primary, _ = _slot_nodes(replicated, keys.call("acme", event.run_id, call_id))
        print(f"primary {primary} killed; its replica {new_primary} took over")
        assert new_primary in replicas
        assert int(await redis.get(effects_key(call_id)) or 0) == 1
        assert (result.status, result.outputs[0].output) == ("completed", "charged 7")
        ledger = Ledger(state, keys)
        entry = (await ledger.read("acme", event.run_id, [call_id]))[call_id]
        assert entry.state in ("finished", "committed")
        events = [e["event"] for e in await ledger.audit("acme", event.run_id, call_id)]
        assert events.count("started") == 1, events
    finally:
        start_cluster(replicated)  # the killed node rejoins, as a replica of the new primary


async def test_while_no_replica_confirms_nothing_leaves_and_the_call_runs_once_they_do(
    fleet: LocalFleet,
    client: FleetClient,
    redis: Redis,
    replicated: Settings,
) -> None:
    """Replicas that stay connected but acknowledge nothing: the planner's plan is on the
    primary alone, so its command does not leave for Kafka (a failover could take the plan
    back and leave the command without one); the planner retries the model response. Once the
    replicas answer, the call runs, once."""
    event = turn(("c0", "charge", {"amount": 9}))
    call_id = event.function_calls[0].call_id
    keys = Keys.of(fleet.settings)
    _primary, replicas = _slot_nodes(replicated, keys.call("acme", event.run_id, call_id))
    stopped = [_pid(port) for port in replicas]

    async def planner_retried() -> bool:
        return await _model_responses(fleet, "retried") > 0

    for pid in stopped:  # the replicas stay connected but acknowledge nothing
        os.kill(pid, signal.SIGSTOP)
    try:
        await client.submit(event)
        await wait_for(planner_retried, within=60)
        assert await redis.get(holder_key(call_id)) is None, "the body ran"
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    result = await result_of(fleet, client, event.run_id, within=90)
    record = result.calls[0]
    assert (record.status, record.effect) == ("succeeded", "applied")
    assert int(await redis.get(effects_key(call_id)) or 0) == 1


async def test_a_started_no_replica_confirms_is_never_run_and_reported_unknown(
    fleet: LocalFleet,
    client: FleetClient,
    redis: Redis,
    state: Redis,
    replicated: Settings,
) -> None:
    """The plan and its command went out (replicas answering); then the call's replicas stop
    acknowledging before the worker writes ``started``. The WAIT after it times out, so the
    body never runs (a failover could take ``started`` back and let a second worker run the
    call); the call is reported failed with effect unknown (``UnreplicatedWriteError``), once
    the replicas answer again and the worker's outcome may leave."""
    event = turn(("c0", "charge", {"amount": 5}))
    call_id = event.function_calls[0].call_id
    keys = Keys.of(fleet.settings)
    _primary, replicas = _slot_nodes(replicated, keys.call("acme", event.run_id, call_id))
    assert replicas, "the call's primary has no replica"
    marker = "started not replicated"
    processed = await _model_responses(fleet, "processed")
    refusals = fleet.logs("worker-0").count(marker)
    worker = fleet.pid("worker-0")
    stopped = [_pid(port) for port in replicas]

    async def command_sent() -> bool:
        return await _model_responses(fleet, "processed") > processed

    os.kill(worker, signal.SIGSTOP)  # the command waits in Kafka, not yet begun
    try:
        await client.submit(event)
        await wait_for(command_sent, within=30)
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
    finally:
        os.kill(worker, signal.SIGCONT)

    async def worker_refused() -> bool:
        return fleet.logs("worker-0").count(marker) > refusals

    try:
        await wait_for(worker_refused, within=60)
        assert await redis.get(holder_key(call_id)) is None, "the body ran"
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    result = await result_of(fleet, client, event.run_id, within=90)
    record = result.calls[0]
    assert (record.status, record.effect) == ("failed", "unknown")
    assert record.error is not None and record.error.type == "UnreplicatedWriteError"
    assert await redis.get(holder_key(call_id)) is None, "the body ran"
    assert int(await redis.get(effects_key(call_id)) or 0) == 0
    events = [e["event"] for e in await Ledger(state, keys).audit("acme", event.run_id, call_id)]
    assert events.count("started") == 1, events
