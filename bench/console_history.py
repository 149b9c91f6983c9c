"""The console's history at scale: python -m bench.console_history (``make bench-console``).

Loads ``--turns`` turns (100,000 by default) of history for 5 tenants straight through the
history store (``kernel.stores.history.History.put``, many writes in flight at once, so the
client pipelines them): runs of 10 turns, 1-3 calls each of 12 tools in up to 3 versions,
a few failures, unknown effects and interrupted turns, and an approval decision on 3% of
turns, spread over the last 6 days. The store is a redis-server of the bench's own (its
port, its files under ``.artifacts/bench-console-history``, AOF as ``toolfleet infra up``
runs it), stopped at the end; Kafka is the local broker, under a topic prefix of this run's
own (deleted at the end).

Then ``toolfleet console`` runs as a process of its own (uvicorn, the real HTTP API, an API
token), and ``--requests`` requests (one at a time, after a warm-up) are timed from the bench
process for each of: the newest page of one tenant; of every tenant (an admin's page,
merging 5 tenants); two facets of one tenant paged 5 deep by cursor; a rare three-facet
combination (walks within its budget); a run's view; ``/api/recent``. Prints p50 / p95 /
max per request kind, the console's RSS (after the load, after the requests, and its peak)
and Redis's memory, and writes them to ``bench/results/console-history.md`` (``--out``).
Target: p95 under 300 ms for the search pages and the run view.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import hashlib
import json
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

from bench.procs import REPO, child_env, peak_rss_bytes, progress, rss_bytes, spawn, terminate
from kernel.adapters.redis import connect_redis
from kernel.adapters.topics import ensure_topics
from kernel.settings import Settings
from kernel.stores.door import Stores
from kernel.stores.history import History, decision_entry, turn_entry
from schemas import ApprovalDecision, TurnResult
from toolfleet.app import infra
from toolfleet.app.infra.redis import start_redis, stop_redis

OUT = REPO / "bench" / "results" / "console-history.md"
HOME = REPO / ".artifacts" / "bench-console-history"
TENANTS = ("acme", "globex", "initech", "umbrella", "hooli")
WEIGHTS = (40, 25, 15, 12, 8)
TOOLS = [f"tool-{i}" for i in range(12)]
DECIDERS = ("alice", "bob", "carol", "dave", "erin")
TOKEN = "bench-console-token"
TURNS_PER_RUN = 10
TARGET_MS = 300.0


def _tokens() -> str:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    return json.dumps([{"name": "bench", "sha256": digest, "role": "admin", "tenants": ["*"]}])


@dataclass(frozen=True)
class Loaded:
    """What was loaded: the runs (tenant, run id), and how long it took."""

    runs: list[tuple[str, str]]
    turns: int
    decisions: int
    seconds: float


def _turn(rng: random.Random, tenant: str, run: str, turn_id: int) -> TurnResult:
    calls, outputs, interruptions = [], [], []
    status = rng.choices(["completed", "failed", "interrupted", "cancelled"], [90, 5, 3, 2])[0]
    for n in range(rng.randint(1, 3)):
        call_id = f"{run}-{turn_id}-{n}"
        tool = TOOLS[min(int(rng.expovariate(0.35)), len(TOOLS) - 1)]
        if status == "interrupted" and n == 0:
            interruptions.append({"call_id": call_id, "tool_name": tool, "arguments": "{}"})
            continue
        call_status, effect = rng.choices(
            [("succeeded", "applied"), ("failed", "not_executed"), ("timed_out", "unknown")],
            [95, 4, 1],
        )[0]
        started = 1.0 + rng.random()
        calls.append(
            {
                "call_id": call_id, "tool_name": tool, "status": call_status, "effect": effect,
                "attempts": 1 if call_status == "succeeded" else rng.randint(1, 3),
                "started_at": started, "finished_at": started + rng.random() / 10,
            }
        )  # fmt: skip
        outputs.append({"call_id": call_id, "output": f"{tool} said {rng.random():.6f}"})
    return TurnResult.model_validate(
        {
            "tenant_id": tenant, "run_id": run, "turn_id": turn_id, "status": status,
            "calls": calls, "outputs": outputs, "interruptions": interruptions,
        }
    )  # fmt: skip


async def load(history: History, turns: int, seed: int = 7) -> Loaded:
    """Write ``turns`` turns (and their decisions) through the store, newest last."""
    rng = random.Random(seed)
    now = time.time()
    span = 6 * 86_400.0
    runs: list[tuple[str, str]] = []
    pending: list[Awaitable[object]] = []
    decisions = 0
    started = time.perf_counter()
    for i in range(turns):
        if i % TURNS_PER_RUN == 0:
            tenant = rng.choices(TENANTS, WEIGHTS)[0]
            runs.append((tenant, f"run-{len(runs):06d}-{uuid.uuid4().hex[:6]}"))
        tenant, run = runs[-1]
        at = now - span + span * i / turns
        result = _turn(rng, tenant, run, i % TURNS_PER_RUN)
        versions = {c.call_id: str(1 + zlib.crc32(c.tool_name.encode()) % 3) for c in result.calls}
        pending.append(history.put(turn_entry(result, at=at, versions=versions)))
        if rng.random() < 0.03 and result.calls:
            call = result.calls[0]
            decision = ApprovalDecision(
                tenant_id=tenant, run_id=run, call_id=call.call_id, tool_name=call.tool_name,
                approve=rng.random() < 0.8, decided_by=rng.choice(DECIDERS),
            )  # fmt: skip
            pending.append(history.put(decision_entry(decision, at=at + 0.001)))
            decisions += 1
        if len(pending) >= 2_000:
            await asyncio.gather(*pending)
            pending.clear()
            progress(f"loaded {i + 1:,} turns")
    await asyncio.gather(*pending)
    return Loaded(runs, turns, decisions, time.perf_counter() - started)


@dataclass(frozen=True)
class Timed:
    """Latencies of one kind of request."""

    name: str
    ms: list[float]
    note: str = ""

    def row(self) -> str:
        """Its table row."""
        q = statistics.quantiles(self.ms, n=100, method="inclusive")
        return (
            f"| {self.name} | {len(self.ms)} | {q[49]:.1f} | {q[94]:.1f} | {max(self.ms):.1f} "
            f"| {self.note} |"
        )

    @property
    def p95(self) -> float:
        """95th percentile, ms."""
        return statistics.quantiles(self.ms, n=100, method="inclusive")[94]


Request = Callable[[httpx.AsyncClient, random.Random], Awaitable[httpx.Response]]


async def _time(
    http: httpx.AsyncClient, name: str, request: Request, count: int, rng: random.Random
) -> Timed:
    for _ in range(10):  # warm-up: connections, scripts, caches
        (await request(http, rng)).raise_for_status()
    ms: list[float] = []
    looked: list[int] = []
    for _ in range(count):
        started = time.perf_counter()
        answer = await request(http, rng)
        ms.append((time.perf_counter() - started) * 1000)
        answer.raise_for_status()
        body = answer.json()
        if "looked" in body:
            looked.append(int(body["looked"]))
    note = f"{statistics.mean(looked):,.0f} index entries looked at" if looked else ""
    progress(f"{name}: p95 {statistics.quantiles(ms, n=100)[94]:.1f} ms")
    return Timed(name, ms, note)


def _requests(runs: list[tuple[str, str]]) -> list[tuple[str, Request]]:
    async def newest(http: httpx.AsyncClient, rng: random.Random) -> httpx.Response:
        return await http.get("/api/history", params={"tenant": "acme", "limit": 50})

    async def every_tenant(http: httpx.AsyncClient, rng: random.Random) -> httpx.Response:
        return await http.get("/api/history", params={"limit": 50})

    deep: dict[str, str | None] = {"cursor": None, "depth": "0"}

    async def two_facets(http: httpx.AsyncClient, rng: random.Random) -> httpx.Response:
        # tool and a call's status, followed 5 pages deep by cursor, then from the top again
        params: dict[str, str | int] = {
            "tenant": "globex", "tool": "tool-1", "call_status": "succeeded", "limit": 50,
        }  # fmt: skip
        if deep["cursor"]:
            params["cursor"] = deep["cursor"]
        answer = await http.get("/api/history", params=params)
        depth = int(deep["depth"] or 0) + 1
        deep["cursor"] = answer.json()["cursor"] if depth < 5 else None
        deep["depth"] = str(depth % 5)
        return answer

    async def rare(http: httpx.AsyncClient, rng: random.Random) -> httpx.Response:
        params: dict[str, str | int] = {
            "tenant": "acme", "tool": rng.choice(TOOLS[:6]), "effect": "unknown",
            "call_status": "timed_out", "limit": 50,
        }  # fmt: skip
        return await http.get("/api/history", params=params)

    async def run_view(http: httpx.AsyncClient, rng: random.Random) -> httpx.Response:
        tenant, run = rng.choice(runs)
        return await http.get(f"/api/runs/{tenant}/{run}")

    async def recent(http: httpx.AsyncClient, rng: random.Random) -> httpx.Response:
        return await http.get("/api/recent", params={"limit": 200})

    return [
        ("search: newest page of one tenant (50)", newest),
        ("search: newest page of every tenant (admin, 5 tenants merged)", every_tenant),
        ("search: tool + call status, 5 pages deep by cursor", two_facets),
        ("search: three facets that rarely meet (bounded walk)", rare),
        ("run view (10 turns, its calls, outputs, decisions)", run_view),
        ("/api/recent (200 turns from the history)", recent),
    ]


async def _console(settings: Settings, log: Path) -> tuple[str, subprocess.Popen[bytes]]:
    env = child_env(settings, TOOLFLEET_CONSOLE_TOKENS=_tokens(), TOOLFLEET_LOG_LEVEL="WARNING")
    argv = [sys.executable, "-m", "toolfleet", "console", "--port", "0"]
    out = log.open("wb")
    popen = spawn(argv, env, out)
    deadline = time.monotonic() + 60
    url = ""
    while not url:
        printed = await asyncio.to_thread(log.read_text)
        if popen.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the console did not start: {printed[-2000:]}")
        for line in printed.splitlines():
            if line.startswith("console: "):
                url = line.removeprefix("console: ").split("?")[0].rstrip("/")
        await asyncio.sleep(0.1)  # wait-ok: polling the console's log for its URL
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        while (await http.get("/healthz")).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the console never became healthy")
            await asyncio.sleep(0.1)  # wait-ok: polling its health probe
    return url, popen


def _free_port(start: int) -> int:
    for port in range(start, start + 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port from {start}")


async def main(argv: list[str] | None = None) -> None:
    """Load, serve, measure, report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)

    shared = infra.up(Settings())  # the local Kafka broker (and Redis, unused here)
    port = _free_port(26_200)
    shutil.rmtree(HOME, ignore_errors=True)
    HOME.mkdir(parents=True)
    own = Settings(state_dir=HOME, redis_port=port, redis_url=None)
    await asyncio.to_thread(start_redis, own)
    settings = Settings(
        kafka_bootstrap_servers=shared.env()["KAFKA_BOOTSTRAP_SERVERS"],
        redis_url=f"redis://127.0.0.1:{port}/0",
        topic_prefix=f"bench-history-{uuid.uuid4().hex[:6]}.",
        partitions=4,
    )
    popen = None
    try:
        await ensure_topics(settings, pools=("default",))
        client = connect_redis(settings)
        try:
            progress(f"loading {args.turns:,} turns of history")
            loaded = await load(Stores(client, settings).history(), args.turns)
        finally:
            await client.aclose()
        memory = redis.Redis(port=port).info("memory")["used_memory"]
        progress(f"loaded in {loaded.seconds:.0f} s; Redis uses {memory / 2**20:.0f} MiB")
        url, popen = await _console(settings, HOME / "console.log")
        pid = popen.pid
        rss_loaded = rss_bytes(pid)
        rng = random.Random(11)
        timed: list[Timed] = []
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as http:
            for name, request in _requests(loaded.runs):
                timed.append(await _time(http, name, request, args.requests, rng))
        rss_after, rss_peak = rss_bytes(pid), peak_rss_bytes(pid)
    finally:
        if popen is not None:
            terminate(popen)
        await asyncio.to_thread(stop_redis, own)
        await _drop_topics(settings)
    report = _report(args, loaded, memory, timed, (rss_loaded, rss_after, rss_peak))
    print(report)
    args.out.write_text(report)


