"""(f) State scale: the same load on one Redis and on 3 shards.

``python -m bench`` runs it as scenario ``f`` (its rows and two targets in the report);
``python -m bench.state_scale`` runs it alone and prints its tables.

Bench (a)'s rows, turns of 1, 5 and 20 calls of the no-op tool (its load generator,
``--window`` calls outstanding, ``--workers`` workers with as many slots), each measured for
``--seconds``: first with one redis-server as the fleet's state, then with a 3-master Redis
Cluster, both started here for this measurement alone (the same ``redis-server``, the same
durable settings as ``toolfleet infra up``'s) on ports of their own (``SINGLE_PORT``,
``CLUSTER_PORT`` up), and stopped after. Each node's CPU (INFO ``used_cpu_sys`` +
``used_cpu_user``) and commands (INFO commandstats: the commands scripts run included, the
bench's own INFO / CLUSTER / PING not) are read when the window opens and after it closes, so
every figure is Redis's own work per call, whatever the fleet's speed.

Two shards' CPU is not comparable on two shared cores, so what is compared is what scales: the
busiest shard's share of the fleet's commands per call (target: at most 40%), and the shards'
summed CPU per call against the single Redis's (target: at most 1.2x).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import redis

from bench.procs import REPO, progress
from bench.report import SCRIPT_COMMANDS, ShardRow, shard_pairs, shard_targets
from bench.systems import RunContext, toolfleet
from bench.workload import TurnFactory, closed_loop, prime, query_args
from kernel.settings import Settings
from toolfleet.app import infra
from toolfleet.app.infra.redis import start_redis, stop_redis
from toolfleet.app.infra.redis_cluster import (
    cluster_ports,
    cluster_url,
    start_cluster,
    stop_cluster,
)

CLUSTER_PORT = 26_000
"""First port of (f)'s 3-master cluster (cluster bus 10,000 above); the shared test cluster
is at 27,000."""
SINGLE_PORT = 26_010
"""Port of (f)'s single redis-server."""
HOME = REPO / ".artifacts" / "bench-state-scale"
"""Where (f)'s servers keep their files (git-ignored); emptied before each start."""

NOT_THE_FLEETS = frozenset({
    "info", "ping", "cluster", "command", "client", "hello", "config", "readonly", "readwrite",
    "select", "auth",
})  # fmt: skip
"""Commands (and the parents of subcommands, ``cluster|slots``) that are the bench's readings
or a client's connection set-up, not the fleet's work."""


@dataclass(frozen=True)
class Load:
    """(a)'s load as (f) applies it."""

    workers: int = 2
    window: int = 1600
    """Calls outstanding, and each worker's slots."""
    calls: tuple[int, ...] = (1, 5, 20)
    """Calls per turn, one row each."""
    warmup: float = 3.0
    seconds: float = 20.0
    commands: bool = False
    """Also print each node's costliest commands (``--commands``)."""

    def describe(self) -> str:
        """The load in the report's words."""
        return (
            f"{self.window:,} calls outstanding, {self.workers} workers, "
            f"{self.seconds:g} s per row after {self.warmup:g} s of warm-up"
        )


class _Reading(NamedTuple):
    """What a Redis node has used and handled so far."""

    cpu_s: float
    system_s: float
    """The kernel's part of ``cpu_s``."""
    reads: int
    """``total_reads_processed``."""
    commands: int
    """The fleet's commands (``NOT_THE_FLEETS`` left out)."""
    scripts: int
    """Script calls."""


def _read(
    ports: Sequence[int], costs: dict[int, dict[str, tuple[int, float]]] | None = None
) -> dict[int, _Reading]:
    """Each Redis node's reading now; ``costs`` also gets each node's commandstats."""
    found = {}
    for port in ports:
        node = redis.Redis(port=port)
        try:
            info = node.info("cpu") | node.info("stats")
            stats = node.info("commandstats")
        finally:
            node.close()
        spent = {
            str(name).removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"]))
            for name, v in stats.items()
            if isinstance(v, dict)
        }
        if costs is not None:
            costs[port] = spent
        system = float(info["used_cpu_sys"])
        found[port] = _Reading(
            cpu_s=system + float(info["used_cpu_user"]),
            system_s=system,
            reads=int(info["total_reads_processed"]),
            commands=sum(n for c, (n, _) in spent.items() if c.split("|")[0] not in NOT_THE_FLEETS),
            scripts=sum(n for c, (n, _) in spent.items() if c in SCRIPT_COMMANDS),
        )
    return found


