"""The console overview's aggregates: the console's job against faust-streaming,
python -m bench.overview_aggregates (``make bench-overview``).

Produces ``--outcomes`` call outcomes (200,000 by default: 5 tenants, 12 tools, retries,
unknown effects and their probes, approvals, failures; ``schemas.CallOutcome``) with the model
responses and turn results of their turns (``schemas.ModelResponseEvent``,
``schemas.TurnResult``), keyed by run, with record timestamps spread over the last two hours,
onto ``model-responses``, ``outcomes`` and ``turn-results`` under a topic prefix of this run's
own (deleted at the end), before either consumer starts. While producing it counts what each
minute and hour should hold (the ground truth).

Then, one after the other, each in a process of its own, from the topics' start:

- **job**: ``toolfleet.app.console._overview.OverviewJob``'s own consume loop (``_consume``:
  getmany of up to 5,000 records, ``facts``, ``fold``, ``Overview.add`` in one pipeline,
  commit), on a redis-server of the bench's own; the job's group is given committed offsets
  of 0 first (it starts at the end when new). The job is private to the console, so the
  child imports it by module name: the bench measures that exact code, not a copy.
- **faust**: ``bench/overview_faust.py``, the same counts in two windowed faust Tables
  (tumbling 60 s and 3600 s, in-memory store), in a virtualenv of its own
  (``.artifacts/faust-venv``, faust-streaming pinned, created here when missing).

Each is timed from its start until its group's committed offsets reach the end of the three
topics; measured: wall time, time to ready (partitions assigned), the child's CPU seconds
(user + sys) and peak RSS, its Redis's CPU, the broker's CPU over the same window, the topics
and partitions faust added and the records it wrote to them. Then both results are read (the
job's Redis hashes; faust's tables through its ``/export`` page) and compared with each other
and with the ground truth, bucket by bucket. Prints the report and writes
``bench/results/overview-aggregates.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib
import importlib.metadata
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from bench.procs import (
    REPO,
    child_env,
    cpu_seconds,
    infra_pids,
    peak_rss_bytes,
    progress,
    spawn,
    terminate,
)
from kernel.adapters.bus import KafkaBus
from kernel.adapters.logs import configure_logging
from kernel.adapters.redis import connect_redis
from kernel.adapters.security import kafka_options
from kernel.adapters.topics import ensure_topics
from kernel.rules.overview import HOUR, MINUTE, bucket_start, latency_bucket
from kernel.settings import Settings
from schemas import (
    AgentRef,
    CallError,
    CallOutcome,
    CallRecord,
    FunctionCallItem,
    FunctionCallOutput,
    ModelResponseEvent,
    TurnResult,
)
from toolfleet.app import infra
from toolfleet.app.infra.redis import start_redis, stop_redis

OUT = REPO / "bench" / "results" / "overview-aggregates.md"
HOME = REPO / ".artifacts" / "bench-overview"
FAUST_VENV = REPO / ".artifacts" / "faust-venv"
FAUST_APP = REPO / "bench" / "overview_faust.py"
FAUST_PINS = ("faust-streaming==0.15.3", "orjson==3.13.0")
"""What the faust virtualenv gets: faust-streaming, and the JSON parser the job uses."""
TOPICS = ("model-responses", "outcomes", "turn-results")
JOB_GROUP = "console-overview"
JOB_MODULE = "toolfleet.app.console._overview"
TENANTS = ("acme", "globex", "initech", "umbrella", "hooli")
WEIGHTS = (40, 25, 15, 12, 8)
TOOLS = [f"tool-{i}" for i in range(12)]
SPAN_S = 2 * 3600.0
"""The records' timestamps cover the two hours before the run."""
TURNS_PER_RUN = 6
COUNTED = ("calls", "tenant", "tool", "turns")
"""The fields compared exactly; ``lat`` (turn latency) depends on read order, see below."""

Buckets = dict[tuple[int, int], Counter[str]]
"""(width, start) -> field -> count."""

# Each call's fate: the outcomes it produces, as (status, effect, kind) in order, and weight.
FATES: list[tuple[list[tuple[str, str, str]], int]] = [
    ([("succeeded", "applied", "execute")], 8_300),
    ([("failed", "not_executed", "execute"), ("succeeded", "applied", "execute")], 500),
    ([("failed", "not_executed", "execute")], 400),
    ([("timed_out", "unknown", "execute"), ("succeeded", "applied", "probe")], 200),
    ([("pending_approval", "not_executed", "execute"), ("succeeded", "applied", "execute")], 200),
    ([("rejected", "not_executed", "execute")], 150),
    ([("cancelled", "not_executed", "execute")], 80),
    ([("skipped", "not_executed", "execute")], 80),
    ([("succeeded", "wrong_effect", "execute")], 50),
    ([("failed", "compensated", "execute")], 40),
]


