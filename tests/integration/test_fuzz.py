"""Fuzz: thousands of hostile messages on every inbound topic, then the fleet must be whole.

Generated from a seed (``TOOLFLEET_FUZZ_SEED``), ``TOOLFLEET_FUZZ_MESSAGES`` of them (300 in
the default suite; ``make fuzz`` sends 5,000 and prints the figures): random bytes up to
900 KB, truncated and mutated valid messages (wrong types, coercible look-alikes, missing and
unknown fields), deep nesting, many items, odd unicode, huge and deeply nested arguments,
decisions naming other tenants' runs. Afterwards every service is alive, every model response
got a TurnResult or a dead letter, every message that does not decode was dead-lettered with
its topic and offset, and a valid turn still completes.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from kernel.adapters.bus import KafkaBus
from kernel.errors import InvalidMessageError
from kernel.settings import Settings
from schemas import (
    ApprovalDecision,
    CancelRequest,
    DeadLetter,
    Message,
    ModelResponseEvent,
    TaskResolution,
)
from tests.conftest import wait_for
from tests.integration.test_pipeline import turn
from toolfleet.client import FleetClient, TurnTimeoutError
from toolfleet.testing import LocalFleet, connected_client

pytestmark = pytest.mark.integration

MESSAGES = int(os.environ.get("TOOLFLEET_FUZZ_MESSAGES", "300"))
SEED = int(os.environ.get("TOOLFLEET_FUZZ_SEED", "20261201"))
TOPICS: dict[str, type[Message]] = {
    "model-responses": ModelResponseEvent,
    "approvals": ApprovalDecision,
    "cancellations": CancelRequest,
    "task-resolutions": TaskResolution,
}


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    with LocalFleet(settings, tools="tests.integration.fleet_tools:tools", workers=2) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


def _valid(rng: random.Random, topic: str, run_id: str) -> dict[str, Any]:
    tenant = rng.choice(["acme", "beta", "t" * 200])
    if topic == "model-responses":
        calls = [
            {"type": "function_call", "call_id": f"{run_id}-{i}",
             "name": rng.choice(["sleep_then_echo", "add", "boom", "missing_tool"]),
             "arguments": json.dumps({"text": "x"} if rng.random() < 0.7 else {"a": 1, "b": 2})}
            for i in range(rng.randint(0, 4))
        ]  # fmt: skip
        other = {"type": "message", "content": [{"type": "output_text", "text": "hé ✓ \u202e"}]}
        return {"tenant_id": tenant, "run_id": run_id, "turn_id": rng.randint(0, 3),
                "agent": {"name": "fuzz"}, "response_id": "resp", "items": [other, *calls],
                "config": {"tool_not_found": "return_error_to_model"}}  # fmt: skip
    if topic == "approvals":
        return {"tenant_id": tenant, "run_id": run_id, "call_id": f"{run_id}-0",
                "tool_name": "add", "approve": rng.random() < 0.5,
                "decided_by": "fuzz"}  # fmt: skip
    if topic == "cancellations":
        return {"tenant_id": tenant, "run_id": run_id, "reason": "fuzz"}
    return {"tenant_id": tenant, "task_id": uuid.uuid4().hex, "resolution": "applied",
            "decided_by": "fuzz"}  # fmt: skip


_ODD_VALUES: list[Any] = [
    "7", 7.0, True, None, [], {}, -1, 2**70, "", "\x00", "é" * 1000, [[[]]], {"$ref": "#"},
    1e308, "NaN",
]  # fmt: skip


def _mutate(rng: random.Random, message: dict[str, Any]) -> dict[str, Any]:
    mutated = dict(message)
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        key = rng.choice(list(mutated))
        if roll < 0.4:
            mutated[key] = rng.choice(_ODD_VALUES)
        elif roll < 0.6:
            del mutated[key]
            if not mutated:
                break
        elif roll < 0.8:
            mutated[f"extra_{rng.randint(0, 9)}"] = rng.choice(_ODD_VALUES)
        else:
            mutated["schema_version"] = rng.choice([2, True, 1.0, "1", 0])
    return mutated


def hostile(rng: random.Random, topic: str) -> bytes:
    """One hostile message for ``topic`` (a few valid ones among them)."""
    run_id = f"fuzz-{rng.getrandbits(40):x}"
    roll = rng.random()
    if roll < 0.12:
        return os.urandom(rng.choice([0, 1, 17, 4096, 100_000, 900_000]))
    if roll < 0.25:
        raw = json.dumps(_valid(rng, topic, run_id)).encode()
        return raw[: rng.randint(0, max(0, len(raw) - 1))]
    if roll < 0.55:
        return json.dumps(_mutate(rng, _valid(rng, topic, run_id))).encode()
    if roll < 0.62:
        depth = rng.choice([100, 300, 5_000, 50_000])
        message = _valid(rng, topic, run_id)
        raw = json.dumps(message)
        return (raw[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}").encode()
    if roll < 0.7 and topic == "model-responses":
        message = _valid(rng, topic, run_id)
        count = rng.choice([1_001, 5_000])
        message["items"] = [{"type": "function_call", "call_id": f"{run_id}-{i}", "name": "add",
                             "arguments": "{}"} for i in range(count)]  # fmt: skip
        return json.dumps(message).encode()
    if roll < 0.78 and topic == "model-responses":
        message = _valid(rng, topic, run_id)
        arguments = rng.choice([
            json.dumps({f"k{i}": i for i in range(10_000)}),
            "[" * 10_000 + "]" * 10_000,
            json.dumps({"text": "x" * 300_000}),
            "{not json",
        ])  # fmt: skip
        message["items"] = [{"type": "function_call", "call_id": f"{run_id}-0",
                             "name": "sleep_then_echo", "arguments": arguments}]  # fmt: skip
        return json.dumps(message).encode()
    if roll < 0.83:
        return json.dumps(rng.choice([[], "a string", 17, None, [1, 2, 3]])).encode()
    return json.dumps(_valid(rng, topic, run_id)).encode()


def _decodes(model: type[Message], raw: bytes) -> Message | None:
    try:
        return model.decode(raw)
    except InvalidMessageError:
        return None
    except (ValidationError, ValueError):  # pragma: no cover - decode maps these
        return None


def _expect_if_valid_response(client: FleetClient, topic: str, raw: bytes) -> None:
    event = _decodes(ModelResponseEvent, raw) if topic == "model-responses" else None
    if isinstance(event, ModelResponseEvent):
        client.expect(event.run_id, event.turn_id)


@pytest.mark.timeout(1800)
async def test_hostile_messages_on_every_inbound_topic_leave_the_fleet_whole(
    fleet: LocalFleet, client: FleetClient, bus: KafkaBus, settings: Settings
) -> None:
    rng = random.Random(SEED)
    sent: list[tuple[str, int, int, bytes]] = []  # topic, partition, offset, bytes
    began = time.monotonic()
    for i in range(MESSAGES):
        topic = rng.choice(list(TOPICS))
        raw = hostile(rng, topic)
        _expect_if_valid_response(client, topic, raw)  # published raw, not submitted
        meta = await (await bus.publish(topic, f"fuzz-key-{i % 64}".encode(), raw))
        sent.append((topic, meta.partition, meta.offset, raw))
    sent_s = time.monotonic() - began

    invalid = {(settings.topic(t), p, o) for t, p, o, raw in sent if not _decodes(TOPICS[t], raw)}
    responses = [
        (p, o, event) for t, p, o, raw in sent if t == "model-responses"
        and isinstance(event := _decodes(ModelResponseEvent, raw), ModelResponseEvent)
    ]  # fmt: skip
    letters: dict[tuple[str, int, int], DeadLetter] = {}
    consumer = bus.consumer(["dead-letter"], group=f"fuzz-{uuid.uuid4().hex[:6]}")
    await consumer.start()

    async def all_invalid_dead_lettered() -> bool:
        for records in (await consumer.getmany(timeout_ms=500)).values():
            for record in records:
                letter = DeadLetter.model_validate_json(record.value or b"")
                letters[(letter.original_topic, letter.partition, letter.offset)] = letter
        return invalid <= set(letters)

    try:
        try:
            await wait_for(all_invalid_dead_lettered, within=300)
        except AssertionError:
            missing = sorted(invalid - set(letters))
            where = {(settings.topic(t), p, o): raw[:80] for t, p, o, raw in sent}
            examples = [(w, where[w]) for w in missing[:5]]
            raise AssertionError(
                f"{len(missing)} invalid messages not dead-lettered, e.g. {examples}"
            ) from None

        # FleetClient.result hands each result out once; a mutation can give two responses
        # one (run, turn): they are one turn, with one result.
        got: set[tuple[str, int]] = set()

        async def answered(p: int, o: int, event: ModelResponseEvent) -> bool:
            if (settings.topic("model-responses"), p, o) in letters:
                return True
            turn_key = (event.run_id, event.turn_id)
            if turn_key in got:
                return True
            try:
                await client.result(event.run_id, event.turn_id, within=0.2)
            except TurnTimeoutError:
                return False
            got.add(turn_key)
            return True

        async def every_response_answered() -> bool:
            await all_invalid_dead_lettered()
            pending = [r for r in responses if not await answered(*r)]
            return not pending

        try:
            await wait_for(every_response_answered, within=300)
        except AssertionError:
            pending = [(p, o, e.run_id) for p, o, e in responses if not await answered(p, o, e)]
            raise AssertionError(f"{len(pending)} responses unanswered: {pending[:5]}") from None
    finally:
        await consumer.stop()
    fleet.check()  # no service process died
    final = await client.run_turn(turn(("ok", "sleep_then_echo", {"text": "whole"})), within=60)
    assert final.outputs[0].output == "whole"
    mine = {k: v for k, v in letters.items() if (k[0], k[1], k[2]) in
            {(settings.topic(t), p, o) for t, p, o, _ in sent}}  # fmt: skip
    print(
        f"\nfuzz: {MESSAGES} messages (seed {SEED}) in {sent_s:.1f} s; {len(invalid)} invalid, "
        f"all dead-lettered ({len(mine)} letters for fuzz messages in all); "
        f"{len(responses)} valid model responses, each with a TurnResult or a dead letter; "
        "0 service crashes; a valid turn completed afterwards"
    )