async def _drop_topics(settings: Settings) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_servers())
    await admin.start()
    try:
        mine = [t for t in await admin.list_topics() if t.startswith(settings.topic_prefix)]
        if mine:
            await admin.delete_topics(mine)
    finally:
        await admin.close()


def _report(
    args: argparse.Namespace,
    loaded: Loaded,
    memory: int,
    timed: list[Timed],
    rss: tuple[int, int, int],
) -> str:
    mib = 2**20
    searches = [t for t in timed if t.name.startswith(("search", "run view"))]
    worst = max(searches, key=lambda t: t.p95)
    verdict = "met" if worst.p95 < TARGET_MS else "missed"
    lines = [
        "# The console's history at scale (`python -m bench.console_history`)",
        "",
        f"{dt.date.today().isoformat()}, this machine (2 cores, shared with the local Kafka "
        "broker and whatever else runs). "
        f"{loaded.turns:,} turns ({len(loaded.runs):,} runs of {TURNS_PER_RUN} turns, 5 tenants, "
        f"1-3 calls each) and {loaded.decisions:,} approval decisions, written through "
        f"`History.put` in {loaded.seconds:.0f} s ({loaded.turns / loaded.seconds:,.0f} "
        f"turns/s) into a redis-server of the bench's own; Redis then uses "
        f"{memory / mib:,.0f} MiB ({memory / loaded.turns:,.0f} bytes a turn, its entry and "
        "index members with it).",
        "",
        f"`toolfleet console` served by uvicorn in a process of its own; {args.requests} "
        "requests of each kind, one at a time, over HTTP from the bench process (httpx), after "
        "10 of warm-up. Milliseconds, from sending the request to the whole JSON body read.",
        "",
        "| request | n | p50 ms | p95 ms | max ms | |",
        "|---|---|---|---|---|---|",
        *(t.row() for t in timed),
        "",
        f"The console's RSS: {rss[0] / mib:,.0f} MiB once serving, {rss[1] / mib:,.0f} MiB after "
        f"the requests, {rss[2] / mib:,.0f} MiB at its peak: it keeps no history in memory "
        "(each page is read from Redis), so its memory does not grow with the history.",
        "",
        f"Target (p95 under {TARGET_MS:.0f} ms for the search pages and the run view): "
        f"{verdict}; the slowest is {worst.name} at {worst.p95:.1f} ms.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    asyncio.run(main())
