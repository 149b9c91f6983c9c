"""The invariants a simulated world must hold at its end, and the states it reached.

- no upstream effect applied twice by the fleet's own action (per idempotency key, and per call);
- every submission of a turn (resuming it is one more) ends with exactly one result, or waits
  on a recorded human task; no turn is left interrupted once its calls were decided;
- no call's recorded effect contradicts the upstream (applied is there, not_executed is not);
- no tenant's call acts for, or answers with, another tenant (runs and call ids are shared);
- no decision of one tenant changes another's call: a call that needs approval applies only
  once its own tenant approved it, and a run ends cancelled only if its own tenant cancelled it;
- nothing dead-lettered; no slot left held once everything settled.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from kernel.stores.circuit import parse_task_call_ref
from kernel.stores.door import Stores
from schemas import CallOutcome, ModelResponseEvent, TurnResult

if TYPE_CHECKING:
    from toolfleet.testing.sim._world import World


def _results(world: World) -> dict[tuple[str, str, int], list[TurnResult]]:
    """Every turn's results, in the order they were emitted."""
    found: dict[tuple[str, str, int], list[TurnResult]] = {}
    for record in world.broker.read(world.settings.topic("turn-results")):
        result = TurnResult.decode(record.value or b"")
        found.setdefault((result.tenant_id, result.run_id, result.turn_id), []).append(result)
    return found


async def _waiting_on_people(world: World, count: bool = False) -> set[tuple[str, str, str]]:
    """(tenant, run, call) of every call an open human task holds (``count``: count the
    tasks' kinds among the states reached)."""
    tasks = (
        await Stores(world.state.client("checker", observer=True)[0], world.settings).tasks().all()
    )
    held: set[tuple[str, str, str]] = set()
    for stored in tasks:
        task = stored.task
        if stored.status != "open":
            continue
        if count:
            world.states[f"task {task.kind}"] += 1
        if task.run_id is not None and task.call_id is not None:
            held.add((task.tenant_id, task.run_id, task.call_id))
        for ref in task.calls:
            run, call = parse_task_call_ref(ref)
            if run is not None:
                held.add((task.tenant_id, run, call))
    return held


def _turn_calls(world: World) -> dict[tuple[str, str, int], list[str]]:
    return {
        (e.tenant_id, e.run_id, e.turn_id): [str(getattr(item, "call_id", "")) for item in e.items]
        for e in world.events
    }


def _records(world: World) -> Counter[tuple[str, str, int]]:
    """How many results each turn may have: one for its first response (written twice, it is
    one: the fleet plans a turn once), one for each resumed response in the log. A resumed
    response written twice may get two: nothing tells it from the runtime resuming again with
    the same response. toolfleet's producers are idempotent and never write a record twice;
    the simulator does, to reach the duplicates a consumer must survive."""
    found: Counter[tuple[str, str, int]] = Counter()
    for record in world.broker.read(world.settings.topic("model-responses")):
        event = ModelResponseEvent.decode(record.value or b"")
        turn = (event.tenant_id, event.run_id, event.turn_id)
        if event.resume or not found[turn]:
            found[turn] += 1
    return found


def _answered(results: list[TurnResult], submissions: int) -> bool:
    """Whether each submission of a turn has its result, and the last is not interrupted
    (the agent runtime submits an interrupted turn again)."""
    return bool(results) and len(results) >= submissions and results[-1].status != "interrupted"


async def slots_held(world: World) -> dict[str, int]:
    """The admission counts still held: t:TENANT, o:TOOL, p:POOL (admitted:TENANT, which
    counts admissions ever made, left out)."""
    stores = Stores(world.state.client("checker", observer=True)[0], world.settings)
    running = await stores.admission().running()
    return {k: v for k, v in running.items() if v and not k.startswith("admitted:")}


async def settled(world: World) -> bool:
    """Whether every turn has its results or a call a person must look at."""
    results, submitted = _results(world), world.submitted
    calls = _turn_calls(world)
    pending = [t for t in calls if not _answered(results.get(t, []), submitted[t])]
    if not pending:
        return True
    held = await _waiting_on_people(world)
    return all(any((t, r, c) in held for c in calls[(t, r, n)]) for t, r, n in pending)


