"""(g) What an idle agent-runtime replica pays for others' traffic: python -m bench.idle_client.

A fleet runs ``--turns`` one-call turns for one busy client. Beside it, two observers sit on
the same ``turn-results`` topic in processes of their own, submitting nothing:

- ``routed``: a ``FleetClient`` (it passes other clients' results over by key, undecoded);
- ``decode-all``: a consumer that decodes every result, as every client did before routing.

Printed: each observer's CPU over the run (seconds, and the share of one core), its RSS, and
the results it decoded, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from functools import partial

import psutil
from aiokafka import AIOKafkaConsumer, TopicPartition

from kernel.adapters.topics import ensure_topics
from kernel.settings import Settings
from schemas import AgentRef, ModelResponseEvent, TurnResult
from toolfleet import FleetClient
from toolfleet.app import infra
from toolfleet.testing import LocalFleet, connected_client

WINDOW = 200


async def _observe(mode: str, settings: Settings) -> None:
    """Run one observer until stdin closes; on each line of stdin, print its figures."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    if mode == "routed":
        async with FleetClient(settings) as client:
            print("ready", flush=True)
            while await reader.readline():
                await _until(lambda: _caught_up(client))
                print(json.dumps({"decoded": client.decoded, "held": client.held()}), flush=True)
        return
    topic = settings.topic("turn-results")
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_servers(), isolation_level="read_committed"
    )
    await consumer.start()
    partitions = [TopicPartition(topic, p) for p in range(settings.partitions_of("turn-results"))]
    consumer.assign(partitions)
    await consumer.seek_to_end(*partitions)
    kept: dict[tuple[str, int], TurnResult] = {}

    async def read() -> None:
        async for record in consumer:
            result = TurnResult.decode(record.value or b"")
            kept[(result.run_id, result.turn_id)] = result  # what clients used to keep

    task = asyncio.create_task(read())
    print("ready", flush=True)
    while await reader.readline():
        ends = await consumer.end_offsets(partitions)

        await _until(partial(_read_to, consumer, ends))
        print(json.dumps({"decoded": len(kept), "held": [0, len(kept)]}), flush=True)
    task.cancel()
    await consumer.stop()


async def _caught_up(client: FleetClient) -> bool:
    return await client.lag() == 0


async def _read_to(consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int]) -> bool:
    for tp, end in ends.items():
        if await consumer.position(tp) < end:
            return False
    return True


async def _until(check: Callable[[], Awaitable[bool]]) -> None:
    while not await check():  # noqa: ASYNC110 (a bench probe polls another process's state)
        await asyncio.sleep(0.05)  # wait-ok: polling interval


def _spawn(mode: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.idle_client", "--observe", mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def _turn(i: int) -> ModelResponseEvent:
    run = f"idle-bench-{uuid.uuid4().hex[:10]}"
    return ModelResponseEvent(
        tenant_id="bench", run_id=run, turn_id=0, agent=AgentRef(name="bench"),
        response_id=f"resp-{i}",
        items=[{"type": "function_call", "call_id": f"{run}-0", "name": "bench_noop",
                "arguments": '{"query": "x"}'}],
    )  # fmt: skip


async def _run(turns: int) -> None:
    base = Settings()
    infra.up(base)
    settings = base.model_copy(update={"topic_prefix": f"idle-{uuid.uuid4().hex[:6]}."})
    await ensure_topics(settings)  # the observers start reading before the fleet runs
    env = LocalFleet(settings, tools="bench.tools:tools").env()
    observers = {mode: _spawn(mode, env) for mode in ("routed", "decode-all")}
    with LocalFleet(settings, tools="bench.tools:tools", workers=2) as fleet:
        async with connected_client(fleet, settings) as client:
            for proc in observers.values():
                assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            cpu = {m: psutil.Process(p.pid).cpu_times() for m, p in observers.items()}
            began = time.monotonic()
            pending = iter(range(turns))

            async def sender() -> None:
                for i in pending:
                    await client.run_turn(_turn(i), within=120)

            await asyncio.gather(*(sender() for _ in range(WINDOW)))
            elapsed = time.monotonic() - began
            rows = []
            for mode, proc in observers.items():
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write("report\n")
                proc.stdin.flush()
                figures = json.loads(proc.stdout.readline())
                now = psutil.Process(proc.pid)
                used = sum(now.cpu_times()[:2]) - sum(cpu[mode][:2])
                rss = now.memory_info().rss / 2**20
                rows.append(
                    f"| {mode} | {used:.2f} | {used / elapsed:.1%} | {rss:.0f} | "
                    f"{figures['decoded']:,} | {figures['held']} |"
                )
            for proc in observers.values():
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(timeout=30)
    print(f"{turns:,} one-call turns for one busy client in {elapsed:.1f} s "
          f"({turns / elapsed:,.0f} turns/s); two idle observers beside it:\n")  # fmt: skip
    print("| observer | CPU s | share of a core | RSS MiB | results decoded | held |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.idle_client", description=__doc__)
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--observe", choices=["routed", "decode-all"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.observe:
        asyncio.run(_observe(args.observe, Settings()))
    else:
        asyncio.run(_run(args.turns))
