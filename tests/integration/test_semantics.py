"""docs/sdk-lifecycle.md, end to end: one test per rule.

Real broker, real Redis, planner + aggregator + two worker processes serving
tests/integration/fleet_tools.py. Whatever user code runs (tool bodies, approval callables,
hooks) counts itself in Redis per call_id, so "ran once" and "never ran" are facts read back
from Redis, not inferred from outputs. Nothing waits with a fixed sleep: state is polled with
deadlines (``wait_for``); only tools sleep, to simulate work.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pytest
from redis.asyncio import Redis

from kernel.settings import LEDGER_RETENTION_S, Settings
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger, LedgerEntry
from schemas import ApprovalDecision, CancelRequest, ModelResponseEvent, TurnResult
from tests.conftest import wait_for
from tests.integration.fleet_tools import (
    approval_checks_key,
    effects_key,
    hook_key,
    starts_key,
    timing_key,
)
from tests.integration.test_pipeline import outputs, turn
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client

pytestmark = pytest.mark.integration

TOOLS = "tests.integration.fleet_tools:tools"
TENANT = "acme"  # what turn() uses

TOOL_ERROR = "An error occurred while running the tool. Please try again."
NOT_APPROVED = "Tool execution was not approved."
REUSED_IN_RESPONSE = (
    "Model reused a tool call ID for a different invocation in one response. "
    "Use a unique call ID for each tool invocation."
)
REUSED_COMPLETED = (
    "Model reused a completed tool call ID for a different invocation. "
    "Use a unique call ID for each tool invocation."
)
EMPTY_ID = "Tool invocations require a non-empty string call ID before execution."
NOT_COMMITTED = (
    "A tool call already executed, but its output was not committed. "
    "Start a new run instead of retrying the invocation."
)


# --- fixtures (the pattern of test_pipeline.py: one fleet for the module) --------------------
@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    # Failing on purpose is what these tools are for: never let them open their circuit.
    never_open = {"TOOLFLEET_CIRCUIT_MIN_CALLS": str(10**9)}
    # Spans as log lines, so a test can count them in the workers' logs.
    env = {**never_open, "TOOLFLEET_TRACES": "log"}
    with LocalFleet(settings, tools=TOOLS, workers=2, extra_env=env) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


# --- helpers -------------------------------------------------------------------------------
def cid(event: ModelResponseEvent, suffix: str) -> str:
    """The full call_id turn() gave the call ``suffix``."""
    return f"{event.run_id}-{suffix}"


def later_turn(
    event: ModelResponseEvent, turn_id: int, *calls: tuple[str, str, Any], **config: Any
) -> ModelResponseEvent:
    """A later model response of the same run (same call_id scheme)."""
    return turn(*calls, run_id=event.run_id, **config).model_copy(update={"turn_id": turn_id})


def turn_error(result: TurnResult) -> tuple[str, str, str | None]:
    """(type, message, call_id) of a failed turn's error; fails unless the turn failed."""
    assert result.status == "failed", result
    assert result.error is not None
    return result.error.type, result.error.message, result.error.call_id


def resumed(event: ModelResponseEvent) -> ModelResponseEvent:
    """The same model response, re-submitted after approvals."""
    return event.model_copy(update={"resume": True})


@dataclass(frozen=True)
class Store:
    """The session's Redis: the tools' counters, and the fleet's own state under its keys."""

    redis: Redis
    keys: Keys

    async def count(self, key: str) -> int:
        return int(await self.redis.get(key) or 0)

    async def entry(self, call_id: str) -> LedgerEntry | None:
        """The call's ledger entry, if the planner ever recorded it (turn() names a call
        ``<run>-<suffix>``)."""
        run_id = call_id.rsplit("-", 1)[0]
        return (await Ledger(self.redis, self.keys).read(TENANT, run_id, [call_id])).get(call_id)

    async def has_decision(self, run_id: str, call_id: str) -> bool:
        """Whether the planner stored an approval decision for the call."""
        return bool(
            await self.redis.hexists(self.keys.approvals(TENANT, run_id), f"call:{call_id}")
        )


@pytest.fixture
def store(redis: Redis, settings: Settings) -> Store:
    return Store(redis, Keys.of(settings))


