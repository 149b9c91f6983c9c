"""Bad input never stops a consumer: it lands in dead-letter with its bytes and a reason."""

from __future__ import annotations

import asyncio
import json

import pytest

from kernel.adapters.bus import ConsumeLoop, KafkaBus, Record
from kernel.settings import Settings
from schemas import DeadLetter, ModelResponseEvent

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]

GOOD = ModelResponseEvent(
    tenant_id="t1", run_id="run-dl", turn_id=0, agent={"name": "a"}, response_id="resp"
)  # type: ignore[arg-type]


async def test_malformed_bytes_are_dead_lettered_and_the_consumer_goes_on(
    bus: KafkaBus, settings: Settings
) -> None:
    await bus.publish_and_wait("model-responses", "run-dl", b"\xff\xfe not json")
    await bus.publish_and_wait(
        "model-responses", "run-dl", json.dumps({"tenant_id": "t1", "turn_id": "x"}).encode()
    )
    await bus.publish_and_wait("model-responses", "run-dl", GOOD)

    processed: list[ModelResponseEvent] = []
    done = asyncio.Event()

    async def handle(record: Record) -> None:
        event = ModelResponseEvent.decode(record.value or b"")
        if record.key == b"run-dl":  # other tests of the session share the topic
            processed.append(event)
            done.set()

    consumer = bus.consumer(["model-responses"], group="dl-test")
    await consumer.start()
    loop = ConsumeLoop(bus, consumer, handle)
    task = asyncio.create_task(loop.run())
    try:
        await asyncio.wait_for(done.wait(), timeout=30)
    finally:
        loop.stop()
        await task
        await consumer.stop()
    assert processed == [GOOD]

    letters = bus.consumer(["dead-letter"], group="dl-reader")
    await letters.start()
    try:
        found: list[DeadLetter] = []
        while len(found) < 2:
            batch = await asyncio.wait_for(letters.getmany(timeout_ms=1000), timeout=30)
            for records in batch.values():
                found += [
                    DeadLetter.model_validate_json(r.value) for r in records if r.key == b"run-dl"
                ]
    finally:
        await letters.stop()
    assert [letter.value for letter in found] == [
        b"\xff\xfe not json",
        json.dumps({"tenant_id": "t1", "turn_id": "x"}).encode(),
    ]
    assert found[0].original_topic == settings.topic("model-responses")
    assert found[0].offset < found[1].offset
    assert "not valid JSON" in found[0].reason
    assert "turn_id: Input should be a valid integer" in found[1].reason
    assert "run_id: Field required" in found[1].reason
    assert found[1].tenant_id == "t1"
    assert found[0].service == "test"


async def test_a_handler_that_keeps_failing_dead_letters_the_message_with_the_error(
    bus: KafkaBus,
) -> None:
    await bus.publish_and_wait("approvals", "run-poison", b'{"poison": true}')
    await bus.publish_and_wait("approvals", "run-poison", b'{"fine": true}')
    seen: list[bytes] = []
    done = asyncio.Event()

    async def handle(record: Record) -> None:
        if record.key != b"run-poison":
            return  # other tests of the session share the topic
        if record.value == b'{"poison": true}':
            raise RuntimeError("bug in handler")
        seen.append(record.value or b"")
        done.set()

    consumer = bus.consumer(["approvals"], group="poison-test")
    await consumer.start()
    loop = ConsumeLoop(bus, consumer, handle, max_attempts=3, backoff_s=0.01)
    task = asyncio.create_task(loop.run())
    try:
        await asyncio.wait_for(done.wait(), timeout=30)
    finally:
        loop.stop()
        await task
        await consumer.stop()
    assert seen == [b'{"fine": true}']
    letters = bus.consumer(["dead-letter"], group="poison-reader")
    await letters.start()
    try:
        reasons: list[str] = []
        while not any("bug in handler" in r for r in reasons):
            batch = await asyncio.wait_for(letters.getmany(timeout_ms=1000), timeout=30)
            reasons += [
                DeadLetter.model_validate_json(r.value).reason
                for records in batch.values()
                for r in records
            ]
    finally:
        await letters.stop()
    assert "handler failed 3 times: RuntimeError: bug in handler" in reasons