async def check(world: World) -> list[str]:
    """Every violation of the invariants (empty: the seed passed); fills ``world.states``."""
    violations: list[str] = []
    results, records = _results(world), _records(world)
    held = await _waiting_on_people(world, count=True)
    calls = _turn_calls(world)
    for (tenant, run, turn), ids in calls.items():
        emitted = results.get((tenant, run, turn), [])
        submitted = world.submitted[(tenant, run, turn)]
        if len(emitted) > records[(tenant, run, turn)]:
            violations.append(
                f"{tenant}/{run} turn {turn}: {len(emitted)} results emitted for {submitted} "
                "submissions"
            )
        elif any((tenant, run, c) in held for c in ids):
            continue  # waits on a person
        elif len(emitted) < submitted:
            violations.append(f"{tenant}/{run} turn {turn}: no result and no human task")
        elif emitted[-1].status == "interrupted":
            violations.append(f"{tenant}/{run} turn {turn}: still interrupted once decided")
    violations += _effects(world)
    violations += _upstream(world)
    for record, reason, service in world.broker.dead_letters:
        violations.append(f"{service} dead-lettered a record of {record.topic}: {reason}")
    violations += _decided_by_their_tenant(world, results)
    violations += world.crossed  # what the client handed the runtime of another tenant
    stores = Stores(world.state.client("checker", observer=True)[0], world.settings)
    if all(_answered(results.get(t, []), world.submitted[t]) for t in calls):
        running = await slots_held(world)
        if running:
            violations.append(f"slots still held after every turn settled: {running}")
    await _ledger_states(world, stores)
    return violations


def _effects(world: World) -> list[str]:
    """Recorded effects against the upstream's truth, and tenants against their outputs."""
    violations = []
    applied = {(a[0], a[2], a[3], a[4]) for a in world.upstream.applied}
    for record in world.broker.read(world.settings.topic("turn-results")):
        result = TurnResult.decode(record.value or b"")
        world.states[f"turn {result.status}"] += 1
        others = [t for t in ("acme", "globex") if t != result.tenant_id]
        for output in result.outputs:
            if any(output.output.startswith(f"{other}:") for other in others):
                violations.append(
                    f"{result.tenant_id}/{result.run_id}: another tenant's output {output.output!r}"
                )
        for call in result.calls:
            world.states[f"call {call.status}/{call.effect}"] += 1
            if call.tool_name == "lookup" or call.status == "pending_approval":
                continue  # a read; or a call that waited, and may run once approved
            there = (call.tool_name, result.tenant_id, result.run_id, call.call_id) in applied
            if call.effect == "applied" and not there:
                violations.append(
                    f"{result.tenant_id}/{result.run_id}/{call.call_id}: recorded applied, "
                    "the upstream has no such effect"
                )
            if call.effect == "not_executed" and there:
                violations.append(
                    f"{result.tenant_id}/{result.run_id}/{call.call_id}: recorded not_executed, "
                    "the upstream applied it"
                )
    for record in world.broker.read(world.settings.topic("outcomes")):
        outcome = CallOutcome.decode(record.value or b"")
        world.states[f"outcome {outcome.status}/{outcome.effect}"] += 1
    return violations


def _decided_by_their_tenant(
    world: World, results: dict[tuple[str, str, int], list[TurnResult]]
) -> list[str]:
    """A call that needs approval applied only with its own tenant's approval; a run ended
    cancelled only by its own tenant's cancellation (runs and call ids are shared)."""
    violations = []
    for tool, _key, tenant, run, call in world.upstream.applied:
        if tool == "refund" and world.decisions.get((tenant, run, call)) is not True:
            violations.append(f"{tenant}/{run}/{call}: refunded without its tenant's approval")
    for (tenant, run, turn), emitted in results.items():
        if (tenant, run) not in world.cancelled and any(r.status == "cancelled" for r in emitted):
            violations.append(f"{tenant}/{run} turn {turn}: cancelled, though its tenant was not")
    return violations


def _upstream(world: World) -> list[str]:
    """No effect twice under one key or for one call; a key acts for one tenant's call only."""
    violations = []
    by_key = Counter((a[0], a[1]) for a in world.upstream.applied)
    by_call = Counter((a[0], a[2], a[3], a[4]) for a in world.upstream.applied)
    owners: dict[str, set[tuple[str, str, str]]] = {}
    for _tool, key, tenant, run, call in world.upstream.applied:
        owners.setdefault(key, set()).add((tenant, run, call))
    for (tool, key), n in by_key.items():
        if n > 1:
            violations.append(f"{tool} applied {n} times under idempotency key {key}")
    for (tool, tenant, run, call), n in by_call.items():
        if n > 1:
            violations.append(f"{tool} applied {n} times for {tenant}/{run}/{call}")
    for key, who in owners.items():
        if len(who) > 1:
            violations.append(f"idempotency key {key} acted for several calls: {sorted(who)}")
    return violations


async def _ledger_states(world: World, stores: Stores) -> None:
    ledger = stores.ledger()
    for event in world.events:
        ids = [str(getattr(item, "call_id", "")) for item in event.items]
        for entry in (await ledger.read(event.tenant_id, event.run_id, ids)).values():
            effect = entry.outcome.effect if entry.outcome is not None else "none"
            world.states[f"ledger {entry.state}/{effect}"] += 1
    for what, n in world.broker.counts.items():
        world.states[f"log {what}"] += n