async def decide(
    client: FleetClient,
    store: Store,
    event: ModelResponseEvent,
    suffix: str,
    tool: str,
    *,
    approve: bool,
    message: str | None = None,
    sticky: Literal["always_approve", "always_reject"] | None = None,
) -> None:
    """Publish a decision and wait until the planner stored it (approvals and responses are
    different topics: without this, a resume could overtake its own decision)."""
    call_id = cid(event, suffix)
    await client.decide(
        ApprovalDecision(
            tenant_id=TENANT,
            run_id=event.run_id,
            call_id=call_id,
            tool_name=tool,
            approve=approve,
            message=message,
            sticky=sticky,
            decided_by="test",
        )
    )

    async def stored() -> bool:
        return await store.has_decision(event.run_id, call_id)

    await wait_for(stored, within=10)


def interrupted(result: TurnResult) -> list[tuple[str, str]]:
    return [(i.call_id.rsplit("-", 1)[-1], i.tool_name) for i in result.interruptions]


def records(result: TurnResult) -> list[tuple[str, str, str]]:
    return [(c.call_id.rsplit("-", 1)[-1], c.status, c.effect) for c in result.calls]


# --- plan before side effects; dedupe by invocation identity -------------------------------
async def test_plan_before_side_effects_a_bad_response_runs_nothing(
    client: FleetClient, store: Store
) -> None:
    # The good call comes FIRST in model order: a planner that acted call by call would run it.
    event = turn(
        ("a", "sleep_then_echo", {"text": "side effect"}),
        ("b", "sleep_then_echo", {"text": "x"}),
        ("b", "sleep_then_echo", {"text": "y"}),
    )
    result = await client.run_turn(event)
    assert result.status == "failed", result
    assert result.error is not None and result.error.message == REUSED_IN_RESPONSE
    assert result.outputs == []
    # Nothing was even recorded, so nothing could ever be dispatched: no ledger entry at all.
    for suffix in ("a", "b"):
        assert await store.entry(cid(event, suffix)) is None
        assert await store.count(effects_key(cid(event, suffix))) == 0


async def test_same_id_same_fingerprint_in_one_response_runs_once(
    client: FleetClient, store: Store
) -> None:
    # Same invocation, written differently: whitespace and key order never matter.
    event = turn(
        ("a", "sleep_then_echo", {"text": "once", "ms": 50}),
        ("a", "sleep_then_echo", '{ "ms": 50,\n "text": "once" }'),
        ("b", "add", {"a": 1, "b": 2}),
    )
    result = await client.run_turn(event)
    assert result.status == "completed", result
    assert outputs(result) == [("a", "once"), ("b", "3")]
    assert await store.count(effects_key(cid(event, "a"))) == 1


async def test_same_id_different_content_in_one_response_fails_the_turn(
    client: FleetClient, store: Store
) -> None:
    event = turn(("a", "add", {"a": 1, "b": 2}), ("a", "add", {"a": 1, "b": 3}))
    result = await client.run_turn(event)
    assert turn_error(result) == (
        "ModelBehaviorError",
        REUSED_IN_RESPONSE,
        cid(event, "a"),
    )
    assert await store.entry(cid(event, "a")) is None


async def test_completed_id_same_identity_reuses_the_committed_output(
    client: FleetClient, store: Store
) -> None:
    first = turn(("a", "sleep_then_echo", {"text": "committed"}))
    assert outputs(await client.run_turn(first)) == [("a", "committed")]
    # The next model response repeats the call (reformatted) next to a new one.
    second = later_turn(
        first,
        1,
        ("a", "sleep_then_echo", '{"text":   "committed"}'),
        ("b", "sleep_then_echo", {"text": "new"}),
    )
    result = await client.run_turn(second)
    assert result.status == "completed", result
    assert outputs(result) == [("a", "committed"), ("b", "new")]
    assert await store.count(effects_key(cid(first, "a"))) == 1  # not run again
    assert await store.count(effects_key(cid(first, "b"))) == 1


