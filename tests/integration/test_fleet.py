"""The fleet under stress: limits across processes, a worker SIGKILLed mid-call, metrics."""

from __future__ import annotations

import asyncio
import random
import re
import socket
import urllib.request
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from redis.asyncio import Redis

from kernel.adapters.topics import command_topic
from kernel.settings import Settings
from kernel.stores.admission import Admission, Limits
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger
from schemas import TurnResult
from tests.conftest import aggregator_caught_up, wait_for
from tests.integration.crash_tools import effects_key, holder_key
from tests.integration.side_effects import in_flight_keys
from tests.integration.test_pipeline import outputs, turn
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = pytest.mark.integration

TOOLS = "tests.integration.crash_tools:tools"
WORKERS = 3
PER_WORKER, PER_TENANT, PER_TOOL = 4, 5, 3


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    limits = ["--concurrency", str(PER_WORKER), "--lease-s", "2"]
    with LocalFleet(settings, tools=TOOLS, workers=WORKERS, worker_args=limits) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


async def _peak(redis: Redis, scope: str) -> int:
    return int(await redis.get(in_flight_keys(scope)[1]) or 0)


async def test_concurrency_limits_hold_across_worker_processes(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    # Set live, as an operator would (`toolfleet tenants set`, `toolfleet tools limit`).
    admission = Admission(redis, keys)
    await admission.set_limits("tenants", "acme", Limits(max_concurrency=PER_TENANT))
    await admission.set_limits("tools", "tracked", Limits(max_concurrency=PER_TOOL))
    try:
        await _run_limited_turns(fleet, client, redis)
    finally:
        await admission.set_limits("tenants", "acme", Limits())
        await admission.set_limits("tools", "tracked", Limits())


async def _run_limited_turns(fleet: LocalFleet, client: FleetClient, redis: Redis) -> None:
    tag = uuid.uuid4().hex[:8]  # counters of this test only (Redis outlives test sessions)
    for tool, scope in (("tracked", f"tool-{tag}"), ("tracked_free", f"tenant-{tag}")):
        events = [turn(*((f"c{i}", tool, {"scope": scope, "ms": 300}) for i in range(4)))
                  for _ in range(4)]  # fmt: skip
        await asyncio.gather(*(client.submit(e) for e in events))
        results = await asyncio.gather(*(result_of(fleet, client, e.run_id) for e in events))
        assert {r.status for r in results} == {"completed"}
    tool_peak, tenant_peak = await _peak(redis, f"tool-{tag}"), await _peak(redis, f"tenant-{tag}")
    worker_peaks = [
        await _peak(redis, f"worker:{socket.gethostname()}-{fleet.pid(f'worker-{n}')}")
        for n in range(WORKERS)
    ]
    print(f"peaks: tool {tool_peak}/{PER_TOOL}, tenant {tenant_peak}/{PER_TENANT}, "
          f"workers {worker_peaks}/{PER_WORKER}")  # fmt: skip
    assert tool_peak == PER_TOOL  # reached, never exceeded
    assert tenant_peak == PER_TENANT
    assert worker_peaks and max(worker_peaks) <= PER_WORKER


async def test_a_call_runs_at_most_once_while_a_worker_is_sigkilled_mid_run(
    fleet: LocalFleet, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    events = [
        turn(*((f"c{i}", "charge", {"amount": i, "hold_ms": 1500}) for i in range(5)))
        for _ in range(3)
    ]
    call_ids = [c.call_id for e in events for c in e.function_calls]
    for event in events:
        await client.submit(event)

    async def a_holder() -> str | None:
        for call_id in call_ids:
            holder = await redis.get(holder_key(call_id))
            if holder:
                return holder.decode()
        return None

    victim_pid = int((await wait_for(a_holder, within=60)).rsplit("-", 1)[1])
    victim = next(f"worker-{n}" for n in range(WORKERS) if fleet.pid(f"worker-{n}") == victim_pid)
    fleet.kill(victim)
    fleet.start_worker(int(victim.rsplit("-", 1)[1]))

    results = [await result_of(fleet, client, e.run_id, within=90) for e in events]
    records = {c.call_id: c for r in results for c in r.calls}
    effects = {cid: int(await redis.get(effects_key(cid)) or 0) for cid in call_ids}
    # Started on the victim, by the ledger (which records the worker at ``started``): a call
    # can be started there and killed before its body wrote the holder key.
    ledger = Ledger(redis, keys)
    entries = {}
    for e in events:
        entries |= await ledger.read("acme", e.run_id, [c.call_id for c in e.function_calls])
    killed = {cid for cid, e in entries.items() if (e.worker_id or "").endswith(f"-{victim_pid}")}
    print(f"{len(killed)} calls were on the killed worker; effects: {sorted(effects.values())}")
    assert killed
    assert all(n <= 1 for n in effects.values()), "a call's side effect ran twice"
    for cid in call_ids:
        if cid in killed:
            # Started, then its worker vanished: unknown, and never run again blindly.
            assert (records[cid].status, records[cid].effect) == ("failed", "unknown")
            assert effects[cid] == 0
        else:
            assert (records[cid].status, records[cid].effect, effects[cid]) == (
                "succeeded", "applied", 1,
            )  # fmt: skip


async def test_every_service_serves_metrics(fleet: LocalFleet, client: FleetClient) -> None:
    # A call of its own, so that the metrics a call creates exist whichever tests ran before.
    result = await client.run_turn(turn(("c0", "tracked_free", {"scope": "metrics", "ms": 1})))
    assert result.status == "completed", result.model_dump_json()
    expected = {
        "planner": ["toolfleet_commands_total", "toolfleet_plan_duration_seconds"],
        "aggregator": ["toolfleet_turn_duration_seconds", "toolfleet_messages_total"],
        "reconciler": ["toolfleet_messages_total"],
        "workers": [
            "toolfleet_calls_in_flight",
            "toolfleet_outcomes_total",
            "toolfleet_call_duration_seconds",
        ],
    }
    for service, names in expected.items():
        # A restarted worker may not have run a call yet: the pool's metrics together count.
        members = [f"worker-{n}" for n in range(WORKERS)] if service == "workers" else [service]
        texts = [
            await asyncio.to_thread(_get, f"http://127.0.0.1:{fleet.metrics_port(m)}/metrics")
            for m in members
        ]
        for name in names:
            assert any(re.search(rf"^{name}", t, re.MULTILINE) for t in texts), (
                f"{service} lacks {name}"
            )


async def test_every_service_reports_its_consumer_lag_and_build(
    fleet: LocalFleet, client: FleetClient, settings: Settings
) -> None:
    prefix = settings.topic_prefix
    groups = {
        "planner": f"{prefix}planner",
        "aggregator": f"{prefix}aggregator",
        "reconciler": f"{prefix}reconciler",
        "worker-0": f"{prefix}workers.{fleet.pool}",
    }
    for member, group in groups.items():
        port = fleet.metrics_port(member)

        async def lags(port: int | None = port, group: str = group) -> list[Sample]:
            return [
                s
                for s in await _samples(port, "toolfleet_consumer_lag")
                if s.labels["group"] == group
            ]

        # Sampled every few seconds, once the consumer has fetched each partition it owns.
        for sample in await wait_for(lags, within=60, interval=1):
            topic = sample.labels["topic"]
            assert topic.startswith(prefix), (member, topic)
            partitions = settings.partitions_of(topic.removeprefix(prefix))
            assert 0 <= int(sample.labels["partition"]) < partitions
            assert sample.value >= 0
        (build,) = await _samples(port, "toolfleet_build_info")
        service = f"worker-{fleet.pool}" if member.startswith("worker") else member
        assert (build.labels["service"], build.value) == (service, 1)
        assert await _samples(port, "process_resident_memory_bytes")

    # The pool's workers together report every partition of its topic, each once.
    pool_group = f"{prefix}workers.{fleet.pool}"
    every = [str(p) for p in range(settings.partitions_of(command_topic(fleet.pool)))]

    async def pool_reports_every_partition() -> bool:
        owned = [
            s.labels["partition"]
            for n in range(WORKERS)
            for s in await _samples(fleet.metrics_port(f"worker-{n}"), "toolfleet_consumer_lag")
            if s.labels["group"] == pool_group
        ]
        return sorted(owned) == sorted(every)

    await wait_for(pool_reports_every_partition, within=60, interval=1)


async def _samples(port: int | None, name: str) -> list[Sample]:
    """The samples called ``name`` a process serves on /metrics (none while it has no port)."""
    if port is None:
        return []
    text = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


async def test_a_hundred_turns_of_five_calls_with_random_durations(
    fleet: LocalFleet, client: FleetClient
) -> None:
    rng = random.Random(7)
    events = [
        turn(*((f"c{i}", "tracked_free", {"scope": "bulk", "ms": rng.randint(0, 40)})
               for i in range(5)))
        for _ in range(100)
    ]  # fmt: skip
    await asyncio.gather(*(client.submit(e) for e in events))
    results = await asyncio.gather(*(result_of(fleet, client, e.run_id) for e in events))
    assert len(results) == 100
    for event, result in zip(events, results, strict=True):
        assert result.status == "completed"
        assert [o.call_id for o in result.outputs] == [c.call_id for c in event.function_calls]
        assert outputs(result) == [(f"c{i}", "ok") for i in range(5)]


async def _records(settings: Settings, topic: str) -> list[bytes]:
    """Every committed record of a topic, from the beginning to its current end."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_servers(), isolation_level="read_committed"
    )
    await consumer.start()
    try:
        name = settings.topic(topic)
        partitions = [TopicPartition(name, p) for p in range(settings.partitions)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        values: list[bytes] = []
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            batch = await consumer.getmany(timeout_ms=500)
            values += [r.value for records in batch.values() for r in records]
        return values
    finally:
        await consumer.stop()


async def test_an_aggregator_killed_mid_stream_loses_nothing_and_emits_no_duplicate(
    fleet: LocalFleet, client: FleetClient, settings: Settings
) -> None:
    events = [
        turn(*((f"c{i}", "tracked_free", {"scope": "agg", "ms": 30}) for i in range(3)))
        for _ in range(60)
    ]
    for event in events[:30]:
        await client.submit(event)
    first = await result_of(fleet, client, events[0].run_id)
    fleet.kill("aggregator")  # mid-stream: later turns of the first half are still open
    fleet.start("aggregator", ["aggregator"])
    for event in events[30:]:
        await client.submit(event)
    results = [first] + [await result_of(fleet, client, e.run_id, within=120) for e in events[1:]]
    assert {r.status for r in results} == {"completed"}
    await wait_for(lambda: aggregator_caught_up(settings), within=60)
    ours = {e.run_id for e in events}
    records = await _records(settings, "turn-results")
    emitted = Counter(TurnResult.model_validate_json(v).run_id for v in records)
    assert {run: emitted[run] for run in ours} == dict.fromkeys(ours, 1)
