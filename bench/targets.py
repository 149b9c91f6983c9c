"""The systems a load is sent to: anything behind Kafka (toolfleet, the relay), and in-process.

``KafkaTarget`` is the agent runtime's side for both toolfleet and the raw relay: it publishes
the encoded ModelResponseEvent on ``model-responses`` (idempotent producer, acks=all, the
fleet's linger, as FleetClient does, but without waiting for each ack) and reads ``turn-results``
read_committed. Results are matched by their key (the run_id); every 16th is decoded in full
and checked (status completed, one ``ok`` output per call, in model order).

``InProcessTarget`` is baseline 2: the calls of a turn run in this process with asyncio, as
the OpenAI Agents SDK runs function tools (``invoke_function_tool`` on a ``FunctionTool``,
concurrently, outputs in model order).

``CeleryTarget`` is baseline 3: one chord per turn (see ``bench.celery_app``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from redis.asyncio import Redis

from bench.tools import noop_body, sleep_body
from bench.workload import Listener, Turn
from kernel.errors import InvalidMessageError
from kernel.settings import Settings
from schemas import TurnResult

_COMPLETED = b'"status":"completed"'


class KafkaTarget:
    """Publishes model responses and collects turn results of one topic prefix."""

    def __init__(self, settings: Settings, label: str) -> None:
        self.settings = settings
        self.label = label
        self.listener: Listener | None = None
        self.checked = 0
        self.check_every = 16
        """Decode and check every n-th result in full (1: all, for the latency breakdown)."""
        self.spans: dict[str, tuple[float, float, float]] = {}
        """run_id -> (first call started, last call finished, result read), wall clock."""
        self._serial = itertools.count()
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        s = self.settings
        self._producer = AIOKafkaProducer(
            bootstrap_servers=s.kafka_servers(),
            client_id="bench-driver",
            enable_idempotence=True,
            acks="all",
            linger_ms=s.kafka_linger_ms,
        )
        await self._producer.start()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=s.kafka_servers(),
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        await consumer.start()
        topic = s.topic("turn-results")
        partitions = await self._producer.partitions_for(topic)
        assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(assigned)
        await consumer.seek_to_end(*assigned)
        for tp in assigned:
            await consumer.position(tp)
        self._consumer = consumer
        self._reader = asyncio.create_task(self._read())

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()

    async def send(self, turn: Turn) -> None:
        assert self._producer is not None
        await self._producer.send(
            self.settings.topic("model-responses"), turn.payload, key=turn.run_id.encode()
        )

    async def _read(self) -> None:
        assert self._consumer is not None
        while True:
            batches = await self._consumer.getmany(timeout_ms=200, max_records=2000)
            for records in batches.values():
                for record in records:
                    value = record.value or b""
                    ok = _COMPLETED in value
                    if ok and next(self._serial) % self.check_every == 0:
                        ok = self._check(value)
                    if self.listener is not None and record.key is not None:
                        self.listener(record.key.decode(), ok)

    def _check(self, raw: bytes) -> bool:
        """Completed, one ``ok`` output per call in model order; note when its calls ran."""
        self.checked += 1
        try:
            result = TurnResult.decode(raw)
        except InvalidMessageError:
            return False
        started = [c.started_at for c in result.calls if c.started_at]
        finished = [c.finished_at for c in result.calls if c.finished_at]
        if started and finished:
            self.spans[result.run_id] = (min(started), max(finished), time.time())
        ids = [c.call_id for c in result.calls]
        return (
            result.status == "completed"
            and bool(result.outputs)
            and all(o.output == "ok" for o in result.outputs)
            and [o.call_id for o in result.outputs] == ids
        )


class InProcessTarget:
    """Baseline 2: each turn's calls run concurrently in this process, as the Agents SDK does."""

    def __init__(self, label: str = "in-process (asyncio)") -> None:
        from agents import function_tool, set_tracing_disabled

        set_tracing_disabled(True)  # nothing may leave this machine: no trace export

        @function_tool(name_override="bench_noop", timeout=30.0)
        async def noop(query: str, i: int = 0) -> str:
            """Does nothing."""
            return await noop_body()

        @function_tool(name_override="bench_sleep50", timeout=30.0)
        async def sleep50(query: str, i: int = 0) -> str:
            """Waits 50 ms."""
            return await sleep_body()

        self.label = label
        self.listener: Listener | None = None
        self.tools: dict[str, Any] = {"bench_noop": noop, "bench_sleep50": sleep50}
        self.limit: asyncio.Semaphore | None = None
        """Calls at once across turns (the I/O-bound scenario's concurrency), None: unbounded."""
        self._turns: set[asyncio.Task[None]] = set()

    async def send(self, turn: Turn) -> None:
        task = asyncio.create_task(self._run(turn))
        self._turns.add(task)
        task.add_done_callback(self._turns.discard)

    async def _call(self, name: str, call_id: str, arguments: str) -> Any:
        from agents.tool import invoke_function_tool
        from agents.tool_context import ToolContext

        tool = self.tools[name]
        ctx = ToolContext(
            context=None, tool_name=name, tool_call_id=call_id, tool_arguments=arguments
        )
        if self.limit is None:
            return await invoke_function_tool(function_tool=tool, context=ctx, arguments=arguments)
        async with self.limit:
            return await invoke_function_tool(function_tool=tool, context=ctx, arguments=arguments)

    async def _run(self, turn: Turn) -> None:
        outputs = await asyncio.gather(
            *(self._call(c.name, c.call_id, c.arguments) for c in turn.calls),
            return_exceptions=True,
        )
        ok = all(o == "ok" for o in outputs)
        if self.listener is not None:
            self.listener(turn.run_id, ok)