async def test_an_identical_call_still_running_for_an_earlier_turn_is_attached_not_rerun(
    client: FleetClient, store: Store
) -> None:
    first = turn(("a", "hold", {"ms": 800}))
    await client.submit(first)
    await wait_for(lambda: store.redis.exists(starts_key(cid(first, "a"))), within=30)
    second = later_turn(first, 1, ("a", "hold", {"ms": 800}), ("b", "add", {"a": 1, "b": 1}))
    later = await client.run_turn(second)
    earlier = await client.result(first.run_id, 0)
    assert outputs(earlier) == [("a", "held")]
    assert outputs(later) == [("a", "held"), ("b", "2")]
    assert await store.count(effects_key(cid(first, "a"))) == 1


async def test_completed_id_different_identity_fails_the_turn(
    client: FleetClient, store: Store
) -> None:
    first = turn(("a", "sleep_then_echo", {"text": "committed"}))
    assert outputs(await client.run_turn(first)) == [("a", "committed")]
    second = later_turn(
        first,
        1,
        ("b", "sleep_then_echo", {"text": "new"}),
        ("a", "sleep_then_echo", {"text": "something else"}),
    )
    result = await client.run_turn(second)
    assert turn_error(result)[1:] == (REUSED_COMPLETED, cid(first, "a"))
    assert await store.count(effects_key(cid(first, "a"))) == 1
    assert await store.entry(cid(first, "b")) is None  # plan before side effects


async def test_executed_id_without_a_committed_output_is_never_reused(
    client: FleetClient, store: Store
) -> None:
    # The call ran and failed the turn: it has no committed output to reuse (lifecycle item 4).
    first = turn(("a", "strict_boom", {"message": "kaput"}))
    assert (await client.run_turn(first)).status == "failed"
    again = later_turn(first, 1, ("a", "strict_boom", {"message": "kaput"}))
    result = await client.run_turn(again)
    assert turn_error(result)[1:] == (NOT_COMMITTED, cid(first, "a"))
    assert result.outputs == []
    assert await store.count(effects_key(cid(first, "a"))) == 1


async def test_empty_call_id_fails_the_turn(client: FleetClient, store: Store) -> None:
    event = turn(("a", "sleep_then_echo", {"text": "x"}), ("", "add", {"a": 1, "b": 2}))
    result = await client.run_turn(event)
    assert turn_error(result)[:2] == ("ModelBehaviorError", EMPTY_ID)
    assert await store.entry(cid(event, "a")) is None


# --- approvals -----------------------------------------------------------------------------
async def test_a_call_needing_approval_interrupts_the_turn(
    client: FleetClient, store: Store
) -> None:
    event = turn(("a", "approve_me", {"name": "prod"}), ("b", "timed_work", {"text": "ok"}))
    result = await client.run_turn(event)
    assert result.status == "interrupted", result
    assert interrupted(result) == [("a", "approve_me")]
    assert result.interruptions[0].arguments == json.dumps({"name": "prod"})
    assert outputs(result) == [("b", "ok")]  # a sibling that needs no approval runs
    assert await store.count(effects_key(cid(event, "a"))) == 0


async def test_an_approved_call_runs_when_the_turn_is_resumed(
    client: FleetClient, store: Store
) -> None:
    event = turn(("a", "approve_me", {"name": "prod"}), ("b", "timed_work", {"text": "ok"}))
    assert (await client.run_turn(event)).status == "interrupted"
    await decide(client, store, event, "a", "approve_me", approve=True)
    result = await client.run_turn(resumed(event))
    assert result.status == "completed", result
    assert result.interruptions == []
    assert outputs(result) == [("a", "done prod"), ("b", "ok")]
    assert await store.count(effects_key(cid(event, "a"))) == 1
    assert await store.count(effects_key(cid(event, "b"))) == 1  # not re-run on resume
    # Retention: b's plain run expires after the window (once its worker committed it); a's
    # approval keeps it for good; the run's decisions last as long as its calls.
    redis, keys = store.redis, store.keys

    async def b_expires() -> bool:
        return (
            0
            < await redis.ttl(keys.call(TENANT, event.run_id, cid(event, "b")))
            <= LEDGER_RETENTION_S
        )

    await wait_for(b_expires)
    assert await redis.ttl(keys.call(TENANT, event.run_id, cid(event, "a"))) == -1
    assert 0 < await redis.ttl(keys.approvals(TENANT, event.run_id)) <= LEDGER_RETENTION_S


