"""The reconciler's backlog gauges on the real Redis: open human tasks, and unresolved unknown
effects counted in when reconciling starts and out when a verdict (or a retry's outcome, seen
by the sweep) settles them."""

from __future__ import annotations

import time
import uuid

import pytest
from redis.asyncio import Redis

from kernel.adapters.metrics import REGISTRY
from kernel.rules.auth import DecisionAuth
from kernel.settings import Settings
from kernel.stores.door import Stores
from kernel.stores.keys import SLOT_GROUPS, Keys
from kernel.stores.ledger import Ledger, NewCall
from kernel.stores.unknowns import SWEEP_PER_GROUP, UnknownEffects
from reconciler.service import Reconciler
from schemas import CallOutcome, TaskResolution
from toolfleet.testing import InMemoryBus

pytestmark = pytest.mark.integration


@pytest.fixture
def own(settings: Settings) -> Settings:
    """A deployment of its own: its keys (and so its backlog) are this test's alone."""
    return settings.model_copy(update={"topic_prefix": f"backlog-{uuid.uuid4().hex[:8]}."})


def _gauge(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def _tasks(kind: str) -> float | None:
    return _gauge("toolfleet_human_tasks_open", kind=kind)


def _outcome(run: str, call_id: str, token: int, effect: str = "unknown") -> CallOutcome:
    return CallOutcome(
        tenant_id="t", run_id=run, turn_id=0, call_id=call_id, tool_name="charge", index=0,
        attempt=1, fencing_token=token, status="timed_out" if effect == "unknown" else "succeeded",
        effect=effect, output="",
    )  # fmt: skip


async def _planned(ledger: Ledger, run: str, call_id: str) -> int:
    await ledger.create("t", run, [NewCall(call_id, "fp", "key", run, 0, "charge", "default")])
    issued = await ledger.dispatch("t", run, call_id)
    assert issued is not None
    return issued[1]


async def test_an_unknown_effect_is_counted_until_a_human_resolves_it(
    own: Settings, redis: Redis
) -> None:
    reconciler = Reconciler(own, bus=InMemoryBus(settings=own), stores=Stores(redis, own))
    run, call_id = f"run-{uuid.uuid4().hex}", "call-1"
    token = await _planned(reconciler.ledger, run, call_id)
    await reconciler.report()
    assert _gauge("toolfleet_unknown_effects_unresolved") == 0
    assert _tasks("unknown_effect") == 0

    # A tool without a probe: the reconciler hands the call to a human.
    await reconciler.on_outcome(_outcome(run, call_id, token))
    await reconciler.on_outcome(_outcome(run, call_id, token))  # a redelivery counts once
    await reconciler.report()
    assert _gauge("toolfleet_unknown_effects_unresolved") == 1
    assert _gauge("toolfleet_unknown_effects_oldest_age_seconds") >= 0
    assert _tasks("unknown_effect") == 1
    assert _tasks("circuit_open") == 0  # every kind has a series

    (task,) = [t for t in await reconciler.tasks.all() if t.status == "open"]
    resolution = TaskResolution(
        tenant_id="t", task_id=task.task.task_id, resolution="applied", output="charged",
        decided_by="test",
    )  # fmt: skip
    await reconciler.on_resolution(DecisionAuth.of(own).sign(resolution))
    await reconciler.report()
    assert _gauge("toolfleet_unknown_effects_unresolved") == 0
    assert _gauge("toolfleet_unknown_effects_oldest_age_seconds") == 0
    assert _tasks("unknown_effect") == 0


async def test_the_sweep_drops_calls_settled_without_the_reconciler(
    own: Settings, redis: Redis
) -> None:
    keys = Keys.of(own)
    ledger = Ledger(redis, keys)
    unknowns = UnknownEffects(redis, keys, ledger)
    run = f"run-{uuid.uuid4().hex}"
    for call_id in ("open", "retried", "started"):
        await _planned(ledger, run, call_id)
    # "open" still has its unknown outcome; "retried" was settled by a retry's new outcome;
    # "started" has no outcome yet (the retry runs); "expired" left the ledger.
    await ledger.resolve(_outcome(run, "open", 1), "reported")
    await ledger.resolve(_outcome(run, "retried", 1, effect="applied"), "resolved_applied")
    now = time.time()
    for n, call_id in enumerate(("open", "retried", "started", "expired")):
        await unknowns.add("t", run, call_id, since=now - 100 + n)
    await unknowns.add("t", run, "open", since=now)  # a later unknown keeps the first time
    assert (await unknowns.backlog(now))[0] == 4
    assert await unknowns.sweep() == 2
    count, oldest_s = await unknowns.backlog(now)
    assert count == 2
    assert oldest_s == pytest.approx(100, abs=1)


async def test_the_sweep_walks_a_big_index_window_by_window(own: Settings, redis: Redis) -> None:
    keys = Keys.of(own)
    ledger = Ledger(redis, keys)
    unknowns = UnknownEffects(redis, keys, ledger)
    run = f"run-{uuid.uuid4().hex}"
    # One run lives in one slot group: three windows' worth, none of it in the ledger.
    calls = [f"gone-{n}" for n in range(3 * SWEEP_PER_GROUP)]
    for n, call_id in enumerate(calls):
        await unknowns.add("t", run, call_id, since=float(n))
    assert await unknowns.sweep() == SWEEP_PER_GROUP
    assert await unknowns.sweep() == SWEEP_PER_GROUP
    assert await unknowns.sweep() == SWEEP_PER_GROUP
    assert await unknowns.backlog(time.time()) == (0, 0.0)
    assert SLOT_GROUPS * SWEEP_PER_GROUP == 1024  # what REPORT_EVERY_S's docstring promises