class _NodeMeter:
    """Reads every node when closed_loop opens its window and when it closes it."""

    def __init__(self, ports: Sequence[int]) -> None:
        self.ports = ports
        self.before: dict[int, _Reading] = {}
        self.after: dict[int, _Reading] = {}
        self._costs: dict[int, dict[str, tuple[int, float]]] = {}
        self._costs_after: dict[int, dict[str, tuple[int, float]]] = {}

    def start(self) -> None:
        self.before = _read(self.ports, self._costs)

    def stop(self) -> dict[str, float]:
        self.after = _read(self.ports, self._costs_after)
        return {}

    def per_call(self, field: str, calls: int, scale: float = 1.0) -> dict[int, float]:
        """Node -> the growth of one ``_Reading`` field over the window, per call."""
        if not calls:
            return dict.fromkeys(self.ports, float("nan"))
        return {
            port: (getattr(self.after[port], field) - getattr(self.before[port], field))
            / calls
            * scale
            for port in self.ports
        }

    def print_commands(self, label: str, calls: int) -> None:
        """Each node's costliest commands over the window, per call."""
        for port in self.ports:
            before = self._costs[port]
            spent = {
                name: (n - before.get(name, (0, 0.0))[0], us - before.get(name, (0, 0.0))[1])
                for name, (n, us) in self._costs_after[port].items()
            }
            top = sorted(spent.items(), key=lambda item: -item[1][1])[:8]
            print(f"{label}, node {port}: " + ", ".join(
                f"{name} {n / calls:.2f}/call {us / calls:.1f} µs" for name, (n, us) in top
            ))  # fmt: skip