async def test_a_rejected_call_gets_the_rejection_text_and_never_runs(
    client: FleetClient, store: Store
) -> None:
    event = turn(("a", "approve_me", {"name": "x"}), ("b", "approve_me", {"name": "y"}))
    first = await client.run_turn(event)
    assert interrupted(first) == [("a", "approve_me"), ("b", "approve_me")]
    await decide(client, store, event, "a", "approve_me", approve=False)
    await decide(client, store, event, "b", "approve_me", approve=False, message="Not today.")
    result = await client.run_turn(resumed(event))
    assert result.status == "completed", result
    assert outputs(result) == [("a", NOT_APPROVED), ("b", "Not today.")]
    assert records(result) == [("a", "rejected", "not_executed"), ("b", "rejected", "not_executed")]
    for suffix in ("a", "b"):
        assert await store.count(effects_key(cid(event, suffix))) == 0


async def test_sticky_always_approve_approves_later_calls_of_the_same_tool(
    client: FleetClient, store: Store
) -> None:
    event = turn(("a", "approve_me", {"name": "first"}), ("b", "approve_me", {"name": "twin"}))
    assert len((await client.run_turn(event)).interruptions) == 2
    # One sticky decision covers the other pending call of the tool too.
    await decide(client, store, event, "a", "approve_me", approve=True, sticky="always_approve")
    assert outputs(await client.run_turn(resumed(event))) == [
        ("a", "done first"),
        ("b", "done twin"),
    ]
    # Later calls of the tool in the same run: no interruption.
    later = later_turn(event, 1, ("c", "approve_me", {"name": "second"}))
    result = await client.run_turn(later)
    assert result.status == "completed", result
    assert outputs(result) == [("c", "done second")]
    assert await store.count(effects_key(cid(event, "c"))) == 1


async def test_sticky_always_reject_rejects_later_calls_with_its_message(
    client: FleetClient, store: Store
) -> None:
    event = turn(("a", "approve_me", {"name": "first"}))
    assert (await client.run_turn(event)).status == "interrupted"
    await decide(
        client,
        store,
        event,
        "a",
        "approve_me",
        approve=False,
        message="No.",
        sticky="always_reject",
    )
    assert outputs(await client.run_turn(resumed(event))) == [("a", "No.")]
    later = later_turn(event, 1, ("b", "approve_me", {"name": "second"}))
    result = await client.run_turn(later)
    assert result.status == "completed", result
    assert outputs(result) == [("b", "No.")]
    assert await store.count(effects_key(cid(event, "b"))) == 0


async def test_needs_approval_callable_is_asked_at_most_once_per_call(
    client: FleetClient, store: Store
) -> None:
    event = turn(
        ("a", "payout", {"amount": 500}),
        ("b", "payout", {"amount": 5}),
        ("c", "payout", {"amount": 700}),
    )
    first = await client.run_turn(event)
    assert first.status == "interrupted", first
    assert interrupted(first) == [("a", "payout"), ("c", "payout")]
    assert outputs(first) == [("b", "paid 5")]
    await decide(client, store, event, "a", "payout", approve=True)
    await decide(client, store, event, "c", "payout", approve=False)
    result = await client.run_turn(resumed(event))
    assert result.status == "completed", result
    assert outputs(result) == [("a", "paid 500"), ("b", "paid 5"), ("c", NOT_APPROVED)]
    for suffix in ("a", "b", "c"):  # asked once each; never again once decided
        assert await store.count(approval_checks_key(cid(event, suffix))) == 1
    assert [await store.count(effects_key(cid(event, s))) for s in "abc"] == [1, 1, 0]


async def test_callable_needs_approval_with_unparseable_arguments_fails_closed(
    client: FleetClient, store: Store
) -> None:
    event = turn(("a", "payout", '{"amount": 5'), ("b", "payout", '{"amount": "five"}'))
    result = await client.run_turn(event)
    assert result.status == "interrupted", result
    assert interrupted(result) == [("a", "payout"), ("b", "payout")]
    assert result.outputs == []
    for suffix in ("a", "b"):
        assert await store.count(approval_checks_key(cid(event, suffix))) == 0
        assert await store.count(effects_key(cid(event, suffix))) == 0


