"""Peer system: Temporal, one workflow per turn, the turn's calls as activities.

What a team that already runs Temporal would build instead of toolfleet: each model response
starts a workflow (id = the run_id) whose calls run concurrently as activities, one no-op
activity per call (it parses its arguments and answers ``ok``, as ``bench.tools.noop_body``),
and the workflow returns their outputs in model order. The driver starts workflows with
``Client.start_workflow`` and awaits each ``handle.result()`` in a task of its own.

Two flavours:

- ``local=False``: ``workflow.execute_activity``: every call is an activity task on the task
  queue (scheduled, polled, completed through the server: Temporal's durable default).
- ``local=True``: ``workflow.execute_local_activity``: the calls run inside the worker that
  runs the workflow task and only their markers reach the history (fewer round trips, the
  usual advice for short calls).

The server is the Temporal CLI's dev server (``temporal server start-dev``: every service in
one Go process, an in-memory SQLite store), on loopback on free ports; build it with
``scripts/install-temporal.sh``. It is a single-node, non-replicated server: the cheapest
Temporal there is, not a production cluster (Cassandra or Postgres, separate services).

Workers: ``python -m bench.temporal_peer worker ...``, one process each, every one polling the
run's task queue. Workflows run outside the sandbox (``UnsandboxedWorkflowRunner``): the
sandbox re-imports the workflow module for every workflow run, a cost of the Python SDK rather
than of Temporal; ``BENCH_TEMPORAL_SANDBOX=1`` measures with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():  # the sandbox (when on) must not re-import these
    from bench.tools import noop_body, sleep_body

if TYPE_CHECKING:
    from temporalio.client import Client

    from bench.procs import ProcessGroup
    from bench.systems import RunContext
    from bench.workload import Listener, Turn

NAMESPACE = "default"
"""The namespace ``start-dev`` creates."""

CALL_TIMEOUT = timedelta(seconds=30)
"""start_to_close of every activity (the bench tools' own timeout)."""

CALL_RETRY = RetryPolicy(maximum_attempts=3)
"""A failing call fails its turn after 3 attempts (Temporal's default retries forever, and a
turn that never ends would only show as a stalled drain)."""

WINDOW_CALLS = 100
"""Calls the bench keeps outstanding for (a): activities do best with 25-100, local activities
with 100-400; at 1,600 one-call turns starting a workflow takes over 5 s and the workers idle."""

MAX_CONCURRENT_ACTIVITIES = 2000
MAX_CONCURRENT_WORKFLOW_TASKS = 500
MAX_CACHED_WORKFLOWS = 2000
"""Worker slots (the SDK's defaults are 100 of each, and a cache of 1,000 workflows). The
activities (remote and local) are async no-ops, so 2,000 slots: more than the harness ever
keeps outstanding on one worker. Workflow tasks: 500, the size the SDK gives its workflow
thread pool when unset (a slot is held only while a task is processed, and Python runs one at
a time anyway). The cache holds 2,000 workflows, so that 1,600 one-call turns in flight are
never evicted and replayed from their history. Pollers stay at the default (5 + 5)."""

DYNAMIC_CONFIG = os.environ.get("BENCH_TEMPORAL_DYNAMIC_CONFIG", "").split()
"""Extra server dynamic config, ``KEY=VALUE`` pairs (JSON values) separated by spaces; none by
default: the stock dev server. The one that matters is ``history.transferProcessorMaxPollRPS``
(default 20): the transfer queue loads new tasks at most 20 times a second, so on an idle
server every hop of a workflow (workflow task, activity task) waits up to 50 ms to reach
matching once its small burst allowance is spent: a one-call turn takes ~150 ms, ~45 ms with
1000. Under load the default is the better one (fewer, larger loads from SQLite): with 1000
the activities' calls/s fell by a third to a half on this machine."""

SERVER_START_S = 60.0
WORKERS_READY_S = 120.0


# ----------------------------------------------------------------------- worker side


@dataclass
class CallInput:
    """One function call of a turn."""

    call_id: str
    name: str
    arguments: str


@dataclass
class TurnInput:
    """A turn as the workflow receives it."""

    run_id: str
    calls: list[CallInput]
    local: bool


@activity.defn(name="bench_noop")
async def bench_noop(arguments: str) -> str:
    """The no-op tool: parses its arguments and answers ``ok``."""
    json.loads(arguments)
    return await noop_body()


@activity.defn(name="bench_sleep50")
async def bench_sleep50(arguments: str) -> str:
    """The I/O-bound tool: parses its arguments and waits 50 ms."""
    json.loads(arguments)
    return await sleep_body()


@workflow.defn(name="bench_turn")
class TurnWorkflow:
    """One turn: its calls concurrently, as activities named after the tool."""

    @workflow.run
    async def run(self, turn: TurnInput) -> list[list[str]]:
        """``[call_id, output]`` per call, in model order."""
        execute = workflow.execute_local_activity if turn.local else workflow.execute_activity
        pending = [
            execute(
                c.name, c.arguments, start_to_close_timeout=CALL_TIMEOUT, retry_policy=CALL_RETRY
            )
            for c in turn.calls
        ]
        outputs = await asyncio.gather(*pending)
        return [[c.call_id, str(o)] for c, o in zip(turn.calls, outputs, strict=True)]


async def run_worker(address: str, task_queue: str, identity: str, local: bool) -> None:
    """Poll ``task_queue`` until SIGTERM (then shut down: in-flight activities are cancelled)."""
    from temporalio.client import Client
    from temporalio.worker import UnsandboxedWorkflowRunner, Worker
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    client = await Client.connect(address, namespace=NAMESPACE, identity=identity)
    sandboxed = os.environ.get("BENCH_TEMPORAL_SANDBOX") == "1"
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[TurnWorkflow],
        activities=[bench_noop, bench_sleep50],
        workflow_runner=SandboxedWorkflowRunner() if sandboxed else UnsandboxedWorkflowRunner(),
        identity=identity,
        max_concurrent_activities=MAX_CONCURRENT_ACTIVITIES,
        max_concurrent_local_activities=MAX_CONCURRENT_ACTIVITIES,
        max_concurrent_workflow_tasks=MAX_CONCURRENT_WORKFLOW_TASKS,
        max_cached_workflows=MAX_CACHED_WORKFLOWS,
        no_remote_activities=local,  # local activities need no activity-queue pollers
    )
    async with worker:
        print(f"temporal worker {identity} polling {task_queue}", flush=True)
        await stop.wait()