class CeleryTarget:
    """Baseline 3: one Celery chord per turn; results come back on a Redis list.

    Celery's client API is synchronous, so chords are sent from a small thread pool (the
    client-side cost of a chord is part of what Celery costs); results are read with BLPOP.
    """

    def __init__(self, url: str, queue: str, results_key: str, label: str) -> None:
        from bench.celery_app import app

        app.conf.update(broker_url=url, result_backend=url, task_default_queue=queue)
        self.url = url
        self.results_key = results_key
        self.label = label
        self.listener: Listener | None = None
        self.errors: list[BaseException] = []
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="celery-submit")
        self._redis: Redis | None = None
        self._reader: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self) -> None:
        self._redis = Redis.from_url(self.url)
        self._reader = asyncio.create_task(self._read())

    async def stop(self) -> None:
        # Cancelling a pending BLPOP can hang redis-py's asyncio client: ask the reader to
        # return after its current (1 s) BLPOP instead.
        self._stopping = True
        if self._reader is not None:
            await asyncio.wait({self._reader}, timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._redis is not None:
            await self._redis.aclose()

    def check(self) -> None:
        """Raise the first error a chord submission hit."""
        if self.errors:
            raise RuntimeError(f"{self.label}: submitting a chord failed") from self.errors[0]

    async def send(self, turn: Turn) -> None:
        future = asyncio.get_running_loop().run_in_executor(self._pool, self._submit, turn)
        future.add_done_callback(self._submitted)

    def _submitted(self, future: asyncio.Future[None]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self.errors.append(future.exception())  # type: ignore[arg-type]

    def _submit(self, turn: Turn) -> None:
        from celery import chord, group  # type: ignore[import-untyped]

        from bench.celery_app import collect, noop

        header = group(noop.s(c.call_id, c.arguments) for c in turn.calls)
        ids = [c.call_id for c in turn.calls]
        chord(header)(collect.s(turn.run_id, ids, self.results_key))

    async def _read(self) -> None:
        assert self._redis is not None
        while not self._stopping:
            item = await self._redis.blpop([self.results_key], timeout=1)
            if item is None:
                continue
            raws: list[Any] = [item[1]]
            more: Any = await self._redis.lpop(self.results_key, 1000)
            raws += more or []
            for raw in raws:
                result = json.loads(raw)
                ok = result["status"] == "completed" and all(
                    o["output"] == "ok" for o in result["outputs"]
                )
                if self.listener is not None:
                    self.listener(result["run_id"], ok)