# --- guardrails ----------------------------------------------------------------------------
async def test_input_guardrail_reject_content_is_the_output_and_the_tool_never_runs(
    client: FleetClient, store: Store
) -> None:
    event = turn(
        ("a", "screened_echo", {"text": "my secret"}), ("b", "screened_echo", {"text": "hi"})
    )
    result = await client.run_turn(event)
    assert result.status == "completed", result
    assert outputs(result) == [("a", "Refusing to echo secrets."), ("b", "hi")]
    assert records(result)[0] == ("a", "rejected", "not_executed")
    assert await store.count(effects_key(cid(event, "a"))) == 0


async def test_input_guardrail_raise_exception_fails_the_turn(
    client: FleetClient, store: Store
) -> None:
    event = turn(("a", "screened_echo", {"text": "trip"}))
    result = await client.run_turn(event)
    assert turn_error(result) == (
        "ToolInputGuardrailTripwireTriggered",
        "Tool input guardrail input_screen triggered tripwire",
        cid(event, "a"),
    )
    assert result.outputs == []
    assert await store.count(effects_key(cid(event, "a"))) == 0


async def test_output_guardrail_reject_content_replaces_the_output(
    client: FleetClient, store: Store
) -> None:
    event = turn(("a", "screened_echo", {"text": "classified doc"}))
    result = await client.run_turn(event)
    assert result.status == "completed", result
    assert outputs(result) == [("a", "Output withheld.")]
    assert records(result) == [("a", "rejected", "applied")]  # it ran: the effect stays
    assert await store.count(effects_key(cid(event, "a"))) == 1


async def test_output_guardrail_raise_exception_fails_the_turn(
    client: FleetClient, store: Store
) -> None:
    event = turn(("a", "screened_echo", {"text": "explode"}))
    result = await client.run_turn(event)
    assert turn_error(result)[:2] == (
        "ToolOutputGuardrailTripwireTriggered",
        "Tool output guardrail output_screen triggered tripwire",
    )
    assert result.outputs == []


async def test_pre_approval_guardrails_run_input_guardrails_before_the_interruption(
    client: FleetClient, store: Store
) -> None:
    # Without the option, a call needing approval is interrupted whatever its arguments.
    plain = turn(("a", "screened_approval", {"text": "my secret"}))
    result = await client.run_turn(plain)
    assert result.status == "interrupted", result
    assert interrupted(result) == [("a", "screened_approval")]
    # ... and its input guardrails still run right before invocation, once approved.
    await decide(client, store, plain, "a", "screened_approval", approve=True)
    result = await client.run_turn(resumed(plain))
    assert outputs(result) == [("a", "Refusing to echo secrets.")]
    assert await store.count(effects_key(cid(plain, "a"))) == 0
    # With it, the guardrail decides first: its rejection is the output, no approval asked.
    event = turn(
        ("a", "screened_approval", {"text": "my secret"}),
        ("b", "screened_approval", {"text": "fine"}),
        pre_approval_guardrails=True,
    )
    result = await client.run_turn(event)
    assert result.status == "interrupted", result
    assert interrupted(result) == [("b", "screened_approval")]
    assert outputs(result) == [("a", "Refusing to echo secrets.")]
    await decide(client, store, event, "b", "screened_approval", approve=True)
    result = await client.run_turn(resumed(event))
    assert result.status == "completed", result
    assert outputs(result) == [("a", "Refusing to echo secrets."), ("b", "fine")]
    assert await store.count(effects_key(cid(event, "a"))) == 0
    assert await store.count(effects_key(cid(event, "b"))) == 1


