"""A rolling upgrade from the baseline release with calls in flight: nothing lost, nothing twice.

The baseline's services (``kernel/stores/baseline.toml`` names its commit) run from a git
worktree against the real Kafka and Redis, as the chart deploys them: two planners, two
aggregators, a reconciler, two workers of pool ``default`` and one of pool ``narrow`` with a
single slot. With calls in flight — calls waiting for approval, an unknown effect under probe
(the probe answers "unknown" until the test lets the upstream answer), an open human task, a
backlog queued in admission behind the narrow pool's only slot, calls running — the
pre-upgrade ``toolfleet migrate`` records the baseline's state version, and the Deployments
are rolled one by one as the chart rolls them (maxSurge 1, maxUnavailable 0: a current replica
started and ready, then a baseline one stopped with SIGTERM). After every replacement a turn
goes through the mixed fleet, with items as the Responses API writes them and, once every
planner is current, the run's context (as FleetRunner sends it). Then, on the current release
alone: the approvals and the task resolution decided now apply, the probe's late answer
resolves its call, a model response replayed as a later turn finds its calls (same call ids:
the outputs reused, nothing re-run), ``toolfleet migrate --finish`` raises the state version
(refused while a baseline service ran) and the run context's changes come back, and the held
calls finish. Every submitted turn has exactly one TurnResult, and every call's body ran
exactly once.

Orders (``ORDERS``): ``chart``, the order the chart lists its Deployments, on a single Redis
and on the 3-master Redis Cluster; ``planner-first`` and ``workers-first`` on a single Redis
(``make upgrade-check``).
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
from aiokafka import AIOKafkaConsumer, TopicPartition

from kernel.adapters.topics import ensure_topics
from kernel.rules.state_versions import STATE_VERSION
from kernel.settings import Settings
from schemas import ApprovalDecision, ModelResponseEvent, TurnResult
from tests.conftest import aggregator_caught_up, purge_namespace, wait_for
from tests.upgrade._rolling import (
    PACKAGES,
    REPO,
    Release,
    RollingFleet,
    add_worktree,
    baseline_commit,
    remove_worktree,
)
from tests.upgrade.served import upgrade_tools as ut
from toolfleet.app import infra
from toolfleet.client import FleetClient
from toolfleet.testing import result_of

pytestmark = pytest.mark.integration

TENANT = "acme"
TOOLS = "upgrade_tools:tools"
BACKLOG = 5
"""Calls of the narrow pool submitted at once: one runs, the others wait in admission."""
ENV = {
    "TOOLFLEET_RECOVERY_PROBE_BACKOFF_S": "0.2",
    "TOOLFLEET_RECOVERY_PROBE_BUDGET": "1000",  # probed until the upstream answers
    "TOOLFLEET_RECOVERY_REPORT_AFTER_S": "600",  # turns wait for the verdicts
    "TOOLFLEET_CIRCUIT_MIN_CALLS": str(10**9),  # lost responses must not open a circuit
    "TOOLFLEET_STATE_VERSION_REFRESH_S": "0.5",  # `migrate --finish` takes effect at once
}
DEPLOYMENTS = {"planner": 2, "aggregator": 2, "reconciler": 1, "worker-default": 2,
               "worker-narrow": 1}  # fmt: skip
"""The chart's Deployments and their replicas (its values.yaml: a pool of 2 workers here)."""
ROLES = [f"{d}-{n}" for d, replicas in DEPLOYMENTS.items() for n in range(replicas)]
ORDERS = {
    "chart": ["planner", "aggregator", "reconciler", "worker-default", "worker-narrow"],
    "planner-first": ["planner", "worker-default", "worker-narrow", "aggregator", "reconciler"],
    "workers-first": ["worker-default", "worker-narrow", "planner", "aggregator", "reconciler"],
}
"""Deployment by Deployment, each rolled as the chart rolls it (maxSurge 1, maxUnavailable 0:
a new replica ready, then an old one stopped). ``chart``: the order the chart lists them;
``planner-first``: the current planners' commands (with run contexts) reach the baseline's
workers, then the current workers' outcomes the baseline's aggregators and reconciler;
``workers-first``: the current workers serve the baseline's planners."""