def _counts(buckets: Buckets, at: float, fields: list[str]) -> None:
    for width in (MINUTE, HOUR):
        bucket = buckets.setdefault((width, bucket_start(at, width)), Counter())
        for name in fields:
            bucket[name] += 1


@dataclass
class Produced:
    """What was produced, and what every bucket should count."""

    outcomes: int = 0
    counted_outcomes: int = 0
    turns: int = 0
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0
    truth: Buckets = field(default_factory=dict)
    ends: dict[TopicPartition, int] = field(default_factory=dict)


Sent = tuple[str, str, bytes, int]
"""A record to send: (logical topic, key, value, timestamp in ms)."""


@dataclass
class Turns:
    """Makes the turns' records, oldest first, and counts what each bucket should hold."""

    rng: random.Random
    produced: Produced
    step_s: float
    """Between two turns' model responses."""
    end: float = field(default_factory=lambda: time.time() - 120.0)
    run: str = ""
    tenant: str = ""
    turn: int = 0

    def next(self) -> list[Sent]:
        """The next turn's model response, call outcomes and turn result."""
        rng, done = self.rng, self.produced
        if done.turns % TURNS_PER_RUN == 0:
            self.tenant = rng.choices(TENANTS, WEIGHTS)[0]
            self.run = f"run-{done.turns // TURNS_PER_RUN:06d}-{uuid.uuid4().hex[:6]}"
            self.turn = 0
        asked_ms = int((self.end - SPAN_S + self.step_s * done.turns) * 1000)
        calls = [
            (f"call_{n}", TOOLS[min(int(rng.expovariate(0.35)), len(TOOLS) - 1)])
            for n in range(rng.choices((1, 2, 3), (40, 35, 25))[0])
        ]
        response = ModelResponseEvent(
            tenant_id=self.tenant, run_id=self.run, turn_id=self.turn,
            agent=AgentRef(name="assistant"), response_id=f"resp_{uuid.uuid4().hex[:16]}",
            items=[
                FunctionCallItem(
                    call_id=call_id, name=tool,
                    arguments=json.dumps({"city": "Lisbon", "n": rng.randint(1, 99)}),
                )
                for call_id, tool in calls
            ],
        )  # fmt: skip
        sent: list[Sent] = [("model-responses", self.run, response.encode(), asked_ms)]
        records = [self._call(index, call_id, tool, asked_ms, sent) for index, (call_id, tool)
                   in enumerate(calls)]  # fmt: skip
        statuses = {r.status for r in records}
        status = (
            "cancelled" if "cancelled" in statuses
            else "failed" if "failed" in statuses and rng.random() < 0.3
            else "interrupted" if rng.random() < 0.02
            else "completed"
        )  # fmt: skip
        result_ms = max(int((r.finished_at or 0) * 1000) for r in records) + rng.randint(2, 30)
        result = TurnResult(
            tenant_id=self.tenant, run_id=self.run, turn_id=self.turn, status=status,
            calls=records,
            outputs=[FunctionCallOutput(call_id=r.call_id, output="said ok") for r in records],
        )  # fmt: skip
        sent.append(("turn-results", self.run, result.encode(), result_ms))
        latency = result_ms / 1000 - asked_ms / 1000  # as the job computes it
        fields = [f"turns|{status}", f"lat|{latency_bucket(latency)}"]
        _counts(done.truth, result_ms / 1000, fields)
        done.turns += 1
        self.turn += 1
        return sent

    def _call(
        self, index: int, call_id: str, tool: str, asked_ms: int, sent: list[Sent]
    ) -> CallRecord:
        rng, done = self.rng, self.produced
        fate = rng.choices([f for f, _ in FATES], [w for _, w in FATES])[0]
        at_ms = asked_ms + rng.randint(2, 20)
        for attempt, (status, effect, kind) in enumerate(fate, start=1):
            at_ms += int(rng.lognormvariate(4.5, 1.0)) + 1
            outcome = CallOutcome(
                tenant_id=self.tenant, run_id=self.run, turn_id=self.turn, call_id=call_id,
                tool_name=tool, index=index, attempt=attempt, fencing_token=attempt,
                status=status, effect=effect, kind=kind,
                output=f"{tool}: {'x' * rng.randint(40, 240)}",
                error=CallError(type="UpstreamError", message="503 from upstream")
                if status == "failed" else None,
                resolved=status != "timed_out",
                source="reconciler" if kind == "probe" else "executor",
            )  # fmt: skip
            sent.append(("outcomes", self.run, outcome.encode(), at_ms))
            done.outcomes += 1
            if kind == "execute" and status != "pending_approval":
                done.counted_outcomes += 1
                fields = [f"calls|{status}|{effect}", f"tenant|{self.tenant}", f"tool|{tool}"]
                _counts(done.truth, at_ms / 1000, fields)
        status, effect, _ = fate[-1]
        return CallRecord.model_validate(
            {
                "call_id": call_id, "tool_name": tool, "status": status, "effect": effect,
                "attempts": len(fate), "started_at": asked_ms / 1000, "finished_at": at_ms / 1000,
            }
        )  # fmt: skip