# --- hooks ---------------------------------------------------------------------------------
async def test_hooks_and_spans_run_exactly_once_per_call(
    fleet: LocalFleet, client: FleetClient, store: Store
) -> None:
    event = turn(
        ("a", "timed_work", {"text": "ok", "ms": 50}),
        ("a", "timed_work", {"text": "ok", "ms": 50}),  # merged duplicate: still one call
        ("b", "boom", {"message": "handled"}),
        ("c", "screened_echo", {"text": "my secret"}),  # rejected before it starts
        ("d", "approve_me", {"name": "x"}),  # pending
    )
    assert (await client.run_turn(event)).status == "interrupted"
    await decide(client, store, event, "d", "approve_me", approve=True)
    result = await client.run_turn(resumed(event))
    assert result.status == "completed", result
    # A later turn repeating the completed call reuses it: no hooks.
    again = later_turn(event, 1, ("a", "timed_work", {"text": "ok", "ms": 50}))
    assert outputs(await client.run_turn(again)) == [("a", "ok")]

    async def hooks(suffix: str) -> tuple[int, int]:
        call_id = cid(event, suffix)
        return (
            await store.count(hook_key("start", call_id)),
            await store.count(hook_key("end", call_id)),
        )

    assert await hooks("a") == (1, 1)
    assert await hooks("b") == (1, 1)  # a handled failure's text is the accepted output
    assert await hooks("c") == (0, 0)
    assert await hooks("d") == (1, 1)  # once, after approval; none while pending

    def spans(suffix: str) -> int:
        """The call spans of a started attempt of the call (a pending call's span says it
        did not start)."""
        call_id = cid(event, suffix)
        return sum(
            1
            for n in range(2)
            for line in fleet.logs(f"worker-{n}").splitlines()
            if '"msg": "spans"' in line
            for span in json.loads(line)["spans"]
            if span.get("toolfleet.call_id") == call_id and span.get("toolfleet.started")
        )

    async def all_exported() -> bool:  # spans are exported in batches, every 0.2 s
        return all(spans(s) for s in "abcd")

    await wait_for(all_exported)
    # One span per call that started (a guardrail rejection happens after the start).
    assert [spans(s) for s in "abcd"] == [1, 1, 1, 1]


# --- order and concurrency -----------------------------------------------------------------
async def test_outputs_in_model_order_whatever_the_finish_order(
    client: FleetClient, store: Store
) -> None:
    event = turn(
        ("a", "timed_work", {"text": "first", "ms": 600}),
        ("b", "timed_work", {"text": "second", "ms": 0}),
        ("c", "timed_work", {"text": "third", "ms": 300}),
    )
    result = await client.run_turn(event)
    assert result.status == "completed", result
    assert outputs(result) == [("a", "first"), ("b", "second"), ("c", "third")]
    ends = {s: float(await store.redis.hget(timing_key(cid(event, s)), "end") or 0) for s in "abc"}
    assert ends["b"] < ends["c"] < ends["a"]  # they really finished in the reverse order


async def test_max_concurrency_starts_calls_in_model_order_at_most_n_at_once(
    client: FleetClient, store: Store
) -> None:
    n, calls = 2, 6
    suffixes = [f"c{i}" for i in range(calls)]
    event = turn(*((s, "timed_work", {"text": s, "ms": 300}) for s in suffixes), max_concurrency=n)
    result = await client.run_turn(event)
    assert result.status == "completed", result
    assert outputs(result) == [(s, s) for s in suffixes]
    spans = []
    for s in suffixes:
        timing = await store.redis.hgetall(timing_key(cid(event, s)))
        spans.append((float(timing[b"start"]), float(timing[b"end"])))
    # At most n bodies at once, fleet-wide (and the cap is used: n do overlap).
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = list(itertools.accumulate(delta for _, delta in events))
    assert max(running) == n
    # Calls are released in model order, and a queued one only once a slot freed up. (Not
    # "started in model order": two released calls run on two workers, and either may get
    # going first; the release order is what the planner guarantees, as the SDK's does.)
    released = [
        float(
            await store.redis.hget(
                store.keys.call(TENANT, event.run_id, cid(event, s)), "dispatched_at"
            )
        )
        for s in suffixes
    ]
    assert released == sorted(released)
    for j in range(n, calls):
        assert all(released[i] < released[j] for i in range(j - n + 1))
        ended_before = sum(1 for _, end in spans if end <= spans[j][0])
        assert ended_before >= j - n + 1


