"""A stopping worker never waits for a call another worker runs.

A rebalance can hand a worker a command whose call another live worker is still running (the
ledger says ``busy``); the new owner waits for that holder's outcome or lease expiry. Once the
worker is told to stop (SIGTERM in a rolling upgrade), it must not keep waiting — the call may
run for hours: it leaves the command uncommitted for the partition's next owner.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from redis.asyncio import Redis

from executors.worker import Worker, WorkerLimits
from kernel.adapters.backoff import Interrupted
from kernel.adapters.bus import KafkaBus
from kernel.settings import Settings
from kernel.stores.door import Stores
from kernel.stores.ledger import NewCall
from kernel.tools import ToolRegistry
from schemas import ExecutionCommand

pytestmark = pytest.mark.integration


async def test_a_stopping_worker_leaves_a_command_another_worker_still_runs(
    redis: Redis, settings: Settings
) -> None:
    stores = Stores(redis, settings)
    ledger = stores.ledger()
    run, call = f"run-{uuid.uuid4().hex}", "c1"
    await ledger.create("t", run, [NewCall(call, "fp", "tf-key", run, 0, "tool", "default")])
    attempt, token = await ledger.dispatch("t", run, call) or (0, 0)
    # Another worker runs the call and holds its lease.
    verdict, _ = await ledger.begin("t", run, call, token=token, worker_id="holder", lease_s=60)
    assert verdict == "run"
    worker = Worker(
        settings, ToolRegistry(), limits=WorkerLimits(lease_s=60), worker_id="new-owner",
        bus=KafkaBus(settings, "worker-default"), stores=stores,
    )  # fmt: skip
    command = ExecutionCommand(
        tenant_id="t", run_id=run, turn_id=0, call_id=call, tool_name="tool", arguments="{}",
        index=0, pool="default", attempt=attempt, fencing_token=token, idempotency_key="tf-key",
        fingerprint="fp", issued_at=time.time(),
    )  # fmt: skip
    worker.stop()  # SIGTERM: the worker is draining when the redelivered command arrives
    # The ledger says busy (the holder runs it): without waiting for the holder, and without
    # running the call, the command is left to the partition's next owner.
    with pytest.raises(Interrupted):
        await asyncio.wait_for(worker._begin(command), timeout=5.0)
    entry = (await ledger.read("t", run, [call]))[call]
    assert entry.state == "started" and entry.worker_id == "holder"