async def produce(settings: Settings, outcomes: int, seed: int = 7) -> Produced:
    """Put the turns' records on the three topics, oldest turn first; count the truth."""
    done = Produced()
    turns = Turns(random.Random(seed), done, step_s=SPAN_S / (outcomes / 2.0))  # ~2 a turn
    bus = KafkaBus(settings, service="bench")
    await bus.start()
    acks: list[asyncio.Future[Any]] = []
    started = time.perf_counter()
    try:
        while done.outcomes < outcomes:
            for topic, key, value, at_ms in turns.next():
                acks.append(
                    await bus.producer.send(
                        settings.topic(topic), value, key=key.encode(), timestamp_ms=at_ms
                    )
                )
                done.records += 1
                done.bytes += len(value)
            if len(acks) >= 5_000:
                await asyncio.gather(*acks)
                acks.clear()
            if done.turns % 20_000 == 0:
                progress(f"produced {done.turns:,} turns, {done.outcomes:,} outcomes")
        await asyncio.gather(*acks)
    finally:
        await bus.stop()
    done.seconds = time.perf_counter() - started
    done.ends = await _end_offsets(settings)
    return done


async def _end_offsets(settings: Settings) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(**kafka_options(settings))
    await consumer.start()
    try:
        tps = [
            TopicPartition(settings.topic(t), p)
            for t in TOPICS
            for p in range(settings.partitions_of(t))
        ]
        return dict(await consumer.end_offsets(tps))
    finally:
        await consumer.stop()