# --- sibling isolation and failure choice --------------------------------------------------
async def test_a_failed_call_never_discards_a_siblings_output(client: FleetClient) -> None:
    event = turn(
        ("a", "boom", {"message": "x"}),
        ("b", "timed_work", {"text": "kept", "ms": 300}),
        ("c", "too_slow", {}),
        ("d", "add", {"a": "not a number", "b": 1}),
    )
    result = await client.run_turn(event)
    assert result.status == "completed", result
    assert outputs(result) == [
        ("a", TOOL_ERROR),
        ("b", "kept"),
        ("c", "Tool 'too_slow' timed out after 0.2 seconds."),
        ("d", TOOL_ERROR),
    ]


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        # Severity: a BaseException-class failure beats an ordinary error that came first.
        (
            [("a", "strict_boom", "ordinary", 0.0), ("b", "fatal", "fatal", 0.15)],
            ("Fatal", "fatal", "b"),
        ),
        # Ties (no failure handler: each fails the turn): the lowest model index wins.
        (
            [("a", "strict_boom", "first", 0.15), ("b", "strict_boom", "second", 0.0)],
            ("UserError", "Error running tool strict_boom: first", "a"),
        ),
    ],
    ids=["severity", "model-order-tie"],
)
async def test_failure_choice_is_deterministic_when_several_calls_fail(
    client: FleetClient,
    calls: list[tuple[str, str, str, float]],
    expected: tuple[str, str, str],
) -> None:
    # Both calls fail, 150 ms apart (well within the SDK's 0.25 s drain, in which it collects
    # the failures of siblings before choosing): the choice must not depend on which outcome
    # the aggregator happens to read first. (With the two failures at the same instant, the
    # current fleet reports either one, run by run.)
    at = time.time() + 1.0
    event = turn(
        *((s, tool, {"message": m, "at": at + delay}) for s, tool, m, delay in calls),
        failure_policy="fail_turn",
    )
    result = await client.run_turn(event)
    assert turn_error(result) == (*expected[:2], cid(event, expected[2]))


# --- cancellation --------------------------------------------------------------------------
async def test_parent_cancellation_propagates_promptly_and_is_never_tool_output(
    client: FleetClient, store: Store
) -> None:
    event = turn(
        ("a", "charge", {"amount": 5, "hold_ms": 20_000}),
        ("b", "timed_work", {"text": "queued"}),
        max_concurrency=1,
    )
    await client.submit(event)
    running = cid(event, "a")

    async def started() -> bool:
        return bool(await store.redis.exists(starts_key(running)))

    await wait_for(started, within=15)
    asked = time.monotonic()
    await client.cancel(CancelRequest(tenant_id=TENANT, run_id=event.run_id, reason="user left"))
    result = await client.result(event.run_id, 0, within=10)
    assert time.monotonic() - asked < 5
    assert result.status == "cancelled", result
    assert result.error is None
    assert result.outputs == []  # no output for the cancelled call, none invented for b
    assert [c.status for c in result.calls] == ["cancelled", "cancelled"]

    # The body itself was cancelled, well before its 20 s hold would have ended.
    async def cancelled_in_ledger() -> bool:
        found = await store.entry(running)
        return found is not None and found.outcome is not None

    await wait_for(cancelled_in_ledger, within=5)
    found = await store.entry(running)
    assert found is not None and found.outcome is not None
    assert found.outcome.status == "cancelled"
    assert time.monotonic() - asked < 5
    assert await store.count(effects_key(running)) == 0
    assert await store.count(effects_key(cid(event, "b"))) == 0  # the queued call never ran


@pytest.mark.parametrize("capped", [False, True], ids=["uncapped", "max_concurrency"])
async def test_a_turn_planned_after_its_runs_cancellation_ends_cancelled(
    client: FleetClient, store: Store, capped: bool
) -> None:
    """The cancellation and the response travel on different topics: one that is read first
    still ends the turn, cancelled, and none of its calls runs."""
    event = turn(
        ("a", "charge", {"amount": 5}),
        ("b", "timed_work", {"text": "never"}),
        max_concurrency=1 if capped else None,
    )
    await client.cancel(CancelRequest(tenant_id=TENANT, run_id=event.run_id, reason="user left"))
    result = await client.run_turn(event, within=15)
    assert result.status == "cancelled", result
    assert result.outputs == []
    assert await store.count(effects_key(cid(event, "a"))) == 0
    assert await store.count(effects_key(cid(event, "b"))) == 0