def _args(role: str) -> list[str]:
    if role.startswith("worker-default"):
        # Room for every call the test holds even on one worker: a worker whose slots are all
        # taken stops reading its partitions, and a held call only ends when the test says.
        return ["worker", "--tools", TOOLS, "--pool", "default", "--concurrency", "32"]
    if role.startswith("worker-narrow"):
        return ["worker", "--tools", TOOLS, "--pool", "narrow", "--concurrency", "1"]
    return [role.rsplit("-", 1)[0]]


@pytest.fixture(scope="module")
def both_redis() -> dict[str, str]:
    """Kafka, the single Redis and the 3-master cluster (started when not running)."""
    base = Settings()
    if not base.redis_cluster_masters:
        base = base.model_copy(update={"redis_cluster_masters": 3})
    return infra.up(base).env()


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """The baseline release, checked out into a worktree for this module."""
    where = tmp_path_factory.mktemp("baseline") / "tree"
    add_worktree(baseline_commit(), where)
    try:
        yield Release("baseline", where)
    finally:
        remove_worktree(where)


CURRENT = Release("current", REPO)


def response(
    run_id: str, turn_id: int, *calls: tuple[str, str, dict[str, Any]], **extra: Any
) -> ModelResponseEvent:
    """A model response of tenant acme with one function call per (call id, tool, args),
    each item as the Responses API writes it (with its id and status)."""
    items = [
        {"type": "function_call", "id": f"fc_{cid}", "status": "completed", "call_id": cid,
         "name": name, "arguments": json.dumps(args)}
        for cid, name, args in calls
    ]  # fmt: skip
    return ModelResponseEvent.model_validate(
        {
            "tenant_id": TENANT, "run_id": run_id, "turn_id": turn_id,
            "agent": {"name": "assistant"}, "response_id": f"resp-{uuid.uuid4().hex[:8]}",
            "items": items, **extra,
        }
    )  # fmt: skip