async def _commit_zero(settings: Settings, group: str, ends: dict[TopicPartition, int]) -> None:
    """Give ``group`` committed offsets of 0: the job's new group starts at the end."""
    consumer = AIOKafkaConsumer(**kafka_options(settings), group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(list(ends))
        await consumer.commit({tp: 0 for tp in ends})
    finally:
        await consumer.stop()


# --- the job's child process ------------------------------------------------------------------
async def _job_child() -> None:
    """Run OverviewJob's consume loop until SIGTERM (then it stops its consumer: leaves the
    group)."""
    configure_logging("bench-overview-job", "INFO")
    settings = Settings()
    client = connect_redis(settings)
    job = importlib.import_module(JOB_MODULE).OverviewJob(settings, client)
    task = asyncio.create_task(job._consume())  # the job's own loop, without its gauges
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await client.aclose()


# --- measuring ------------------------------------------------------------------------------
@dataclass
class Measured:
    """One system's run."""

    system: str
    wall_s: float = 0.0
    ready_s: float = 0.0
    cpu_s: float = 0.0
    cpu_ready_s: float = 0.0
    peak_rss: int = 0
    broker_cpu_s: float = 0.0
    redis_cpu_s: float = 0.0
    machine_busy: float = 0.0
    """Share of the machine's cores busy over the run (anything that ran, not only this)."""
    counts: Buckets = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    def fold_s(self) -> float:
        """From ready to the last commit."""
        return max(1e-9, self.wall_s - self.ready_s)


async def _committed(admin: AIOKafkaAdminClient, group: str) -> dict[TopicPartition, int]:
    found = await admin.list_consumer_group_offsets(group)
    return {tp: meta.offset for tp, meta in found.items() if meta is not None}


@dataclass
class Bench:
    """What every run shares: where, what was produced, what to watch."""

    settings: Settings
    produced: Produced
    pids: dict[str, int]
    """The broker's and the job's redis-server's pids (their CPU over each run)."""
    within_s: float
    faust_python: Path


@dataclass
class Child:
    """One system's process, and how to tell it is ready, failing and done."""

    popen: subprocess.Popen[bytes]
    log: Path
    ready_marker: str
    """A log line's text once its partitions are assigned."""
    group: str
    failed_marker: str | None = None
    """A log line's text when it fails and starts again (the job's loop does not exit)."""
    ready: bool = False
    failed: bool = False
    _read: int = 0

    def scan(self) -> None:
        """Read the log's new lines (a marker cut in two by a write is read whole next time)."""
        with self.log.open("rb") as f:
            f.seek(self._read)
            chunk = f.read()
        cut = chunk.rfind(b"\n") + 1
        self._read += cut
        lines = chunk[:cut]
        self.ready = self.ready or self.ready_marker.encode() in lines
        marker = self.failed_marker
        self.failed = self.failed or (marker is not None and marker.encode() in lines)

    def tail(self) -> str:
        """The log's last lines."""
        return self.log.read_text(errors="replace")[-3000:]


async def _watch(bench: Bench, measured: Measured, child: Child) -> None:
    """Poll until the child's group has committed every end offset; fill ``measured``."""
    settings, ends = bench.settings, bench.produced.ends
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    await admin.start()
    pids = {**bench.pids, "child": child.popen.pid}
    began = {name: cpu_seconds(pid) for name, pid in pids.items()}
    machine = psutil.cpu_times()
    started = time.monotonic()
    deadline = started + bench.within_s
    try:
        while True:
            now = time.monotonic()
            await asyncio.to_thread(child.scan)
            if child.popen.poll() is not None or child.failed:
                tail = await asyncio.to_thread(child.tail)
                raise RuntimeError(f"{measured.system} failed ({child.popen.returncode}): {tail}")
            if now > deadline:
                raise TimeoutError(f"{measured.system}: not done within {bench.within_s:g} s")
            if not measured.ready_s and child.ready:
                measured.ready_s = now - started
                measured.cpu_ready_s = cpu_seconds(child.popen.pid)
            committed = await _committed(admin, child.group)
            if all(committed.get(tp, -1) >= end for tp, end in ends.items()):
                measured.wall_s = time.monotonic() - started
                break
            await asyncio.sleep(0.2)  # the polling interval of a deadline-bounded wait
    finally:
        await admin.close()
    measured.cpu_s = cpu_seconds(child.popen.pid)
    measured.peak_rss = peak_rss_bytes(child.popen.pid)
    used = {name: cpu_seconds(pid) - began[name] for name, pid in pids.items()}
    measured.broker_cpu_s = used.get("kafka", 0.0)
    measured.redis_cpu_s = used.get("redis", 0.0)
    now = psutil.cpu_times()
    idle = now.idle + now.iowait - machine.idle - machine.iowait
    measured.machine_busy = 1.0 - idle / max(1e-9, sum(now) - sum(machine))
    if not measured.ready_s:  # the marker came between two polls of the last round
        measured.ready_s = measured.wall_s
        measured.cpu_ready_s = measured.cpu_s


def _reset_redis(url: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
        client.config_resetstat()
    finally:
        client.close()


def _redis_counts(url: str) -> Buckets:
    client = redis.Redis.from_url(url)
    try:
        found: Buckets = {}
        for key in client.scan_iter(match="*:ov:*", count=1000):
            width, start = key.decode().rsplit("{", 1)[1].rstrip("}").split(".")
            fields = client.hgetall(key)
            found[(int(width), int(start))] = Counter(
                {k.decode(): int(v) for k, v in fields.items()}
            )
        return found
    finally:
        client.close()


def _redis_commands(url: str) -> dict[str, int]:
    client = redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return {
        str(k).removeprefix("cmdstat_"): int(v["calls"])
        for k, v in stats.items()
        if isinstance(v, dict)
    }


async def run_job(bench: Bench, n: int) -> Measured:
    """The console's job in a child process, on the bench's redis-server."""
    settings = bench.settings
    measured = Measured("job")
    group = settings.group(JOB_GROUP)
    await _commit_zero(settings, group, bench.produced.ends)
    url = settings.redis_address()
    await asyncio.to_thread(_reset_redis, url)
    log = HOME / f"job-{n}.log"
    env = child_env(settings, TOOLFLEET_LOG_LEVEL="INFO")
    argv = [sys.executable, "-m", "bench.overview_aggregates", "--child-job"]
    with log.open("wb") as out:
        popen = spawn(argv, env, out)
        try:
            await _watch(
                bench, measured, Child(popen, log, "consumer assignment", group, '"level": "error"')
            )
        finally:
            terminate(popen)
    measured.counts = await asyncio.to_thread(_redis_counts, url)
    commands = await asyncio.to_thread(_redis_commands, url)
    measured.notes = {
        "redis_commands": sum(commands.values()),
        "hincrby": commands.get("hincrby", 0),
        "redis_keys": len(measured.counts),
    }
    return measured


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def faust_python() -> tuple[Path, str]:
    """The faust virtualenv's python, created with ``FAUST_PINS`` when missing, and the
    faust-streaming version it imports."""
    python = FAUST_VENV / "bin" / "python"
    stamp = FAUST_VENV / ".installed"
    wanted = " ".join(FAUST_PINS)
    if not stamp.exists() or stamp.read_text() != wanted:
        progress(f"installing {wanted} into {FAUST_VENV.relative_to(REPO)}")
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(FAUST_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *FAUST_PINS], check=True)
        stamp.write_text(wanted)
    version = subprocess.run(
        [str(python), "-c", "import faust; print(faust.__version__)"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    return python, version


async def run_faust(bench: Bench, n: int, mode: str = "windowed") -> Measured:
    """The faust app (``mode``: ``windowed`` or ``batched``, see bench/overview_faust.py) in a
    child process of its own virtualenv."""
    settings = bench.settings
    measured = Measured("faust" if mode == "windowed" else f"faust {mode}")
    app_id = f"{settings.topic_prefix}overview-faust-{mode}-{n}"
    port = _free_port()
    log = HOME / f"faust-{mode}-{n}.log"
    data = HOME / f"faust-data-{mode}-{n}"
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHONUNBUFFERED": "1",
        "BENCH_KAFKA": settings.kafka_servers(),
        "BENCH_PREFIX": settings.topic_prefix,
        "BENCH_APP_ID": app_id,
        "BENCH_PARTITIONS": str(settings.partitions),
        "BENCH_WEB_PORT": str(port),
        "BENCH_DATA_DIR": str(data),
        "BENCH_FAUST_MODE": mode,
    }
    argv = [str(bench.faust_python), str(FAUST_APP), "worker", "--loglevel", "info"]
    with log.open("wb") as out:
        popen = spawn(argv, env, out, cwd=HOME)
        try:
            await _watch(
                bench, measured, Child(popen, log, "[^Worker]: Ready", app_id, "Crashed reason=")
            )
            async with httpx.AsyncClient(timeout=60) as http:
                answer = await http.get(f"http://127.0.0.1:{port}/export")
                answer.raise_for_status()
                exported = answer.json()
        finally:
            terminate(popen, grace_s=30)
    for width, name, start, count in exported["rows"]:
        measured.counts.setdefault((int(width), int(start)), Counter())[name] += int(count)
    measured.notes = {
        "faust_version": exported["faust"],
        "topics": await _faust_topics(settings, app_id),
    }
    return measured


async def run_faust_batched(bench: Bench, n: int) -> Measured:
    """The faust app folding a batch before it adds to its table."""
    return await run_faust(bench, n, "batched")


async def _faust_topics(settings: Settings, app_id: str) -> list[tuple[str, int, int]]:
    """The topics faust created for ``app_id``: (name, partitions, records in them)."""
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    await admin.start()
    consumer = AIOKafkaConsumer(**kafka_options(settings))
    await consumer.start()
    try:
        names = sorted(t for t in await admin.list_topics() if t.startswith(app_id))
        found = []
        for name in names:
            tps = [TopicPartition(name, p) for p in consumer.partitions_for_topic(name) or ()]
            if not tps:
                await consumer._client.force_metadata_update()  # a topic new to it
                tps = [TopicPartition(name, p) for p in consumer.partitions_for_topic(name) or ()]
            ends = await consumer.end_offsets(tps)
            found.append((name.removeprefix(settings.topic_prefix), len(tps), sum(ends.values())))
        return found
    finally:
        await consumer.stop()
        await admin.close()


async def _drop_topics(settings: Settings) -> None:
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    await admin.start()
    try:
        mine = [t for t in await admin.list_topics() if t.startswith(settings.topic_prefix)]
        if mine:
            await admin.delete_topics(mine)
    finally:
        await admin.close()


# --- comparing ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Compared:
    """How one set of counts compares with another over the counted fields."""

    buckets: int
    cells: int
    differ: list[str]
    totals: dict[str, tuple[int, int]]
    """kind -> (this, other) summed over every minute bucket."""


def compare(these: Buckets, other: Buckets, kinds: tuple[str, ...] = COUNTED) -> Compared:
    """Every (bucket, field) of ``kinds`` in either, and where they differ."""
    differ: list[str] = []
    cells = 0
    totals: dict[str, list[int]] = {kind: [0, 0] for kind in kinds}
    for key in sorted(set(these) | set(other)):
        a, b = these.get(key, Counter()), other.get(key, Counter())
        for name in sorted(set(a) | set(b)):
            kind = name.partition("|")[0]
            if kind not in kinds:
                continue
            cells += 1
            if a[name] != b[name]:
                differ.append(f"{key[0]}s@{key[1]} {name}: {a[name]} vs {b[name]}")
            if key[0] == MINUTE:
                totals[kind][0] += a[name]
                totals[kind][1] += b[name]
    buckets = len(set(these) | set(other))
    return Compared(buckets, cells, differ, {k: (v[0], v[1]) for k, v in totals.items()})


# --- the report -----------------------------------------------------------------------------
def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = psutil.virtual_memory().total / 2**30
    return (
        f"{psutil.cpu_count()} cores ({cpu}), {memory:.0f} GiB, Python {platform.python_version()}"
    )


def _row(m: Measured, records: int) -> str:
    mib = 2**20
    return (
        f"| {m.system} | {m.wall_s:.1f} | {m.ready_s:.1f} | {m.fold_s():.1f} "
        f"| {records / m.fold_s():,.0f} | {m.cpu_s:.1f} | {m.cpu_s - m.cpu_ready_s:.1f} "
        f"| {m.peak_rss / mib:,.0f} | {m.redis_cpu_s:.1f} | {m.broker_cpu_s:.1f} "
        f"| {m.machine_busy:.0%} |"
    )


def _mean(runs: list[Measured]) -> Measured:
    """The runs' mean timings and costs, with the last one's counts and notes."""
    mean = Measured(runs[-1].system, counts=runs[-1].counts, notes=runs[-1].notes)
    for name in (
        "wall_s", "ready_s", "cpu_s", "cpu_ready_s", "broker_cpu_s", "redis_cpu_s", "machine_busy",
    ):  # fmt: skip
        setattr(mean, name, statistics.fmean(getattr(m, name) for m in runs))
    mean.peak_rss = max(m.peak_rss for m in runs)
    return mean


def report(
    args: argparse.Namespace, produced: Produced, runs: list[Measured], versions: dict[str, str]
) -> str:
    """The Markdown report."""
    job = _mean([m for m in runs if m.system == "job"])
    names = sorted({m.system for m in runs if m.system != "job"})
    fausts = [_mean([m for m in runs if m.system == name]) for name in names]
    records = produced.records
    lines = [
        "# The console overview's aggregates: the job against faust-streaming",
        "",
        f"`python -m bench.overview_aggregates` (`make bench-overview`), "
        f"{dt.date.today().isoformat()}, on {_machine()}; the local single-node Kafka broker "
        "(`toolfleet infra up`, shared with whatever else runs on the machine) and a "
        "redis-server of the bench's own for the job. "
        f"Versions: {', '.join(f'{k} {v}' for k, v in versions.items())}.",
        "",
        f"Input: {produced.outcomes:,} call outcomes ({produced.counted_outcomes:,} counted: "
        "the others are probes and approval requests, which the overview skips), "
        f"{produced.turns:,} model responses and as many turn results: {records:,} records, "
        f"{produced.bytes / 2**20:,.0f} MiB of JSON built with `schemas` "
        f"(`CallOutcome`, `ModelResponseEvent`, `TurnResult`), keyed by run, over "
        f"{args.partitions} partitions a topic, timestamps spread over two hours; produced "
        f"in {produced.seconds:.0f} s before either consumer started. Each system then read "
        "all of it from the start, one after the other.",
        "",
        "The systems: **job**, `OverviewJob`'s own consume loop (getmany of up to 5,000 "
        "records, `facts`, `fold` into minutes and hours, `Overview.add`: HINCRBY in one "
        "pipeline, then commit); **faust**, `bench/overview_faust.py`: one agent over the three "
        "topics, two windowed Tables (tumbling 60 s and 3600 s, by the record's timestamp, "
        "in-memory store), `table[field] += 1` for each field of each record, as faust's "
        "documentation counts; **faust batched**, the same app folding up to 5,000 events "
        "(`take_events`) as the job folds a batch, then adding each touched "
        "`WIDTH|START|FIELD` to one plain Table: the cheapest shape of faust found here.",
        "",
        "Wall: from the process's start until its consumer group's committed offsets reached "
        "the end of the three topics; ready: until its partitions were assigned (the job) or "
        "faust said `Ready`; fold: the rest, over which records/s is counted. CPU: user + sys "
        "of the process (all of it, and after ready); the job's Redis and the broker over the "
        "same wall time (the broker's includes anything else the machine ran then); machine "
        "busy: the share of both cores busy over the run, whatever ran (other work on this "
        "shared machine shows there).",
        "",
        "| system | wall s | ready s | fold s | records/s | CPU s | CPU s after ready "
        "| peak RSS MiB | Redis CPU s | broker CPU s | machine busy |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *(_row(m, records) for m in runs),
        "",
    ]
    lines += [
        "Ratios to the job (the mean of each one's runs above): "
        + "; ".join(_ratios(job, m) for m in fausts)
        + ".",
        "",
        "What each needs and writes:",
        "",
        f"- **job**: nothing new to deploy (it runs inside the console), one consumer group "
        f"(`console-overview`), no topic of its own; {job.notes['redis_commands']:,} Redis "
        f"commands ({job.notes['hincrby']:,} HINCRBY) in one pipeline per batch, "
        f"{job.notes['redis_keys']:,} hashes (one per minute and per hour).",
        f"- **faust** {fausts[0].notes['faust_version']}: a worker deployment of its own "
        "(its own virtualenv here: faust-streaming is no dependency of toolfleet), its own "
        "consumer group (the app id), an aiohttp web server (the export page here), the "
        "in-memory store (RocksDB would add `faust-streaming[rocksdb]` and a local data "
        "directory), and topics of its own. Its tables are sharded by the source partition: "
        "with more than one worker a key's count is split across workers unless the stream "
        "is repartitioned by key (`group_by`: one more topic, every record produced again), "
        "and a chart would have to ask every worker.",
        *(_faust_topics_line(m, records) for m in fausts),
        "",
    ]
    truth = produced.truth
    for m in runs:
        against_truth = compare(m.counts, truth)
        lat = compare(m.counts, truth, ("lat",))
        lines.append(
            f"- {m.system}: {against_truth.cells:,} counts in {against_truth.buckets:,} "
            f"buckets (minutes and hours) against the ground truth: "
            + (
                "all equal"
                if not against_truth.differ
                else f"{len(against_truth.differ):,} differ, e.g. {against_truth.differ[:3]}"
            )
            + f"; turn latencies counted {lat.totals['lat'][0]:,} of {lat.totals['lat'][1]:,}."
        )
    lines.append("")
    for m in fausts:
        between = compare(job.counts, m.counts)
        lines.append(
            f"Job against {m.system} (last runs): {between.cells:,} counts in "
            f"{between.buckets:,} buckets, "
            + (
                "all equal."
                if not between.differ
                else f"{len(between.differ):,} differ, e.g. {between.differ[:5]}."
            )
        )
    lines += [
        "",
        "Turn latencies are not compared exactly: a turn's latency needs its model response "
        "read before its result. The job sorts each batch's model responses first; faust "
        "hands the agent one record at a time in the order it fetched the topics. Either way "
        "a result read before its response counts as a turn but not in the latency "
        "histogram, which depends on the order the consumer fetches the topics' partitions, "
        "not on the folding. A backlog read from the start, as here, is the worst case (a "
        "batch of results may come before the batch of their responses); live, a response "
        "is read a whole turn before its result.",
        "",
        "Seen while building this bench, not measured by it: a faust agent that raises is "
        "restarted by its supervisor, and the offsets of the events it was handed are "
        "committed all the same (an early batched mode raised on every batch; its group "
        "reached the end of the topics with an empty table). A crash loses its records' "
        "counts, as a duplicate read doubles them: at-most-once and at-least-once, which "
        "charts can bear and nothing else could.",
        "",
        *conclusion(job, fausts),
        "",
        f"Command: `.venv/bin/python -m bench.overview_aggregates --outcomes {args.outcomes} "
        f"--partitions {args.partitions} --reps {args.reps}`; logs in "
        "`.artifacts/bench-overview/`.",
        "",
    ]
    return "\n".join(lines)


def _after_ready(m: Measured) -> float:
    return max(1e-9, m.cpu_s - m.cpu_ready_s)


def _ratios(job: Measured, other: Measured) -> str:
    job_total = job.cpu_s + job.redis_cpu_s + job.broker_cpu_s
    other_total = other.cpu_s + other.redis_cpu_s + other.broker_cpu_s
    # Below a poll's worth the job was done before it was seen ready: no ratio to speak of.
    after = f"{_after_ready(other) / _after_ready(job):.1f}x" if _after_ready(job) >= 0.1 else "n/a"
    return (
        f"{other.system}: wall {other.wall_s / job.wall_s:.1f}x, fold time "
        f"{other.fold_s() / job.fold_s():.1f}x, CPU after ready {after}, "
        "CPU all told (process, its Redis, "
        f"the broker) {other_total:.0f} s against {job_total:.0f} s "
        f"({other_total / max(1e-9, job_total):.1f}x), peak RSS "
        f"{other.peak_rss / max(1, job.peak_rss):.1f}x"
    )


def _faust_topics_line(m: Measured, records: int) -> str:
    topics = m.notes["topics"]
    changelog = sum(r for name, _p, r in topics if name.endswith("-changelog"))
    return (
        f"  - {m.system}: {len(topics)} topics, {sum(p for _n, p, _r in topics)} partitions: "
        + ", ".join(f"`{n}` ({p} partitions, {r:,} records)" for n, p, r in topics)
        + f"; {changelog:,} changelog records written for {records:,} read "
        f"({changelog / records:.2f} a record read)."
    )


def conclusion(job: Measured, fausts: list[Measured]) -> list[str]:
    """The verdict the numbers give."""
    best = min(fausts, key=lambda m: m.fold_s())
    slower = best.fold_s() / job.fold_s()
    costlier = _after_ready(best) / _after_ready(job)
    plain = next((m for m in fausts if m.system == "faust"), best)
    slower_plain = plain.fold_s() / job.fold_s()
    costlier_plain = _after_ready(plain) / _after_ready(job)
    if slower >= 1.0 and costlier >= 1.0:
        verdict = (
            "**Conclusion: the console uses its job.** On the same records faust-streaming "
            f"at its best here ({best.system}) took {slower:.1f}x the job's time to fold them "
            f"and {costlier:.1f}x its CPU (faust as its documentation counts: "
            f"{slower_plain:.0f}x and {costlier_plain:.0f}x), and it is in addition a "
            "deployment of its own with topics of its own, a changelog to write and recover, "
            "and tables split by partition across workers, for counts whose loss costs a "
            "chart a point."
        )
    else:
        verdict = (
            f"**Conclusion: faust-streaming ({best.system}) measured as well as or better "
            f"than the job here (fold time {slower:.1f}x, CPU {costlier:.1f}x the job's)**; "
            "weigh that against its separate deployment, topics and changelog."
        )
    return [verdict]


async def main(argv: list[str] | None = None) -> None:
    """Produce, run each system, compare, report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outcomes", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--reps", type=int, default=1, help="runs of each, alternating order")
    parser.add_argument("--within", type=float, default=900.0, help="seconds a run may take")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--child-job", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_job:
        await _job_child()
        return

    python, faust_version = await asyncio.to_thread(faust_python)
    versions = {
        "faust-streaming": faust_version,
        "aiokafka": importlib.metadata.version("aiokafka"),
        "redis-py": importlib.metadata.version("redis"),
    }
    progress(f"versions: {versions}")
    shared = await asyncio.to_thread(infra.up, Settings())
    pids = {"kafka": infra_pids(Settings()).get("kafka", 0)}
    shutil.rmtree(HOME, ignore_errors=True)
    HOME.mkdir(parents=True)
    port = _free_port()
    own = Settings(state_dir=HOME, redis_port=port, redis_url=None)
    settings = Settings(
        kafka_bootstrap_servers=shared.env()["KAFKA_BOOTSTRAP_SERVERS"],
        redis_url=f"redis://127.0.0.1:{port}/0",
        topic_prefix=f"bench-overview-{uuid.uuid4().hex[:6]}.",
        partitions=args.partitions,
    )
    runs: list[Measured] = []
    try:
        redis_status = await asyncio.to_thread(start_redis, own)
        if redis_status.pid:
            pids["redis"] = redis_status.pid
        await ensure_topics(settings, pools=("default",))
        progress(f"producing {args.outcomes:,} outcomes under {settings.topic_prefix}")
        produced = await produce(settings, args.outcomes)
        progress(f"produced {produced.records:,} records in {produced.seconds:.0f} s")
        bench = Bench(settings, produced, pids, args.within, python)
        for rep in range(args.reps):
            order = [run_job, run_faust, run_faust_batched]
            if rep % 2:
                order.reverse()
            for run in order:
                measured = await run(bench, rep)
                progress(
                    f"{measured.system}: {measured.wall_s:.1f} s wall, {measured.cpu_s:.1f} s "
                    f"CPU, {measured.peak_rss / 2**20:.0f} MiB peak"
                )
                runs.append(measured)
    finally:
        await asyncio.to_thread(stop_redis, own)
        await _drop_topics(settings)
    text = report(args, produced, runs, versions)
    print(text)
    args.out.write_text(text)


async def _main() -> None:
    # SIGTERM cancels the run, so its finally blocks stop the bench's redis-server and
    # delete its topics (a SIGKILL leaves them; the children die with the bench anyway).
    task = asyncio.current_task()
    if task is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    await main()


if __name__ == "__main__":
    asyncio.run(_main())