@pytest.mark.parametrize("policy", ["error_as_output", "fail_turn"])
async def test_tool_local_cancellation_follows_the_failure_policy(
    client: FleetClient, store: Store, policy: str
) -> None:
    event = turn(
        ("a", "hold", {"ms": 20_000}),
        ("b", "timed_work", {"text": "sibling"}),
        failure_policy=policy,
    )
    await client.submit(event)
    target, sibling = cid(event, "a"), cid(event, "b")

    async def ready() -> bool:
        done = await store.entry(sibling)
        return bool(await store.redis.exists(starts_key(target))) and (
            done is not None and done.state == "committed"
        )

    await wait_for(ready, within=15)
    asked = time.monotonic()
    await client.cancel(
        CancelRequest(tenant_id=TENANT, run_id=event.run_id, call_id=target, reason="too long")
    )
    result = await client.result(event.run_id, 0, within=10)
    assert time.monotonic() - asked < 5
    assert await store.count(effects_key(target)) == 0
    if policy == "error_as_output":
        assert result.status == "completed", result
        assert outputs(result) == [("a", TOOL_ERROR), ("b", "sibling")]
    else:
        assert result.status == "failed", result
        assert result.error is not None and result.error.call_id == target
        assert outputs(result) == [("b", "sibling")]
    assert records(result)[0][1] == "cancelled"


# --- default model-visible texts -----------------------------------------------------------
async def test_default_timeout_text(client: FleetClient) -> None:
    result = await client.run_turn(turn(("a", "too_slow", {})))
    assert result.status == "completed", result
    assert outputs(result) == [("a", "Tool 'too_slow' timed out after 0.2 seconds.")]
    assert records(result)[0][1] == "timed_out"


async def test_default_tool_error_text_never_shows_the_exception(client: FleetClient) -> None:
    event = turn(
        ("a", "boom", {"message": "internal detail"}),
        ("b", "add", {"a": "x", "b": 1}),  # invalid arguments
        ("c", "add", '{"a": 1, "b": '),  # unparseable arguments
    )
    result = await client.run_turn(event)
    assert result.status == "completed", result
    assert outputs(result) == [("a", TOOL_ERROR), ("b", TOOL_ERROR), ("c", TOOL_ERROR)]


async def test_missing_tool_under_return_error_to_model_is_an_output(client: FleetClient) -> None:
    event = turn(
        ("a", "no_such_tool", {}),
        ("b", "add", {"a": 1, "b": 2}),
        tool_not_found="return_error_to_model",
    )
    result = await client.run_turn(event)
    assert result.status == "completed", result
    assert outputs(result) == [("a", "Tool 'no_such_tool' not found."), ("b", "3")]


async def test_missing_tool_under_raise_error_fails_the_turn(
    client: FleetClient, store: Store
) -> None:
    event = turn(("a", "sleep_then_echo", {"text": "x"}), ("b", "no_such_tool", {}))
    result = await client.run_turn(event)
    assert turn_error(result)[1:] == (
        "Tool no_such_tool not found in agent assistant",
        cid(event, "b"),
    )
    assert await store.entry(cid(event, "a")) is None


@pytest.mark.parametrize(
    ("tool", "policy"),
    [("strict_boom", "error_as_output"), ("boom", "fail_turn")],
    ids=["failure_error_function=None", "failure_policy=fail_turn"],
)
async def test_no_failure_handler_fails_the_turn_with_error_running_tool(
    client: FleetClient, tool: str, policy: str
) -> None:
    event = turn(
        ("a", "add", {"a": 1, "b": 1}),
        ("b", tool, {"message": "kaput"}),
        failure_policy=policy,
    )
    result = await client.run_turn(event)
    assert turn_error(result) == (
        "UserError",
        f"Error running tool {tool}: kaput",
        cid(event, "b"),
    )
    assert [suffix for suffix, _ in outputs(result)] in (["a"], [])  # never b's error text


async def test_disabled_tool_fails_the_turn_before_any_sibling_starts(
    client: FleetClient, store: Store
) -> None:
    event = turn(("a", "sleep_then_echo", {"text": "x"}), ("b", "disabled_tool", {}))
    result = await client.run_turn(event)
    assert turn_error(result)[1:] == (
        "Tool disabled_tool is currently disabled for agent assistant.",
        cid(event, "b"),
    )
    assert await store.entry(cid(event, "a")) is None
    assert await store.count(effects_key(cid(event, "a"))) == 0
