"""The concurrency gate of a turn with ``max_concurrency``: at most N calls in flight fleet-wide.

The planner releases a capped turn's calls in model order, the next as each outcome arrives
(``next_to_release`` decides; ``kernel.stores.gates`` keeps its inputs in Redis). Updates
are compare-and-set writes, so a redelivered outcome or a planner taking over a partition
during a rebalance can never release a call twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernel.rules.effects import fails_turn, settles_call
from kernel.stores.gates import GateStore, JsonState
from planner._planning import next_to_release
from schemas import CallOutcome, PlannedCall, TurnPlan


@dataclass(frozen=True)
class Released:
    """What an outcome of a capped turn changes: calls to send, calls that will never start."""

    send: list[PlannedCall]
    never_started: list[PlannedCall]


class Gate:
    """Releases the calls of capped turns; state per turn in ``store``."""

    def __init__(self, store: GateStore) -> None:
        self.store = store
        """Each turn's gate state, living as long as its ledger entries."""

    async def open(self, plan: TurnPlan, dispatch: list[str]) -> list[str]:
        """Create the gate for a new plan (idempotent per epoch); the call_ids to send now."""
        fresh = {
            "epoch": plan.epoch,
            "limit": plan.config.max_concurrency,
            "policy": plan.config.failure_policy,
            "calls": [c.model_dump(mode="json") for c in plan.calls if c.call_id in dispatch],
            "in_flight": [],
            "finished": [],
            "failed": False,
            "cancelled": False,
        }

        def start(state: JsonState | None) -> tuple[dict[str, Any], list[str]]:
            if state is None or state["epoch"] < plan.epoch:
                state = fresh
            elif state["epoch"] > plan.epoch:
                return state, []  # a newer plan of this turn owns the gate
            else:
                # The same plan again (redelivered): resend what was released but may never
                # have been sent; the ledger turns a duplicate command into a no-op.
                return _release(state, resend=True)
            return _release(state)

        await self.store.add_turn(plan.tenant_id, plan.run_id, plan.turn_id)
        _state, released = await self._update(plan.tenant_id, plan.run_id, plan.turn_id, start)
        return [c.call_id for c in released]

    async def on_outcome(self, outcome: CallOutcome) -> Released:
        """Account for a finished call of a capped turn: which calls to send, which to skip."""
        where = (outcome.tenant_id, outcome.run_id, outcome.turn_id)
        if outcome.kind != "execute" or not await self.store.exists(*where):
            return Released(send=[], never_started=[])  # not a capped turn

        def finish(state: JsonState | None) -> tuple[JsonState | None, list[str]]:
            if (
                state is None
                or outcome.kind != "execute"
                or outcome.call_id not in _ids(state["calls"])
            ):
                return state, []
            planned = next(c for c in state["calls"] if c["call_id"] == outcome.call_id)
            if not settles_call(outcome, planned.get("on_unknown", "reconcile_then_report")):
                # Not the call's end (the fleet retries it, or the reconciler settles it): it
                # holds its place and fails nothing yet, as the aggregator waits for it too.
                return state, []
            redelivered = outcome.call_id in state["finished"]
            if not redelivered:
                state["finished"].append(outcome.call_id)
            # The aggregator's own question: a parent cancellation fails no turn.
            fails = fails_turn(outcome, state["policy"], run_cancelled=state["cancelled"])
            newly_failed = fails and not state["failed"]
            state["failed"] = state["failed"] or newly_failed
            if state["failed"] and (newly_failed or redelivered):
                # Queued calls never start after a turn-failing failure; say so, so the
                # aggregator can choose the failure once every call has reported.
                return state, [c for c in _ids(state["calls"]) if c not in state["in_flight"]]
            return _release(state, resend=redelivered)

        state, changed = await self._update(*where, finish)
        if state is not None and state["failed"]:
            return Released(send=[], never_started=changed)
        return Released(send=changed, never_started=[])

    async def cancel_run(self, tenant_id: str, run_id: str) -> None:
        """Parent cancellation: queued calls of every capped turn of the run never start."""
        for turn in await self.store.turns(tenant_id, run_id):

            def cancel(state: JsonState | None) -> tuple[JsonState | None, list[str]]:
                if state is not None:
                    state["cancelled"] = True
                return state, []

            await self._update(tenant_id, run_id, turn, cancel)

    async def _update(
        self,
        tenant_id: str,
        run_id: str,
        turn_id: int,
        change: Callable[[JsonState | None], tuple[JsonState | None, list[str]]],
    ) -> tuple[JsonState | None, list[PlannedCall]]:
        state, released = await self.store.update(tenant_id, run_id, turn_id, change)
        calls = [PlannedCall.model_validate(c) for c in (state or {}).get("calls", [])]
        return state, [c for c in calls if c.call_id in released]


def _ids(calls: list[dict[str, Any]]) -> list[str]:
    return [c["call_id"] for c in calls]


def _release(state: dict[str, Any], *, resend: bool = False) -> tuple[dict[str, Any], list[str]]:
    """Newly released call_ids; with ``resend``, also those released and not yet finished."""
    if state["cancelled"]:
        return state, []
    unfinished = [c for c in state["in_flight"] if c not in state["finished"]] if resend else []
    calls = [PlannedCall.model_validate(c) for c in state["calls"]]
    release = next_to_release(
        calls,
        set(state["in_flight"]),
        set(state["finished"]),
        limit=state["limit"],
        failed=state["failed"],
        policy="fail_turn",  # "failed" is only ever set by a turn-failing outcome
    )
    state["in_flight"] = [*state["in_flight"], *release]
    return state, [*unfinished, *release]