# ----------------------------------------------------------------------- driver side


class TemporalTarget:
    """Starts one workflow per turn; calls the listener when the workflow's result is back.

    ``send`` only creates the turn's task (start, then await the result): the closed loop's
    single sender would otherwise wait one StartWorkflowExecution round trip per turn, which
    no agent runtime serving many agents at once does. A start that fails counts as a failed
    turn and is raised by ``check``.
    """

    def __init__(self, client: Client, task_queue: str, *, local: bool) -> None:
        self.client = client
        self.task_queue = task_queue
        self.local = local
        self.label = "Temporal (local activities)" if local else "Temporal (activities)"
        self.listener: Listener | None = None
        self.errors: list[BaseException] = []
        self._turns: set[asyncio.Task[None]] = set()

    async def send(self, turn: Turn) -> None:
        task = asyncio.create_task(self._run(turn))
        self._turns.add(task)
        task.add_done_callback(self._turns.discard)

    async def _run(self, turn: Turn) -> None:
        from temporalio.client import WorkflowFailureError

        calls = [CallInput(c.call_id, c.name, c.arguments) for c in turn.calls]
        try:
            handle = await self.client.start_workflow(
                TurnWorkflow.run,
                TurnInput(turn.run_id, calls, self.local),
                id=turn.run_id,
                task_queue=self.task_queue,
            )
        except Exception as error:  # an RPC error: the turn was never handed in
            self.errors.append(error)
            self._done(turn.run_id, False)
            return
        try:
            outputs = await handle.result()
        except WorkflowFailureError:
            self._done(turn.run_id, False)
            return
        except Exception as error:  # the result could not be read: not the workflow's fault
            self.errors.append(error)
            self._done(turn.run_id, False)
            return
        expected = [[c.call_id, "ok"] for c in turn.calls]
        self._done(turn.run_id, outputs == expected)

    def _done(self, run_id: str, ok: bool) -> None:
        if self.listener is not None:
            self.listener(run_id, ok)

    def check(self) -> None:
        """Raise the first error a start or a result read hit."""
        if self.errors:
            raise RuntimeError(f"{self.label}: a workflow call failed") from self.errors[0]

    async def stop(self) -> None:
        """Cancel the turns still waiting (their workflows die with the dev server)."""
        for task in list(self._turns):
            task.cancel()
        if self._turns:
            await asyncio.wait(set(self._turns), timeout=10)


