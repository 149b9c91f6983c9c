"""A ``tools/call`` as a one-call turn on the fleet, for the caller's tenant.

The call goes the way of every FleetClient turn (the planner's ledger before any run, at most
once, admission and fairness for the tenant, approvals, guardrails, the release gate, the
reconciler for an unknown effect): the door only submits a model response with one function
call and waits for that call to settle.

How it waits: it follows the run's outcomes before it submits, and answers with the first
outcome that settles the call (``kernel.rules.effects.settles_call``, the aggregator's own
rule); the turn's result is awaited beside it, for the ends a call outcome does not tell (the
call waits for approval, the turn failed before the call reported). The outcome, not the turn
result, is what a replayed submission (an idempotency key) and another replica can wait on
too: the next steps of the door build on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kernel.errors import UnavailableError
from kernel.rules.effects import settles_call
from kernel.rules.mcp import CallEnd, call_end_of_turn, call_id_of, call_tool_result, run_id_for
from schemas import AgentRef, CallOutcome, ModelResponseEvent, ToolSpec, TurnConfig
from toolfleet.app.mcp._gate import Caller
from toolfleet.client import FleetClient

DOOR_CONFIG = TurnConfig(tool_not_found="return_error_to_model", failure_policy="error_as_output")
"""A door call's turn: a tool gone since the listing is an error result (the SDK's text),
and a failed call's error is its output, as an MCP tool result says it."""


@dataclass(frozen=True)
class CallLimits:
    """How long the door waits for a call."""

    wait_s: float = 24 * 3600.0
    """A plain call's longest wait for its call to settle: the client's own timeout is the
    one that counts (a client that goes away ends the wait)."""


class Calls:
    """Runs ``tools/call`` requests as one-call turns through a started ``FleetClient``."""

    def __init__(self, client: FleetClient, limits: CallLimits | None = None) -> None:
        self.client = client
        self.limits = limits or CallLimits()

    async def call(
        self,
        caller: Caller,
        spec: ToolSpec,
        arguments: Mapping[str, Any] | None,
        *,
        run_id: str | None = None,
    ) -> dict[str, Any]:
        """Run one call of ``spec`` for ``caller``'s tenant, in a run of its own (``run_id``,
        a fresh one when None); its ``CallToolResult`` (wire names) once it settled."""
        run_id = run_id or run_id_for(caller.tenant, None)
        return await self.settle(spec, run_id, submit=event_for(caller, spec, arguments, run_id))

    async def settle(
        self,
        spec: ToolSpec,
        run_id: str,
        *,
        submit: ModelResponseEvent | None = None,
        submitted: Callable[[], Awaitable[Any]] | None = None,
    ) -> dict[str, Any]:
        """The ``CallToolResult`` of the call of ``run_id`` once it settled, submitting
        ``submit`` first (the call's model response) when given, and calling ``submitted``
        once it is published.

        The run's outcomes are followed before anything is submitted, so none is missed. A
        call that settled before this was called (a retried call, another replica's) is not
        seen here: reading it from the ledger is the caller's part (tasks, idempotency keys).
        """
        loop = asyncio.get_running_loop()
        settled: asyncio.Future[CallOutcome] = loop.create_future()
        call_id = call_id_of(run_id)

        def on_outcome(outcome: CallOutcome) -> None:
            if (
                outcome.call_id == call_id
                and outcome.kind == "execute"
                and settles_call(outcome, spec.on_unknown)
                and not settled.done()
            ):
                settled.set_result(outcome)

        tenant = submit.tenant_id if submit is not None else None
        stop = await self.client.follow(run_id, 0, on_outcome, tenant_id=tenant)
        turn: asyncio.Task[Any] | None = None
        try:
            if submit is not None:
                await self.client.submit(submit)
                if submitted is not None:
                    await submitted()
            else:
                self.client.expect(run_id, 0)
            turn = asyncio.create_task(
                self.client.result(run_id, 0, within=self.limits.wait_s, tenant_id=tenant)
            )
            await asyncio.wait({settled, turn}, return_when=asyncio.FIRST_COMPLETED)
            if settled.done():
                return call_tool_result(settled.result())
            try:
                result = turn.result()
            except UnavailableError as exc:  # no result within the wait
                return _no_answer(run_id, str(exc))
            return call_tool_result(call_end_of_turn(result, spec.lookup_key))
        finally:
            stop()
            if turn is not None and not turn.done():
                turn.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await turn


def event_for(
    caller: Caller, spec: ToolSpec, arguments: Mapping[str, Any] | None, run_id: str
) -> ModelResponseEvent:
    """The model response a ``tools/call`` becomes: turn 0 of ``run_id``, one function call
    ``c0`` of ``spec``, for the caller's tenant, its agent named after the caller."""
    return event_of(
        caller.tenant,
        run_id,
        created_by=caller.identity.name,
        name=spec.name,
        namespace=spec.namespace,
        arguments=arguments,
    )


def event_of(
    tenant_id: str,
    run_id: str,
    *,
    created_by: str,
    name: str,
    namespace: str | None,
    arguments: Mapping[str, Any] | None = None,
    arguments_json: str | None = None,
) -> ModelResponseEvent:
    """The model response of a door call (``event_for``), from what the door recorded of it:
    the same every time, so publishing it again is a replay the planner's ledger dedupes."""
    text = arguments_json if arguments_json is not None else json.dumps(dict(arguments or {}))
    return ModelResponseEvent(
        tenant_id=tenant_id,
        run_id=run_id,
        turn_id=0,
        agent=AgentRef(name=f"mcp:{created_by}"),
        response_id=f"resp-{run_id}",
        items=[
            {
                "type": "function_call",
                "call_id": call_id_of(run_id),
                "name": name,
                "namespace": namespace,
                "arguments": text,
            }
        ],
        config=DOOR_CONFIG,
    )


def _no_answer(run_id: str, why: str) -> dict[str, Any]:
    """The door gave up waiting: the call may still run, so its effect is unknown."""
    return call_tool_result(CallEnd(run_id, "timed_out", "unknown", why, 0, False))
