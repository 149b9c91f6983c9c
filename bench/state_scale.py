"""(f) State scale: the same load on one Redis and on 3 shards: python -m bench.state_scale.

Bench (a)'s rows, turns of 1, 5 and 20 calls of the no-op tool (its load generator,
``--window`` calls outstanding, ``--workers`` workers with as many slots), each measured for
``--seconds``: first with a single Redis as the fleet's state, then with a local 3-master
Redis Cluster (the same ``redis-server``, the same durable settings). Each Redis node's CPU
(INFO ``used_cpu_sys`` + ``used_cpu_user``) is read when the window opens and after it
closes, so every figure is Redis's own cost per call, whatever the fleet's speed.

Printed: calls/s, Redis CPU µs per call on every node and on the busiest one, and the ceiling
the busiest node implies for the whole fleet (one core per node: 10^6 / busiest µs per call);
then the ratio busiest-of-3 / single, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import redis

from bench.systems import RunContext, toolfleet
from bench.workload import TurnFactory, closed_loop, prime, query_args
from kernel.settings import Settings
from toolfleet.app import infra
from toolfleet.app.infra.redis_cluster import (
    cluster_ports,
    cluster_url,
    start_cluster,
    stop_cluster,
)

CLUSTER_PORT = 26_000


@dataclass(frozen=True)
class Row:
    """One layout's figures over its window."""

    layout: str
    calls_per_turn: int
    calls: int
    seconds: float
    cpu_us_per_call: dict[int, float]
    """Redis node port -> its CPU microseconds per call of the fleet."""
    sys_us_per_call: dict[int, float]
    """The kernel's part of it (system time: socket reads and writes, the AOF's fsyncs)."""
    reads_per_call: dict[int, float]
    """Read events the node handled per call (``total_reads_processed``): one per client
    connection per event-loop pass that found bytes to read."""

    @property
    def busiest(self) -> float:
        """CPU µs per call of the node that worked hardest."""
        return max(self.cpu_us_per_call.values())

    def line(self) -> str:
        """The row in the printed table."""
        nodes = _nodes(self.cpu_us_per_call.values())
        return (
            f"| {self.calls_per_turn} | {self.layout} | {self.calls / self.seconds:,.0f} | {nodes} "
            f"| {self.busiest:.0f} "
            f"| {1e6 / self.busiest:,.0f} |"
        )


class _Reading(NamedTuple):
    """What a Redis node has used and handled so far."""

    cpu_s: float
    system_s: float
    """The kernel's part of ``cpu_s``."""
    reads: int
    """``total_reads_processed``."""


def _cpu(ports: Sequence[int]) -> dict[int, _Reading]:
    """Each Redis node's reading now."""
    used = {}
    for port in ports:
        node = redis.Redis(port=port)
        try:
            info = node.info("cpu") | node.info("stats")
        finally:
            node.close()
        system = float(info["used_cpu_sys"])
        used[port] = _Reading(
            system + float(info["used_cpu_user"]), system, int(info["total_reads_processed"])
        )
    return used


def _commands(ports: Sequence[int]) -> dict[int, dict[str, tuple[int, float]]]:
    """Each node's commands so far: name -> (calls, microseconds), as INFO commandstats says
    (the commands scripts run are counted too)."""
    stats = {}
    for port in ports:
        node = redis.Redis(port=port)
        try:
            info = node.info("commandstats")
        finally:
            node.close()
        stats[port] = {
            str(name).removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"]))
            for name, v in info.items()
        }
    return stats


