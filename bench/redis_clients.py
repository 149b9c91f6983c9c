"""Which Redis client for a cluster: ``python -m bench.redis_clients`` (needs redis-server).

The ledger's hot path is small Lua scripts on one call's keys, issued by hundreds of calls at
once. This runs exactly that shape — EVALSHA of a begin-like script on a hash and a sorted set
of one slot group, then HGETALL of the hash — from C concurrent tasks against:

- toolfleet's auto-pipelining client (``kernel.adapters.redis``) on one redis-server;
- redis-py's plain asyncio client on the same server (no auto-pipelining);
- redis-py's asyncio ``RedisCluster`` on a local 3-master cluster;
- valkey-glide's ``GlideClusterClient`` on the same cluster (if installed: ``.[bench]``);
- toolfleet's client on each master of the cluster at once, keys routed by slot by the
  caller (what an auto-pipelining cluster client would do), for the ceiling.

It prints ops/s and p50/p99 per operation, measured in the same run, and each server's CPU
(INFO ``used_cpu_sys`` + ``used_cpu_user``) per operation, so the choice rests on numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from kernel.adapters.redis import connect_redis
from kernel.settings import Settings
from toolfleet.app.infra.redis import start_redis, stop_redis
from toolfleet.app.infra.redis_cluster import start_cluster, stop_cluster

# A begin-like step: read a few fields, write state, index the call in its group's set.
SCRIPT = """
local h = redis.call('HMGET', KEYS[1], 'state', 'token')
redis.call('HSET', KEYS[1], 'state', 'started', 'token', ARGV[1], 'worker', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[1], KEYS[1])
return h[1] or ''
"""
GROUPS = 64

Op = Callable[[int], Awaitable[Any]]


def _keys(i: int) -> tuple[str, str]:
    group = i % GROUPS
    return f"bench:{{g{group}}}:call:{i}", f"bench:{{g{group}}}:leases"


async def _drive(op: Op, total: int, concurrency: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    counter = iter(range(total))

    async def worker() -> None:
        for i in counter:
            began = time.perf_counter()
            await op(i)
            latencies.append(time.perf_counter() - began)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total / (time.perf_counter() - began), latencies


def _cpu(ports: list[int]) -> float:
    total = 0.0
    for port in ports:
        client = redis.Redis(port=port)
        info = client.info("cpu")
        total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        client.close()
    return total


async def _redis_py_ops(client: Any) -> Op:
    script = client.register_script(SCRIPT)

    async def op(i: int) -> Any:
        call, leases = _keys(i)
        await script(keys=[call, leases], args=[i, "w"])
        return await client.hgetall(call)

    return op


async def _glide_op(ports: list[int]) -> tuple[Op, Callable[[], Awaitable[None]]]:
    from glide import (  # type: ignore[import-not-found]
        GlideClusterClient,
        GlideClusterClientConfiguration,
        NodeAddress,
        Script,
    )

    config = GlideClusterClientConfiguration([NodeAddress("127.0.0.1", ports[0])])
    client = await GlideClusterClient.create(config)
    script = Script(SCRIPT)

    async def op(i: int) -> Any:
        call, leases = _keys(i)
        await client.invoke_script(script, keys=[call, leases], args=[str(i), "w"])
        return await client.hgetall(call)

    return op, client.close


async def _routed_op(masters: list[int]) -> tuple[Op, Callable[[], Awaitable[None]]]:
    """toolfleet's auto-pipelining client per master, each key sent to its slot's owner."""
    probe = redis.Redis(port=masters[0])
    owner: dict[int, int] = {}
    for low, high, node, *_ in probe.execute_command("CLUSTER", "SLOTS"):  # type: ignore[no-untyped-call]
        for slot in range(low, high + 1):
            owner[slot] = int(node[1])
    probe.close()
    clients = {
        port: connect_redis(Settings(redis_url=f"redis://127.0.0.1:{port}/0")) for port in masters
    }
    scripts = {port: c.register_script(SCRIPT) for port, c in clients.items()}

    async def op(i: int) -> Any:
        call, leases = _keys(i)
        port = owner[key_slot(call.encode())]
        await scripts[port](keys=[call, leases], args=[i, "w"])
        return await clients[port].hgetall(call)

    async def close() -> None:
        for c in clients.values():
            await c.aclose()

    return op, close


async def _measure(name: str, make: Any, ports: list[int], total: int, conc: int) -> str:
    op, close = await make()
    await _drive(op, min(2_000, total), conc)  # warm up: connections, script caches
    before = _cpu(ports)
    rate, latencies = await _drive(op, total, conc)
    cpu_us = (_cpu(ports) - before) / total * 1e6
    await close()
    latencies.sort()
    p50 = statistics.median(latencies) * 1e3
    p99 = latencies[int(len(latencies) * 0.99)] * 1e3
    return f"| {name} | {rate:,.0f} | {p50:.2f} | {p99:.2f} | {cpu_us:.0f} |"


async def main(total: int, concurrency: int) -> None:
    """Start a single redis-server and a 3-master cluster, measure, stop them."""
    state = Path(tempfile.mkdtemp(prefix="bench-redis-"))
    single = Settings(state_dir=state, redis_port=16479)
    cluster = Settings(state_dir=state, redis_cluster_masters=3, redis_cluster_port=17300)
    masters = [17300, 17301, 17302]
    start_redis(single)
    start_cluster(cluster)
    rows = []
    try:
        url = f"redis://127.0.0.1:{single.redis_port}/0"

        async def tf_single() -> tuple[Op, Any]:
            client = connect_redis(Settings(redis_url=url))
            return await _redis_py_ops(client), client.aclose

        async def plain_single() -> tuple[Op, Any]:
            client = aioredis.Redis.from_url(url, max_connections=concurrency)
            return await _redis_py_ops(client), client.aclose

        async def py_cluster() -> tuple[Op, Any]:
            client = RedisCluster(host="127.0.0.1", port=masters[0], max_connections=concurrency)
            await client.initialize()
            return await _redis_py_ops(client), client.aclose

        cases: list[tuple[str, Any, list[int]]] = [
            ("toolfleet auto-pipelining, 1 server", tf_single, [single.redis_port]),
            ("redis-py asyncio, 1 server", plain_single, [single.redis_port]),
            ("redis-py RedisCluster, 3 masters", py_cluster, masters),
        ]
        try:
            import glide  # type: ignore[import-not-found]  # noqa: F401

            cases.append(("valkey-glide cluster, 3 masters", lambda: _glide_op(masters), masters))
        except ImportError:
            print("valkey-glide not installed: pip install -e '.[bench]'", file=sys.stderr)
        cases.append(
            ("toolfleet auto-pipelining per master, 3 masters", lambda: _routed_op(masters),
             masters)
        )  # fmt: skip
        for name, make, ports in cases:
            print(f"measuring {name} ...", file=sys.stderr)
            rows.append(await _measure(name, make, ports, total, concurrency))
    finally:
        stop_cluster(cluster)
        stop_redis(single)
    print(f"{total:,} operations (EVALSHA + HGETALL), {concurrency} concurrent\n")
    print("| client | ops/s | p50 ms | p99 ms | Redis CPU µs/op (all servers) |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.redis_clients", description=__doc__)
    parser.add_argument("--ops", type=int, default=50_000)
    parser.add_argument("--concurrency", type=int, default=400)
    args = parser.parse_args()
    asyncio.run(main(args.ops, args.concurrency))