def _new_run(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize(
    ("state", "order"),
    [("single", "chart"), ("cluster", "chart"), ("single", "planner-first"),
     ("single", "workers-first")],
)  # fmt: skip
async def test_a_rolling_upgrade_with_calls_in_flight_loses_and_repeats_nothing(
    state: str,
    order: str,
    *,
    baseline: Release,
    both_redis: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    began = time.monotonic()
    tag = uuid.uuid4().hex[:8]
    settings = Settings(
        kafka_bootstrap_servers=both_redis["KAFKA_BOOTSTRAP_SERVERS"],
        redis_url=both_redis["REDIS_URL" if state == "single" else "TOOLFLEET_REDIS_CLUSTER_URL"],
        topic_prefix=f"upg-{tag}.",
        partitions=4,
        decision_auth="hmac",
        decision_keys={"*": f"upgrade-{tag}"},
    )
    monkeypatch.setenv("UPGRADE_TAG", tag)  # the tool module's keys, in this process too
    env = {**ENV, "UPGRADE_TAG": tag, "UPGRADE_EFFECTS_URL": both_redis["REDIS_URL"]}
    effects = redis.asyncio.Redis.from_url(both_redis["REDIS_URL"])
    await ensure_topics(settings, pools=("default", "narrow"))
    fleet = RollingFleet(settings, tools=TOOLS, extra_env=env, log_dir=tmp_path)
    scenario = Scenario(fleet, settings, effects, baseline)
    try:
        _check_imports(fleet, baseline)
        timings = await scenario.run(ORDERS[order])
        spent = ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
        print(f"[{state}, {order}] {spent}; in all {time.monotonic() - began:.1f} s")
        print(f"[{state}, {order}] observed {scenario.observed}")
    except BaseException:
        print(f"observed {scenario.observed}")
        print(fleet.tails())
        raise
    finally:
        fleet.stop()
        await _purge(settings, effects, tag)
        await effects.aclose()


def _check_imports(fleet: RollingFleet, baseline: Release) -> None:
    """Each release's processes import every top-level package from that release's tree,
    and the test's tool module from the one place both share."""
    assert baseline.root != REPO
    for release in (baseline, CURRENT):
        found = release.resolved(fleet.env())
        for package in PACKAGES:
            assert Path(found[package]).is_relative_to(release.root), (release.name, found)
        assert Path(found["upgrade_tools"]) == Path(ut.__file__), found


@dataclass
class Scenario:
    """One rolling upgrade: the baseline fleet, calls put in flight, the replacements, and
    what is checked on the current release afterwards."""

    fleet: RollingFleet
    settings: Settings
    effects: redis.asyncio.Redis
    baseline: Release
    procs: dict[str, str] = field(default_factory=dict)
    """Role -> the name of the process that plays it now."""
    submissions: Counter[tuple[str, int]] = field(default_factory=Counter)
    """(run, turn) -> how many times the test submitted it."""
    ran_once: set[str] = field(default_factory=set)
    """Calls whose body must have run exactly once when the test ends."""
    running: list[ModelResponseEvent] = field(default_factory=list)
    """Turns left running on the default pool after each replacement."""
    pids: dict[str, int] = field(default_factory=dict)
    """Process name -> pid, of every process started."""
    backlog: list[ModelResponseEvent] = field(default_factory=list)
    """The narrow pool's turns, one call each (one runs at a time)."""
    observed: dict[str, int] = field(default_factory=dict)
    """What each replacement found: calls running on a worker, calls queued in admission."""
    timings: dict[str, float] = field(default_factory=dict)

    async def run(self, order: list[str]) -> dict[str, float]:
        """The whole scenario; the time each phase took."""
        clock = time.monotonic()
        for role in ROLES:
            self.start(self.baseline, role)
        for name in self.procs.values():
            await self.fleet.until_ready(name)
        self.timings["baseline up"] = time.monotonic() - clock
        async with FleetClient(self.settings) as client:
            clock = time.monotonic()
            flight = await self.put_in_flight(client)
            self.timings["in flight"] = time.monotonic() - clock
            clock = time.monotonic()
            await self.migrate_before()
            self.timings["migrate"] = time.monotonic() - clock
            clock = time.monotonic()
            for deployment in order:
                for n in range(DEPLOYMENTS[deployment]):
                    await self.replace(client, f"{deployment}-{n}")
            self.timings["rolled"] = time.monotonic() - clock
            clock = time.monotonic()
            await self.settle(client, flight)
            self.timings["settled"] = time.monotonic() - clock
        await self.check_counts()
        return self.timings

    # --- helpers ----------------------------------------------------------------------------
    def start(self, release: Release, role: str) -> str:
        name = self.procs[role] = self.fleet.start_as(release, role, _args(role))
        self.pids[name] = self.fleet.pid(name)
        return name

    async def cli(self, release: Release, *args: str) -> str:
        return await asyncio.to_thread(self.fleet.cli_as, release, *args)

    async def submit(self, client: FleetClient, event: ModelResponseEvent) -> None:
        self.submissions[(event.run_id, event.turn_id)] += 1
        await client.submit(event)

    async def result(self, client: FleetClient, event: ModelResponseEvent) -> TurnResult:
        return await result_of(self.fleet, client, event.run_id, event.turn_id, within=120)

    async def ran(self, call_id: str) -> int:
        return int(await self.effects.get(ut.ran_key(call_id)) or 0)

    async def started(self, call_id: str) -> dict[str, int]:
        raw = await self.effects.hgetall(ut.started_key(call_id))
        return {k.decode(): int(v) for k, v in raw.items()}

    def worker_id(self, name: str) -> str:
        return f"{socket.gethostname()}-{self.pids[name]}"

    async def held(self, client: FleetClient, label: str) -> ModelResponseEvent:
        """A turn whose call runs, held, on a worker of pool default; returns once it runs."""
        run = _new_run("held")
        event = response(run, 0, (f"{run}-w", "work", {"text": label}))
        await self.submit(client, event)
        self.ran_once.add(f"{run}-w")
        await wait_for(lambda: self.started(f"{run}-w"), within=60)
        return event

    async def running_calls(self, name: str) -> list[str]:
        """The held calls that began on process ``name`` and have not finished."""
        worker = self.worker_id(name)
        calls = [e.function_calls[0].call_id for e in self.everything_held()]
        return [c for c in calls if worker in await self.started(c) and not await self.ran(c)]

    async def running_on(self, client: FleetClient, name: str) -> None:
        """Leave calls running on worker ``name`` until one of them runs there."""
        for n in range(12):
            if await self.running_calls(name):
                return
            self.running.append(await self.held(client, f"for-{name}-{n}"))
        raise AssertionError(f"12 more held calls and none runs on {name}")

    async def queued(self) -> list[str]:
        """The narrow backlog's calls that have not begun: they wait in admission."""
        calls = [e.function_calls[0].call_id for e in self.backlog]
        return [c for c in calls if not await self.started(c)]

    def everything_held(self) -> list[ModelResponseEvent]:
        return [*self.running, *self.backlog]

    async def migrate(self, *args: str, ok: bool = True) -> str:
        """``toolfleet migrate ARGS`` of the current release, as the chart's Jobs run it."""
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "toolfleet", "migrate", *args],
            env={**self.fleet.env(), **CURRENT.env()},
            cwd=CURRENT.root,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (done.returncode == 0) == ok, (done.stdout, done.stderr)
        return done.stdout + done.stderr

    async def migrate_before(self) -> None:
        """The pre-upgrade Job: the baseline's state recorded as version 1; raising it now
        is refused, since the baseline's services run."""
        said = await self.migrate()
        assert "no version marker (the baseline release's state, version 1)" in said, said
        assert "done: state version 1 in force" in said, said
        assert "done: nothing to write" in await self.migrate()  # idempotent
        refused = await self.migrate("--finish", ok=False)
        assert "services of an earlier release still run" in refused, refused
        assert "still running: planner: toolfleet-planner" in refused, refused

    # --- phases -----------------------------------------------------------------------------
    async def put_in_flight(self, client: FleetClient) -> InFlight:
        """On the baseline fleet: a finished turn to replay later, and every kind of call in
        flight."""
        await self.effects.set(ut.gate_key("default"), 1)
        await self.effects.set(ut.gate_key("narrow"), 1)
        warm = response(_new_run("warm"), 0)
        await self.submit(client, warm)
        assert (await self.result(client, warm)).status == "completed"

        # A finished turn, replayed after the upgrade.
        replayed = _new_run("replay")
        first = response(
            replayed, 0,
            (f"{replayed}-r0", "echo", {"text": "alpha"}),
            (f"{replayed}-r1", "echo", {"text": "beta"}),
        )  # fmt: skip
        await self.submit(client, first)
        done = await self.result(client, first)
        assert [o.output for o in done.outputs] == ["alpha", "beta"], done
        self.ran_once |= {f"{replayed}-r0", f"{replayed}-r1"}

        # Two calls waiting for approval (and a sibling that runs).
        approvals = _new_run("approval")
        asking = response(
            approvals, 0,
            (f"{approvals}-a0", "approve_me", {"name": "first"}),
            (f"{approvals}-a1", "approve_me", {"name": "second"}),
            (f"{approvals}-a2", "echo", {"text": "sibling"}),
        )  # fmt: skip
        await self.submit(client, asking)
        interrupted = await self.result(client, asking)
        assert interrupted.status == "interrupted", interrupted
        assert sorted(i.call_id for i in interrupted.interruptions) == [
            f"{approvals}-a0", f"{approvals}-a1",
        ]  # fmt: skip
        self.ran_once |= {f"{approvals}-a0", f"{approvals}-a1", f"{approvals}-a2"}

        # An unknown effect under probe: applied, its response lost, the probe cannot tell.
        probed = _new_run("probe")
        paying = response(probed, 0, (f"{probed}-p0", "pay", {"value": "42"}))
        await self.submit(client, paying)
        self.ran_once.add(f"{probed}-p0")

        async def probed_once() -> bool:
            return int(await self.effects.get(ut.probes_key(f"{probed}-p0")) or 0) >= 1

        await wait_for(probed_once, within=60)

        # An open human task: a call without a probe whose effect is unknown.
        tasked = _new_run("task")
        notifying = response(tasked, 0, (f"{tasked}-t0", "notify", {"value": "n1"}))
        await self.submit(client, notifying)
        self.ran_once.add(f"{tasked}-t0")

        async def task_filed() -> str | None:
            listed = await self.cli(self.baseline, "tasks", "list")
            return next(
                (line.split()[0] for line in listed.splitlines() if f"{tasked}-t0" in line),
                None,
            )

        task_id = await wait_for(task_filed, within=60, interval=0.5)

        # A backlog in admission: the narrow pool's only slot holds its first call.
        backlog = self.backlog
        for n in range(BACKLOG):
            run = _new_run("narrow")
            event = response(run, 0, (f"{run}-n", "narrow_work", {"text": str(n)}))
            await self.submit(client, event)
            self.ran_once.add(f"{run}-n")
            backlog.append(event)

        async def one_runs() -> list[str]:
            ids = [e.function_calls[0].call_id for e in backlog]
            return [cid for cid in ids if await self.started(cid)]

        assert len(await wait_for(one_runs, within=60)) == 1

        # Calls running on the default pool's workers.
        self.running += [await self.held(client, f"before-{n}") for n in range(2)]
        return InFlight(first, asking, paying, notifying, task_id)

    async def replace(self, client: FleetClient, role: str) -> None:
        """Replace one baseline replica by the current release's as a Deployment rolls (the
        new one ready first, then the old one stopped), then send turns through the mixed
        fleet and leave a call running."""
        clock = time.monotonic()
        old = self.procs[role]
        queued = await self.queued()
        self.observed[f"queued at {role}"] = len(queued)
        if role.startswith("planner"):
            assert queued, "the narrow pool's backlog drained before a planner was replaced"
        if role.startswith("worker-default"):
            await self.running_on(client, old)
        if role.startswith("worker-narrow"):
            assert await self.running_calls(old), "no narrow call runs on the narrow worker"
        await self.fleet.until_ready(self.start(CURRENT, role))
        if role.startswith("worker"):
            self.observed[f"running on {role}"] = len(await self.running_calls(old))
        if role.startswith("worker-narrow"):
            # Its held call finishes; the backlog stays queued, then held on the new worker.
            await self.effects.set(ut.open_key(self.worker_id(old)), 1)
        if role.startswith("worker-default"):
            # The pool's held calls finish, on every worker: a worker stopping gracefully lets
            # the calls it runs finish (a command redelivered to it by a rebalance while
            # another worker runs the call is left to the next owner, test_worker_stop.py).
            await self.effects.delete(ut.gate_key("default"))
        status = await asyncio.to_thread(self.fleet.stop_one, old)
        assert status == 0, f"{old} exited with {status}"
        await self.effects.set(ut.gate_key("default"), 1)
        await self.step(client, role)
        self.running.append(await self.held(client, f"after-{role}"))
        self.timings[f"replace {role}"] = time.monotonic() - clock

    async def step(self, client: FleetClient, label: str) -> TurnResult:
        """A turn through the fleet as it is now. Once every planner is the current
        release's, the turn carries its run's context (as FleetRunner sends it), and a tool
        changes it."""
        run = _new_run("step")
        calls = [(f"{run}-s", "echo", {"text": label})]
        extra: dict[str, Any] = {}
        if all(self.fleet.releases[self.procs[r]] == CURRENT for r in self.roles("planner")):
            calls.append((f"{run}-m", "remember", {"note": label}))
            extra["run_context"] = {"agent": "assistant", "value": json.dumps({"notes": []})}
        step = response(run, 0, *calls, **extra)
        await self.submit(client, step)
        self.ran_once |= {cid for cid, _, _ in calls}
        result = await self.result(client, step)
        expected = [label, f"remembered {label}"][: len(calls)]
        assert [o.output for o in result.outputs] == expected, result
        return result

    @staticmethod
    def roles(deployment: str) -> list[str]:
        return [f"{deployment}-{n}" for n in range(DEPLOYMENTS[deployment])]

    async def settle(self, client: FleetClient, flight: InFlight) -> None:
        """On the current release alone: decide, answer, resolve, replay, release."""
        # Approvals decided now apply: one on the approvals topic, one inside the resume.
        asking, run = flight.asking, flight.asking.run_id
        await client.decide(self.decision(run, f"{run}-a1"))

        async def decision_stored() -> bool:
            listed = await self.cli(CURRENT, "approvals", "list", "--tenant", TENANT)
            return "approved by ops" in _block_of(listed, f"{run}-a1")

        await wait_for(decision_stored, within=30, interval=0.3)
        resume = asking.model_copy(
            update={
                "resume": True,
                "decisions": [client.auth.sign(self.decision(run, f"{run}-a0"))],
            }
        )
        await self.submit(client, resume)
        resumed = await self.result(client, resume)
        assert resumed.status == "completed", resumed
        assert [o.output for o in resumed.outputs] == [
            "approved first", "approved second", "sibling",
        ], resumed  # fmt: skip

        # The probe's late answer resolves the unknown effect.
        await self.effects.set(ut.answers_key(), 1)
        paid = await self.result(client, flight.paying)
        assert [(o.output) for o in paid.outputs] == ["paid 42"], paid
        assert (paid.calls[0].status, paid.calls[0].effect) == ("succeeded", "applied"), paid

        # The task filed by the baseline is resolved by an operator now.
        await self.cli(
            CURRENT, "tasks", "resolve", flight.task_id, "--as", "applied",
            "--output", "notified n1", "--by", "ops",
        )  # fmt: skip
        notified = await self.result(client, flight.notifying)
        assert [o.output for o in notified.outputs] == ["notified n1"], notified

        # A model response replayed as the run's next turn finds its calls.
        first = flight.first
        replay = response(
            first.run_id, 1,
            *[(c.call_id, c.name, json.loads(c.arguments)) for c in first.function_calls],
            (f"{first.run_id}-r2", "echo", {"text": "gamma"}),
        )  # fmt: skip
        await self.submit(client, replay)
        self.ran_once.add(f"{first.run_id}-r2")
        replayed = await self.result(client, replay)
        assert [o.output for o in replayed.outputs] == ["alpha", "beta", "gamma"], replayed

        # Every service runs the current release: the post-upgrade Job raises the state
        # version, and the run context's change comes back (within the services' refresh).
        finished = await self.migrate("--finish")
        assert f"done: state version {STATE_VERSION} in force" in finished, finished

        async def context_comes_back() -> bool:
            upgraded = await self.step(client, "upgraded")
            return "upgraded" in (upgraded.calls[1].run_context or "")

        await wait_for(context_comes_back, within=20, interval=0.1)

        # The held calls and the narrow backlog finish.
        await self.effects.delete(ut.gate_key("default"), ut.gate_key("narrow"))
        for event in self.everything_held():
            result = await self.result(client, event)
            assert result.status == "completed", result

    async def check_counts(self) -> None:
        """Every submission got exactly one TurnResult; every call's body ran once."""
        await wait_for(lambda: aggregator_caught_up(self.settings), within=60)
        assert await count_results(self.settings) == self.submissions
        for call_id in sorted(self.ran_once):
            assert await self.ran(call_id) == 1, f"{call_id} ran {await self.ran(call_id)} times"
            assert sum((await self.started(call_id)).values()) == 1, call_id
        # Each worker imported the tools and ``executors`` of its own release.
        imported = {
            int(pid): Path(where.decode())
            for pid, where in (await self.effects.hgetall(ut.imports_key())).items()
        }
        for name, pid in self.pids.items():
            if name.startswith("worker"):
                assert imported[pid].is_relative_to(self.fleet.releases[name].root), name

    def decision(self, run_id: str, call_id: str) -> ApprovalDecision:
        return ApprovalDecision(
            tenant_id=TENANT, run_id=run_id, call_id=call_id, tool_name="approve_me",
            approve=True, decided_by="ops",
        )  # fmt: skip


def _block_of(listed: str, call_id: str) -> str:
    """The lines ``toolfleet approvals list`` printed about one call."""
    lines = listed.splitlines()
    for n, line in enumerate(lines):
        if line.startswith(call_id):
            rest = lines[n + 1 :]
            end = next((i for i, more in enumerate(rest) if not more.startswith(" ")), len(rest))
            return "\n".join([line, *rest[:end]])
    return ""


@dataclass
class InFlight:
    """What ``put_in_flight`` left in flight."""

    first: ModelResponseEvent
    asking: ModelResponseEvent
    paying: ModelResponseEvent
    notifying: ModelResponseEvent
    task_id: str


async def _purge(settings: Settings, effects: redis.asyncio.Redis, tag: str) -> None:
    """Delete the run's topics, its state and its counters."""
    await purge_namespace(settings)
    counters = [key async for key in effects.scan_iter(match=f"upgrade:{tag}:*", count=1000)]
    if counters:
        await effects.unlink(*counters)


async def count_results(settings: Settings) -> Counter[tuple[str, int]]:
    """How many TurnResults ``turn-results`` holds per (run, turn), read from its start."""
    topic = settings.topic("turn-results")
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_servers(),
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    counts: Counter[tuple[str, int]] = Counter()
    try:
        partitions = [
            TopicPartition(topic, p) for p in range(settings.partitions_of("turn-results"))
        ]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        deadline = time.monotonic() + 60
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            assert time.monotonic() < deadline, "turn-results not read to its end within 60 s"
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    result = TurnResult.decode(record.value or b"")
                    counts[(result.run_id, result.turn_id)] += 1
    finally:
        await consumer.stop()
    return counts