@dataclass
class TemporalSystem:
    """The dev server, the worker processes and the workflow-per-turn target."""

    address: str
    task_queue: str
    local: bool
    client: Client
    target: TemporalTarget
    processes: ProcessGroup
    """The server (``server``) and the workers (``worker-N``)."""

    def start_worker(self, n: int) -> None:
        from bench.procs import python_env  # not at the top: workers import this module

        name = f"worker-{n}"
        argv = [
            sys.executable, "-m", "bench.temporal_peer", "worker",
            "--address", self.address, "--task-queue", self.task_queue, "--name", name,
        ] + (["--local"] if self.local else [])  # fmt: skip
        self.processes.start(name, argv, python_env())

    def check(self) -> None:
        """Raise (with the log's tail) if the server or a worker died, or a start failed."""
        self.target.check()
        self.processes.check()

    def pids(self) -> dict[str, int]:
        return self.processes.pids()

    async def set_workers(self, count: int) -> None:
        """Run ``count`` worker processes; wait until each one polls the task queue."""
        self.processes.scale(count, self.start_worker)
        await self.ready()

    async def ready(self) -> None:
        """Wait until every running worker is among the task queue's pollers (the workflow
        queue, and the activity queue unless the calls are local activities)."""
        from temporalio.api.enums.v1 import TaskQueueType
        from temporalio.api.taskqueue.v1 import TaskQueue
        from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

        kinds = [TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW]
        if not self.local:
            kinds.append(TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
        deadline = time.monotonic() + WORKERS_READY_S
        while True:
            pids = self.processes.pids()
            expected = {_identity(name, pids[name]) for name in self.processes.workers()}
            missing: set[str] = set()
            for kind in kinds:
                request = DescribeTaskQueueRequest(
                    namespace=NAMESPACE,
                    task_queue=TaskQueue(name=self.task_queue),
                    task_queue_type=kind,
                )
                response = await self.client.workflow_service.describe_task_queue(request)
                missing |= expected - {p.identity for p in response.pollers}
            if not missing:
                return
            self.check()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"temporal workers not polling within {WORKERS_READY_S:g} s: "
                    + ", ".join(sorted(missing))
                )
            await asyncio.sleep(0.1)  # polling interval of a deadline-bounded wait


def _identity(name: str, pid: int) -> str:
    """A worker's identity: its name and pid, so a restarted worker is told from the old one
    (the server lists a poller for a while after it went away)."""
    return f"{name}@{pid}"


def temporal_binary() -> Path:
    """The ``temporal`` CLI where ``scripts/install-temporal.sh`` puts it, else on PATH."""
    go = shutil.which("go") or "/usr/local/go/bin/go"
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        gopath = subprocess.run(
            [go, "env", "GOPATH"], capture_output=True, text=True, check=True
        ).stdout.strip()
        if gopath:
            candidate = Path(gopath) / "bin" / "temporal"
            if os.access(candidate, os.X_OK):
                return candidate
    found = shutil.which("temporal")
    if found:
        return Path(found)
    raise FileNotFoundError(
        "the temporal CLI is not installed: run scripts/install-temporal.sh "
        "(go install of the Temporal dev server, about five minutes the first time)"
    )