async def _measure(
    layout: str, ctx: RunContext, ports: Sequence[int], load: Load
) -> list[ShardRow]:
    """(a)'s rows on one state layout, with each Redis node read around each window."""
    rows = []
    name = "f-" + ("shards" if len(ports) > 1 else "single")
    async with toolfleet(ctx, name, load.workers, load.window) as system:
        for calls_per_turn in load.calls:
            meter = _NodeMeter(ports)
            factory = TurnFactory(ctx.tenant, "bench_noop", calls_per_turn, query_args)
            await prime(system.target, factory, check=system.check)
            result = await closed_loop(
                system.target,
                factory,
                window=max(4, load.window // calls_per_turn),
                warmup_s=load.warmup,
                measure_s=load.seconds,
                check=system.check,
                meter=meter,
            )
            if load.commands:
                meter.print_commands(f"{calls_per_turn}-call turns, {layout}", result.calls)
            row = ShardRow(
                layout=layout,
                calls_per_turn=calls_per_turn,
                calls=result.calls,
                seconds=result.seconds,
                cpu_us_per_call=meter.per_call("cpu_s", result.calls, 1e6),
                sys_us_per_call=meter.per_call("system_s", result.calls, 1e6),
                reads_per_call=meter.per_call("reads", result.calls),
                commands_per_call=meter.per_call("commands", result.calls),
                scripts_per_call=meter.per_call("scripts", result.calls),
            )
            rows.append(row)
            progress(
                f"(f) {layout:<12} {calls_per_turn:>2} calls/turn: {row.calls_per_s:,.0f} "
                f"calls/s; per call, node by node: {_nodes(row.commands_per_call.values(), '.1f')} "
                f"commands, {_nodes(row.cpu_us_per_call.values())} µs of Redis CPU"
            )
    return rows


@contextmanager
def _state_at(ctx: RunContext, url: str) -> Iterator[RunContext]:
    """``ctx`` whose systems use the Redis at ``url`` as their state, while inside."""
    before = ctx.services_redis_url
    ctx.services_redis_url = url
    try:
        yield ctx
    finally:
        ctx.services_redis_url = before


def _servers(home: Path) -> tuple[Settings, Settings]:
    """(f)'s single server and its cluster, each with its own state directory under ``home``."""
    single = Settings(state_dir=home / "single", redis_port=SINGLE_PORT, redis_url=None)
    nodes = Settings(
        state_dir=home / "cluster",
        redis_url=None,
        redis_cluster_masters=3,
        redis_cluster_replicas=0,
        redis_cluster_port=CLUSTER_PORT,
    )
    return single, nodes


def _fresh(home: Path) -> tuple[Settings, Settings]:
    """Stop what a run that was killed left running under ``home``; empty it."""
    single, nodes = _servers(home)
    stop_redis(single)
    stop_cluster(nodes)
    shutil.rmtree(home, ignore_errors=True)
    return single, nodes


async def measure(ctx: RunContext, load: Load, home: Path = HOME) -> list[ShardRow]:
    """(f)'s rows: ``load`` on one redis-server, then on a 3-master cluster (both started here
    and stopped after); the single server's rows first."""
    single, nodes = await asyncio.to_thread(_fresh, home)
    await asyncio.to_thread(start_redis, single)
    try:
        with _state_at(ctx, single.redis_address()):
            rows = await _measure("single Redis", ctx, [SINGLE_PORT], load)
    finally:
        await asyncio.to_thread(stop_redis, single)
    await asyncio.to_thread(start_cluster, nodes)
    try:
        with _state_at(ctx, cluster_url(nodes)):
            rows += await _measure("3 shards", ctx, cluster_ports(nodes), load)
    finally:
        await asyncio.to_thread(stop_cluster, nodes)
    await asyncio.to_thread(shutil.rmtree, home, ignore_errors=True)
    return rows


def _nodes(values: Iterable[float], form: str = ".0f") -> str:
    return " / ".join(format(v, form) for v in values)


def _print(rows: list[ShardRow], load: Load) -> None:
    pairs = shard_pairs(rows)
    print(f"Turns of the no-op tool, {load.describe()}:\n")
    print(
        "| calls/turn | state | calls/s | commands per call, per node | script calls per call, "
        "per node | Redis CPU µs per call, per node | all nodes | busiest "
        "| fleet ceiling, calls/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in (r for pair in pairs for r in pair):
        print(
            f"| {row.calls_per_turn} | {row.layout} | {row.calls_per_s:,.0f} "
            f"| {_nodes(row.commands_per_call.values(), '.1f')} "
            f"| {_nodes(row.scripts_per_call.values(), '.2f')} "
            f"| {_nodes(row.cpu_us_per_call.values())} | {row.summed:.0f} | {row.busiest:.0f} "
            f"| {1e6 / row.busiest:,.0f} |"
        )
    print()
    for one, three in pairs:
        ratio = three.busiest / one.busiest
        print(
            f"{one.calls_per_turn}-call turns: busiest of 3 shards / single Redis {ratio:.0%} "
            f"of the CPU per call; the fleet's ceiling {1 / ratio:.1f}x; the 3 shards "
            f"together {three.summed / one.summed:.2f}x the single Redis's CPU per call; "
            f"the busiest shard does {three.busiest_command_share:.0%} of the commands"
        )
    print()
    for target in shard_targets(rows):
        print(f"{target.name}: {'held' if target.held else 'missed'} ({target.detail})")
    print(
        "\nWhere each node's CPU per call goes: system time (the kernel: socket reads and "
        "writes, the append-only file's fsync) and user time, and read events per call (one "
        "per client connection per event-loop pass with bytes to read):\n"
    )
    print(
        "| calls/turn | state | system µs per call, per node | all nodes "
        "| user µs per call, per node | all nodes | read events per call, per node |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in (r for pair in pairs for r in pair):
        system = list(row.sys_us_per_call.values())
        user = [row.cpu_us_per_call[p] - row.sys_us_per_call[p] for p in row.cpu_us_per_call]
        print(
            f"| {row.calls_per_turn} | {row.layout} | {_nodes(system)} | {sum(system):.0f} "
            f"| {_nodes(user)} | {sum(user):.0f} | {_nodes(row.reads_per_call.values(), '.2f')} |"
        )


async def _run(load: Load) -> None:
    base = Settings()
    infra.up(base)  # Kafka (and the shared Redis the run's clean-up looks at)
    ctx = RunContext(base, REPO / "bench" / "results")
    try:
        rows = await measure(ctx, load)
    finally:
        await ctx.cleanup()  # topics; the servers' keys went with the servers
    _print(rows, load)


def main() -> None:
    """``python -m bench.state_scale``: (f) alone, its tables on stdout."""
    parser = argparse.ArgumentParser(prog="python -m bench.state_scale", description=__doc__)
    parser.add_argument("--workers", type=int, default=Load.workers)
    parser.add_argument(
        "--calls",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=Load.calls,
        help="calls per turn, one row each (default 1,5,20, as bench (a))",
    )
    parser.add_argument("--window", type=int, default=Load.window, help="calls outstanding")
    parser.add_argument("--seconds", type=float, default=Load.seconds)
    parser.add_argument("--warmup", type=float, default=Load.warmup)
    parser.add_argument(
        "--commands", action="store_true", help="also print each node's costliest commands"
    )
    args = parser.parse_args()
    load = Load(args.workers, args.window, args.calls, args.warmup, args.seconds, args.commands)
    asyncio.run(_run(load))


if __name__ == "__main__":
    main()
