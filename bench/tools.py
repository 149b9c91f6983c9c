"""The tools every benchmarked system runs: a no-op, a 50 ms sleep, and a hold for scenario (d).

Workers serve them with ``--tools bench.tools:tools``; the raw relay, Celery and the in-process
baseline call the same coroutine functions (``noop_body`` / ``sleep_body``) directly.

``bench_hold`` parks a call until the bench releases it, so that scenario (d) can keep
100,000 calls in flight at once. Each worker process runs one watcher task per hold key: it
publishes how many calls of that key are parked in this process (a Redis hash, field = pid)
and wakes them all when the bench sets the release key. One Redis round trip per process and
poll, whatever the number of parked calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field

from redis.asyncio import Redis

from executors import ToolRegistry

tools = ToolRegistry()

SLEEP_S = 0.05
"""What the I/O-bound tool waits, per call."""

HOLD_MAX_S = 600.0
"""A parked call is released after this long even if the bench never says so (safety net)."""


async def noop_body() -> str:
    """The no-op tool's body, shared with the baselines."""
    return "ok"


async def sleep_body() -> str:
    """The I/O-bound tool's body, shared with the baselines."""
    await asyncio.sleep(SLEEP_S)
    return "ok"


@tools.tool(effect="read_only", timeout=30.0)
async def bench_noop(query: str, i: int = 0) -> str:
    """Does nothing and answers ``ok``: what toolfleet costs per call, with no work in it."""
    return await noop_body()


@tools.tool(effect="read_only", timeout=30.0)
async def bench_sleep50(query: str, i: int = 0) -> str:
    """Waits 50 ms (an I/O-bound call: an HTTP request, a database query)."""
    return await sleep_body()


@tools.tool(effect="read_only", timeout=HOLD_MAX_S + 60.0)
async def bench_hold(key: str, i: int = 0) -> str:
    """Parks until the bench sets ``release_key(key)`` (scenario (d): calls in flight)."""
    hold = _Hold.of(key)
    hold.parked += 1
    try:
        await hold.released.wait()
    finally:
        hold.parked -= 1
    return "ok"


def parked_key(key: str) -> str:
    """Redis hash: worker pid -> number of calls of ``key`` parked in that process."""
    return f"bench:hold:{key}:parked"


def release_key(key: str) -> str:
    """Redis key the bench sets to release every parked call of ``key``."""
    return f"bench:hold:{key}:release"


@dataclass
class _Hold:
    key: str
    parked: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)
    watcher: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, key: str) -> _Hold:
        hold = _HOLDS.get(key)
        if hold is None:
            hold = _HOLDS[key] = cls(key)
            hold.watcher = asyncio.create_task(hold.watch())
        return hold

    async def watch(self, poll_s: float = 0.25) -> None:
        redis = Redis.from_url(os.environ["REDIS_URL"])
        began = time.monotonic()
        pid = str(os.getpid())
        try:
            while not self.released.is_set():
                async with redis.pipeline(transaction=False) as pipe:
                    pipe.hset(parked_key(self.key), pid, self.parked)
                    pipe.expire(parked_key(self.key), 3600)
                    pipe.exists(release_key(self.key))
                    *_, released = await pipe.execute()
                if released or time.monotonic() - began > HOLD_MAX_S:
                    self.released.set()
                    break
                await asyncio.sleep(poll_s)  # the poll period of a cross-process signal
        finally:
            with contextlib.suppress(Exception):
                await redis.hset(parked_key(self.key), pid, 0)
            await redis.aclose()


_HOLDS: dict[str, _Hold] = {}
