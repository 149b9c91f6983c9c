"""(h) Fairness: a light tenant's turn latency beside a heavy tenant: python -m bench.fairness.

A fleet (one planner, aggregator, reconciler, ``--workers`` workers with ``--slots`` each)
serves a 50 ms tool. The light tenant runs one-call turns one at a time, first on the idle
fleet, then while a heavy tenant keeps ``--backlog`` calls outstanding (more than the fleet's
slots, so its calls wait in admission); both in one run. Printed: the light tenant's p50 /
p95 / p99 in each phase, their ratio, and the heavy tenant's throughput meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

from kernel.adapters.topics import ensure_topics
from kernel.settings import Settings
from schemas import AgentRef, ModelResponseEvent
from toolfleet.app import infra
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client

TOOL_MS = 50


def _turn(tenant: str, calls: int) -> ModelResponseEvent:
    run = f"fair-{uuid.uuid4().hex[:10]}"
    return ModelResponseEvent(
        tenant_id=tenant, run_id=run, turn_id=0, agent=AgentRef(name="bench"),
        response_id=f"resp-{run}",
        items=[{"type": "function_call", "call_id": f"{run}-{i}", "name": "bench_sleep50",
                "arguments": '{"query": "x"}'} for i in range(calls)],
    )  # fmt: skip


def _percentiles(samples: list[float]) -> tuple[float, float, float]:
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49] * 1000, cuts[94] * 1000, cuts[98] * 1000


async def _light(client: FleetClient, turns: int) -> list[float]:
    latencies = []
    for _ in range(turns):
        began = time.perf_counter()
        result = await client.run_turn(_turn("light", 1), within=120)
        assert result.status == "completed", result
        latencies.append(time.perf_counter() - began)
    return latencies


async def _heavy(client: FleetClient, backlog: int, stop: asyncio.Event) -> int:
    done = 0

    async def sender() -> None:
        nonlocal done
        while not stop.is_set():
            result = await client.run_turn(_turn("heavy", 10), within=300)
            assert result.status == "completed", result
            done += 10

    await asyncio.gather(*(sender() for _ in range(backlog // 10)))
    return done


async def _run(args: Any) -> None:
    base = Settings()
    infra.up(base)
    settings = base.model_copy(update={"topic_prefix": f"fair-{uuid.uuid4().hex[:6]}."})
    await ensure_topics(settings)
    worker_args = ["--concurrency", str(args.slots)]
    with LocalFleet(
        settings, tools="bench.tools:tools", workers=args.workers, worker_args=worker_args
    ) as fleet:
        async with connected_client(fleet, settings) as client:
            await _light(client, 5)  # warm
            idle = await _light(client, args.turns)
            stop = asyncio.Event()
            heavy = asyncio.create_task(_heavy(client, args.backlog, stop))
            await asyncio.sleep(2.0)  # wait-ok: the heavy tenant's backlog builds up first
            began = time.perf_counter()
            loaded = await _light(client, args.turns)
            elapsed = time.perf_counter() - began
            stop.set()
            heavy_calls = await heavy
    slots = args.workers * args.slots
    print(f"{args.workers} workers x {args.slots} slots ({slots} in all), a {TOOL_MS} ms tool; "
          f"the heavy tenant keeps {args.backlog} calls outstanding:\n")  # fmt: skip
    print("| light tenant, one-call turns | p50 ms | p95 ms | p99 ms |")
    print("|---|---|---|---|")
    for label, samples in (("idle fleet", idle), ("beside the heavy tenant", loaded)):
        p50, p95, p99 = _percentiles(samples)
        print(f"| {label} ({len(samples)} turns) | {p50:.0f} | {p95:.0f} | {p99:.0f} |")
    ratio50 = _percentiles(loaded)[0] / _percentiles(idle)[0]
    ratio99 = _percentiles(loaded)[2] / _percentiles(idle)[2]
    print(
        f"\nbeside the heavy tenant / idle: p50 {ratio50:.2f}x, p99 {ratio99:.2f}x; "
        f"the heavy tenant ran about {heavy_calls / (elapsed + 2):,.0f} calls/s meanwhile"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slots", type=int, default=20)
    parser.add_argument("--backlog", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=100)
    asyncio.run(_run(parser.parse_args()))
