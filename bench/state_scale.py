"""(f) State scale: the same load on one Redis and on 3 shards: python -m bench.state_scale.

One fleet (planner, aggregator, reconciler, ``--workers`` workers) runs five-call turns of the
no-op tool, ``--window`` calls outstanding, for ``--seconds``; first with a single Redis as its
state, then with a local 3-master Redis Cluster (the same ``redis-server``, the same durable
settings). Each Redis node's CPU (INFO ``used_cpu_sys`` + ``used_cpu_user``) is read before
and after the window, so every figure is Redis's own cost per call, whatever the fleet's speed.

Printed: calls/s, Redis CPU µs per call on every node and on the busiest one, and the ceiling
the busiest node implies for the whole fleet (one core per node: 10^6 / busiest µs per call);
then the ratio busiest-of-3 / single, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from kernel.adapters.topics import ensure_topics
from kernel.settings import Settings
from schemas import AgentRef, ModelResponseEvent
from toolfleet.app import infra
from toolfleet.app.infra.redis_cluster import (
    cluster_ports,
    cluster_url,
    start_cluster,
    stop_cluster,
)
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client

CALLS_PER_TURN = 5
CLUSTER_PORT = 26_000


@dataclass(frozen=True)
class Row:
    """One layout's figures over its window."""

    layout: str
    calls: int
    seconds: float
    cpu_us_per_call: dict[int, float]
    """Redis node port -> its CPU microseconds per call of the fleet."""

    @property
    def busiest(self) -> float:
        """CPU µs per call of the node that worked hardest."""
        return max(self.cpu_us_per_call.values())

    def line(self) -> str:
        """The row in the printed table."""
        nodes = " / ".join(f"{v:.0f}" for v in self.cpu_us_per_call.values())
        return (
            f"| {self.layout} | {self.calls / self.seconds:,.0f} | {nodes} | {self.busiest:.0f} "
            f"| {1e6 / self.busiest:,.0f} |"
        )


def _cpu(ports: Sequence[int]) -> dict[int, float]:
    """CPU seconds each Redis node has used so far."""
    used = {}
    for port in ports:
        node = redis.Redis(port=port)
        try:
            info = node.info("cpu")
        finally:
            node.close()
        used[port] = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return used


def _turn(i: int) -> ModelResponseEvent:
    run = f"scale-{uuid.uuid4().hex[:10]}"
    return ModelResponseEvent(
        tenant_id="bench", run_id=run, turn_id=0, agent=AgentRef(name="bench"),
        response_id=f"resp-{i}",
        items=[{"type": "function_call", "call_id": f"{run}-{c}", "name": "bench_noop",
                "arguments": f'{{"query": "x", "i": {c}}}'} for c in range(CALLS_PER_TURN)],
    )  # fmt: skip


async def _load(client: FleetClient, window: int, seconds: float) -> int:
    """Keep ``window`` calls outstanding for ``seconds``; the calls completed."""
    deadline = time.monotonic() + seconds
    done = 0

    async def sender() -> None:
        nonlocal done
        i = 0
        while time.monotonic() < deadline:
            result = await client.run_turn(_turn(i), within=120)
            assert result.status == "completed", result
            done += CALLS_PER_TURN
            i += 1

    await asyncio.gather(*(sender() for _ in range(max(1, window // CALLS_PER_TURN))))
    return done


async def _measure(layout: str, settings: Settings, ports: Sequence[int], args: Any) -> Row:
    settings = settings.model_copy(update={"topic_prefix": f"scale-{uuid.uuid4().hex[:6]}."})
    await ensure_topics(settings)
    with LocalFleet(settings, tools="bench.tools:tools", workers=args.workers) as fleet:
        async with connected_client(fleet, settings) as client:
            await _load(client, args.window, args.warmup)
            before, began = _cpu(ports), time.monotonic()
            calls = await _load(client, args.window, args.seconds)
            elapsed, after = time.monotonic() - began, _cpu(ports)
    per_call = {port: (after[port] - before[port]) / calls * 1e6 for port in ports}
    return Row(layout, calls, elapsed, per_call)


async def _run(args: Any) -> None:
    base = Settings()
    infra.up(base)
    single = await _measure("single Redis", base, [base.redis_port], args)
    nodes = Settings(
        state_dir=Path(tempfile.mkdtemp(prefix="toolfleet-scale-")),
        redis_cluster_masters=3,
        redis_cluster_port=CLUSTER_PORT,
    )
    start_cluster(nodes)
    try:
        sharded = base.model_copy(update={"redis_url": cluster_url(nodes)})
        three = await _measure("3 shards", sharded, cluster_ports(nodes), args)
    finally:
        stop_cluster(nodes)
    print(f"{CALLS_PER_TURN}-call turns of the no-op tool, {args.window} calls outstanding, "
          f"{args.workers} workers, {args.seconds:g} s per layout:\n")  # fmt: skip
    print(
        "| state | calls/s | Redis CPU µs per call, per node | busiest | fleet ceiling, calls/s |"
    )
    print("|---|---|---|---|---|")
    print(single.line())
    print(three.line())
    ratio = three.busiest / single.busiest
    print(f"\nbusiest of 3 shards / single Redis: {ratio:.0%} of the CPU per call; "
          f"the fleet's ceiling {1 / ratio:.1f}x")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.state_scale", description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--window", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    asyncio.run(_run(parser.parse_args()))