async def _measure(layout: str, ctx: RunContext, ports: Sequence[int], args: Any) -> list[Row]:
    """Bench (a)'s rows (turns of ``args.calls`` calls, the same load generator and worker
    flags) on one state layout, with each Redis node's CPU read around each window."""
    rows = []
    async with toolfleet(ctx, layout.replace(" ", "-"), args.workers, args.window) as system:
        for calls_per_turn in args.calls:
            meter = _NodeMeter(ports)
            factory = TurnFactory(ctx.tenant, "bench_noop", calls_per_turn, query_args)
            await prime(system.target, factory, check=system.fleet.check)
            result = await closed_loop(
                system.target,
                factory,
                window=max(1, args.window // calls_per_turn),
                warmup_s=args.warmup,
                measure_s=args.seconds,
                check=system.fleet.check,
                meter=meter,
            )

            if args.commands:
                meter.print_commands(f"{calls_per_turn}-call turns, {layout}", result.calls)
            rows.append(
                Row(
                    layout, calls_per_turn, result.calls, result.seconds,
                    meter.per_call("cpu_s", result.calls, 1e6),
                    meter.per_call("system_s", result.calls, 1e6),
                    meter.per_call("reads", result.calls, 1.0),
                )
            )  # fmt: skip
    return rows


class _NodeMeter:
    """Reads every node when closed_loop opens its window and when it closes it."""

    def __init__(self, ports: Sequence[int]) -> None:
        self.ports = ports
        self.cpu_before: dict[int, _Reading] = {}
        self.cpu_after: dict[int, _Reading] = {}
        self._commands: dict[int, dict[str, tuple[int, float]]] = {}
        self._commands_after: dict[int, dict[str, tuple[int, float]]] = {}

    def start(self) -> None:
        self.cpu_before, self._commands = _cpu(self.ports), _commands(self.ports)

    def per_call(self, field: str, calls: int, scale: float) -> dict[int, float]:
        """Node -> the growth of one ``_Reading`` field over the window, per call."""
        return {
            port: (getattr(self.cpu_after[port], field) - getattr(self.cpu_before[port], field))
            / calls
            * scale
            for port in self.ports
        }

    def stop(self) -> dict[str, float]:
        self.cpu_after, self._commands_after = _cpu(self.ports), _commands(self.ports)
        return {}

    def print_commands(self, label: str, calls: int) -> None:
        """Each node's costliest commands over the window, per call."""
        for port in self.ports:
            before = self._commands[port]
            spent = {
                name: (n - before.get(name, (0, 0.0))[0], us - before.get(name, (0, 0.0))[1])
                for name, (n, us) in self._commands_after[port].items()
            }
            top = sorted(spent.items(), key=lambda item: -item[1][1])[:8]
            print(f"{label}, node {port}: " + ", ".join(
                f"{name} {n / calls:.2f}/call {us / calls:.1f} µs" for name, (n, us) in top
            ))  # fmt: skip


async def _run(args: Any) -> None:
    base = Settings()
    infra.up(base)
    results = Path(tempfile.mkdtemp(prefix="toolfleet-scale-"))
    single_ctx = RunContext(base, results)
    try:
        single = await _measure("single Redis", single_ctx, [base.redis_port], args)
    finally:
        await single_ctx.cleanup()
    nodes = Settings(
        state_dir=results / "cluster", redis_cluster_masters=3, redis_cluster_port=CLUSTER_PORT
    )
    start_cluster(nodes)
    sharded_ctx = RunContext(base, results, services_redis_url=cluster_url(nodes))
    try:
        three = await _measure("3 shards", sharded_ctx, cluster_ports(nodes), args)
    finally:
        await sharded_ctx.cleanup()  # topics; the cluster's keys go with the cluster
        stop_cluster(nodes)
    print(f"Turns of the no-op tool, {args.window} calls outstanding, {args.workers} workers, "
          f"{args.seconds:g} s per row:\n")  # fmt: skip
    print(
        "| calls/turn | state | calls/s | Redis CPU µs per call, per node | busiest "
        "| fleet ceiling, calls/s |"
    )
    print("|---|---|---|---|---|---|")
    for one, sharded in zip(single, three, strict=True):
        print(one.line())
        print(sharded.line())
    print()
    for one, sharded in zip(single, three, strict=True):
        ratio = sharded.busiest / one.busiest
        summed = sum(sharded.cpu_us_per_call.values()) / one.busiest
        print(f"{one.calls_per_turn}-call turns: busiest of 3 shards / single Redis {ratio:.0%} "
              f"of the CPU per call; the fleet's ceiling {1 / ratio:.1f}x; the 3 shards "
              f"together {summed:.2f}x the single Redis's CPU per call")  # fmt: skip
    print(
        "\nWhere each node's CPU per call goes: system time (the kernel: socket reads and "
        "writes, the append-only file's fsync) and user time, and read events per call (one "
        "per client connection per event-loop pass with bytes to read):\n"
    )
    # Summed as well as per node: a shard's share is compared with the whole single server.
    print(
        "| calls/turn | state | system µs per call, per node | all nodes "
        "| user µs per call, per node | all nodes | read events per call, per node |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in (r for pair in zip(single, three, strict=True) for r in pair):
        system = list(row.sys_us_per_call.values())
        user = [row.cpu_us_per_call[p] - row.sys_us_per_call[p] for p in row.cpu_us_per_call]
        print(
            f"| {row.calls_per_turn} | {row.layout} | {_nodes(system)} | {sum(system):.0f} "
            f"| {_nodes(user)} | {sum(user):.0f} | {_nodes(row.reads_per_call.values(), '.2f')} |"
        )


def _nodes(values: Iterable[float], form: str = ".0f") -> str:
    return " / ".join(format(v, form) for v in values)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.state_scale", description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--calls",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 5, 20],
        help="calls per turn, one row each (default 1,5,20, as bench (a))",
    )
    parser.add_argument("--window", type=int, default=1600, help="calls outstanding")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument(
        "--commands", action="store_true", help="also print each node's costliest commands"
    )
    asyncio.run(_run(parser.parse_args()))