def _free_ports(count: int) -> list[int]:
    """Ports nothing listens on now (the kernel's picks, all bound at once so they differ), so
    no run meets another Temporal on the default 7233."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
        return ports


async def _connect(address: str, processes: ProcessGroup) -> Client:
    """Connect once the frontend answers and the namespace is registered (deadline-bounded)."""
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
    from temporalio.client import Client

    deadline = time.monotonic() + SERVER_START_S
    last: BaseException | None = None
    while time.monotonic() < deadline:
        processes.check()
        try:
            client = await Client.connect(address, namespace=NAMESPACE)
            await client.workflow_service.describe_namespace(
                DescribeNamespaceRequest(namespace=NAMESPACE), timeout=timedelta(seconds=2)
            )
            return client
        except Exception as error:  # not listening yet, or the namespace not there yet
            last = error
        await asyncio.sleep(0.1)  # polling interval of a deadline-bounded wait
    raise TimeoutError(f"temporal server not answering within {SERVER_START_S:g} s: {last}")


@asynccontextmanager
async def temporal(ctx: RunContext, workers: int, *, local: bool) -> AsyncIterator[TemporalSystem]:
    """A Temporal dev server and ``workers`` worker processes on a task queue of this run."""
    from bench.procs import ProcessGroup, progress

    binary = temporal_binary()
    name = "temporal-local" if local else "temporal"
    log_dir = ctx.log_root / name
    log_dir.mkdir(parents=True, exist_ok=True)
    port, http_port, metrics_port = _free_ports(3)
    address = f"127.0.0.1:{port}"
    task_queue = f"bench-{ctx.run_id}"
    argv = [
        str(binary), "server", "start-dev", "--headless",
        "--ip", "127.0.0.1", "--port", str(port), "--http-port", str(http_port),
        "--metrics-port", str(metrics_port), "--log-level", "warn",
    ]  # fmt: skip
    for pair in DYNAMIC_CONFIG:
        argv += ["--dynamic-config-value", pair]
    processes = ProcessGroup("temporal", log_dir)
    target: TemporalTarget | None = None
    try:
        processes.start("server", argv, os.environ)
        began = time.monotonic()
        client = await _connect(address, processes)
        progress(
            f"temporal: dev server answering on {address} after {time.monotonic() - began:.1f} s"
        )
        target = TemporalTarget(client, task_queue, local=local)
        system = TemporalSystem(address, task_queue, local, client, target, processes)
        began = time.monotonic()
        await system.set_workers(workers)
        progress(f"temporal: {workers} worker(s) polling after {time.monotonic() - began:.1f} s")
        yield system
    finally:
        try:
            if target is not None:
                await target.stop()
        finally:
            # Workers first (they would only retry against a stopped server), then the server.
            processes.stop_all(last="server")


# ----------------------------------------------------------------------------- entry


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.temporal_peer")
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker", help="a worker process of the Temporal baseline")
    worker.add_argument("--address", required=True)
    worker.add_argument("--task-queue", required=True)
    worker.add_argument("--name", required=True)
    worker.add_argument("--local", action="store_true", help="the calls are local activities")
    args = parser.parse_args(argv)
    # The module proper, not __main__: the sandbox re-imports a workflow by its module's name.
    module = importlib.import_module("bench.temporal_peer")
    identity = _identity(args.name, os.getpid())
    asyncio.run(module.run_worker(args.address, args.task_queue, identity, args.local))
    # The worker has shut down: skip the interpreter's finalization, where the SDK's Rust
    # threads can still call into Python ("PyGILState_Release" abort, once in 15 stops).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
