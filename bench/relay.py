"""Baseline 1, the raw Kafka limit: a minimal aiokafka relay over toolfleet's own hops.

``python -m bench.relay planner|worker|aggregator`` runs one relay process. Together they
carry a turn over exactly the hops toolfleet uses, with the same topics, keys, partition
counts, producer settings (idempotent, acks=all, the same linger, ``kafka_linger_ms``,
batches up to 256 KiB), read_committed consumers and manual offset commits, the same event
loop (uvloop) and garbage-collector tuning, and the same bytes: every message is the same
pydantic model toolfleet sends, encoded the same way, and every consumed message is decoded
once.

    model-responses -> planner -> commands.default + plans
    commands.default -> worker -> outcomes
    plans + outcomes -> aggregator -> turn-results          (the planner reads outcomes too)

What it leaves out is everything toolfleet adds on top of moving bytes: no Redis (no ledger,
no dedupe, no approvals, no admission, no turn state outside memory), no Kafka transactions,
and whole batches are handled at a time (one ack wait and one commit per poll).

Baseline 1b, the durable relay (``BENCH_RELAY_DURABLE=1``): the same processes, plus what
any executor that runs a call at most once must do on its worker hop, against the same Redis
with the same persistence (``appendfsync always``): one script before the body that marks the
call started unless it already was (compare-and-set, fsynced before the body runs) and one
after it that stores the outcome. A batch's calls run concurrently, as toolfleet's do, over
toolfleet's own pipelining Redis client. It is the floor of this job: what toolfleet adds
beyond it is its own cost.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import uvloop
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from redis.asyncio import Redis

from bench.tools import noop_body
from kernel.adapters.bus import PRODUCER_BATCH_BYTES
from kernel.adapters.redis import connect_redis
from kernel.settings import Settings
from kernel.stores.keys import Keys
from planner import fingerprint, idempotency_key
from schemas import (
    CallOutcome,
    CallRecord,
    ExecutionCommand,
    FunctionCallOutput,
    ModelResponseEvent,
    PlannedCall,
    TurnPlan,
    TurnResult,
)
from toolfleet.app.service import tune_gc

ROLES = ("planner", "worker", "aggregator")
DURABLE = os.environ.get("BENCH_RELAY_DURABLE") == "1"
"""The durable relay: started and finished are written to Redis around the body."""

_START = """
if redis.call('HSETNX', KEYS[1], 'state', 'started') == 0 then return 0 end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'started_at', ARGV[2])
redis.call('EXPIRE', KEYS[1], 3600)
return 1
"""
"""Mark the call started unless it already was (then it must not run again)."""

_FINISH = """
redis.call('HSET', KEYS[1], 'state', 'finished', 'outcome', ARGV[1])
return 1
"""
"""Store the outcome."""
TOPICS = {
    "planner": ("model-responses", "outcomes"),
    "worker": ("commands.default",),
    "aggregator": ("plans", "outcomes"),
}


def _log(msg: str, **fields: Any) -> None:
    print(json.dumps({"ts": time.time(), "msg": msg, **fields}), file=sys.stderr, flush=True)


class _Assigned(ConsumerRebalanceListener):  # type: ignore[misc]
    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        return None

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        _log("partitions assigned", partitions=sorted(tp.partition for tp in assigned))


@dataclass
class _Turn:
    plan: TurnPlan | None = None
    outcomes: dict[str, CallOutcome] = field(default_factory=dict)


class Relay:
    """One relay process: consume a batch, produce what it implies, wait for acks, commit."""

    def __init__(self, role: str, settings: Settings) -> None:
        self.role = role
        self.settings = settings
        self.worker_id = f"relay-{os.getpid()}"
        self.turns: dict[tuple[str, int], _Turn] = {}
        self._stopping = asyncio.Event()
        self._producer: AIOKafkaProducer | None = None
        self._redis: Redis | None = None
        self._namespace = Keys.of(settings).namespace

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        s = self.settings
        producer = AIOKafkaProducer(
            bootstrap_servers=s.kafka_servers(),
            client_id=f"bench-relay-{self.role}",
            enable_idempotence=True,
            acks="all",
            linger_ms=s.kafka_linger_ms,
            max_batch_size=PRODUCER_BATCH_BYTES,
        )
        consumer = AIOKafkaConsumer(
            bootstrap_servers=s.kafka_servers(),
            group_id=f"{s.topic_prefix}relay-{self.role}",
            client_id=f"bench-relay-{self.role}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        consumer.subscribe([s.topic(t) for t in TOPICS[self.role]], listener=_Assigned())
        await producer.start()
        await consumer.start()
        self._producer = producer
        if DURABLE and self.role == "worker":
            self._redis = connect_redis(s)
            self._start = self._redis.register_script(_START)
            self._finish = self._redis.register_script(_FINISH)
        try:
            while not self._stopping.is_set():
                batches = await consumer.getmany(timeout_ms=100, max_records=500)
                if not batches:
                    continue
                records = [r for rs in batches.values() for r in rs]
                acks: list[asyncio.Future[Any]] = []
                if self._redis is not None:  # the durable worker: a batch's calls at once
                    handled = await asyncio.gather(*(self._record(r) for r in records))
                    acks = [ack for some in handled for ack in some]
                else:
                    for record in records:
                        acks += await self._record(record)
                if acks:
                    await asyncio.gather(*acks)
                await consumer.commit({tp: rs[-1].offset + 1 for tp, rs in batches.items()})
        finally:
            await consumer.stop()
            await producer.stop()
            if self._redis is not None:
                await self._redis.aclose()

    async def _record(self, record: Any) -> list[asyncio.Future[Any]]:
        topic = record.topic.removeprefix(self.settings.topic_prefix)
        return await self.handle(topic, record.value or b"")

    async def _send(self, topic: str, key: str, value: bytes) -> asyncio.Future[Any]:
        assert self._producer is not None
        future: asyncio.Future[Any] = await self._producer.send(
            self.settings.topic(topic), value, key=key.encode()
        )
        return future

    async def handle(self, topic: str, raw: bytes) -> list[asyncio.Future[Any]]:
        if self.role == "planner":
            if topic == "model-responses":
                return await self.plan(ModelResponseEvent.decode(raw))
            CallOutcome.decode(raw)  # the planner reads outcomes too (concurrency caps)
            return []
        if self.role == "worker":
            return await self.execute(ExecutionCommand.decode(raw))
        if topic == "plans":
            plan = TurnPlan.decode(raw)
            turn = self.turns.setdefault((plan.run_id, plan.turn_id), _Turn())
            turn.plan = plan
        else:
            outcome = CallOutcome.decode(raw)
            turn = self.turns.setdefault((outcome.run_id, outcome.turn_id), _Turn())
            turn.outcomes[outcome.call_id] = outcome
        return await self.maybe_emit(turn)

    async def plan(self, event: ModelResponseEvent) -> list[asyncio.Future[Any]]:
        now = time.time()
        calls = []
        for index, item in enumerate(event.function_calls):
            calls.append(
                PlannedCall(
                    call_id=item.call_id,
                    tool_name=item.name,
                    index=index,
                    arguments=item.arguments,
                    disposition="dispatch",
                    pool="default",
                    effect_class="read_only",
                    on_unknown="report_now",
                )
            )
        plan = TurnPlan(
            tenant_id=event.tenant_id,
            run_id=event.run_id,
            turn_id=event.turn_id,
            response_id=event.response_id,
            agent_name=event.agent.name,
            calls=calls,
            config=event.config,
            planned_at=now,
        )
        acks = [await self._send("plans", event.run_id, plan.encode())]
        for call in calls:
            print_ = fingerprint(call.tool_name, call.arguments)
            command = ExecutionCommand(
                tenant_id=event.tenant_id,
                run_id=event.run_id,
                turn_id=event.turn_id,
                call_id=call.call_id,
                tool_name=call.tool_name,
                arguments=call.arguments,
                index=call.index,
                pool="default",
                attempt=1,
                fencing_token=1,
                idempotency_key=idempotency_key(event.tenant_id, call.call_id, print_),
                fingerprint=print_,
                failure_policy=event.config.failure_policy,
                issued_at=now,
            )
            acks.append(await self._send("commands.default", call.call_id, command.encode()))
        return acks

    async def execute(self, command: ExecutionCommand) -> list[asyncio.Future[Any]]:
        started = time.time()
        key = f"{self._namespace}:durable:{command.run_id}:{command.call_id}"
        if self._redis is not None:
            first = await self._start(keys=[key], args=[command.fencing_token, started])
            if not int(first):
                return []  # started before: running it again could apply it twice
        output = await noop_body()
        outcome = CallOutcome(
            tenant_id=command.tenant_id,
            run_id=command.run_id,
            turn_id=command.turn_id,
            call_id=command.call_id,
            tool_name=command.tool_name,
            index=command.index,
            attempt=command.attempt,
            fencing_token=command.fencing_token,
            status="succeeded",
            effect="applied",
            output=output,
            worker_id=self.worker_id,
            started_at=started,
            finished_at=time.time(),
        )
        raw = outcome.encode()
        if self._redis is not None:
            await self._finish(keys=[key], args=[raw])
        return [await self._send("outcomes", command.run_id, raw)]

    async def maybe_emit(self, turn: _Turn) -> list[asyncio.Future[Any]]:
        plan = turn.plan
        if plan is None or any(c.call_id not in turn.outcomes for c in plan.calls):
            return []
        del self.turns[(plan.run_id, plan.turn_id)]
        outputs, records = [], []
        for call in sorted(plan.calls, key=lambda c: c.index):
            outcome = turn.outcomes[call.call_id]
            outputs.append(FunctionCallOutput(call_id=call.call_id, output=outcome.output or ""))
            records.append(
                CallRecord(
                    call_id=call.call_id,
                    tool_name=call.tool_name,
                    status=outcome.status,
                    effect=outcome.effect,
                    attempts=outcome.attempt,
                    started_at=outcome.started_at,
                    finished_at=outcome.finished_at,
                )
            )
        result = TurnResult(
            tenant_id=plan.tenant_id,
            run_id=plan.run_id,
            turn_id=plan.turn_id,
            status="completed",
            outputs=outputs,
            next_tool_choice="auto",
            calls=records,
        )
        return [await self._send("turn-results", plan.run_id, result.encode())]


async def _main(role: str) -> None:
    settings = Settings()
    relay = Relay(role, settings)
    # The same collector tuning as toolfleet's services: its limit is the same stack's.
    tune_gc(settings.gc_thresholds)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, relay.stop)
    await relay.run()


def main(argv: list[str]) -> None:
    """Entry point: ``python -m bench.relay ROLE`` (settings from the environment)."""
    if len(argv) != 1 or argv[0] not in ROLES:
        raise SystemExit(f"usage: python -m bench.relay {{{'|'.join(ROLES)}}}")
    # The same event loop as toolfleet's services (uvloop), so the limit is the same stack's.
    uvloop.run(_main(argv[0]))


if __name__ == "__main__":
    main(sys.argv[1:])
