"""The agent runtime's side of toolfleet: submit model responses, await turn results."""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Self

from aiokafka import AIOKafkaConsumer, TopicPartition

from kernel.adapters.bus import KafkaBus
from kernel.errors import InvalidMessageError, UnavailableError
from kernel.rules.auth import DecisionAuth
from kernel.settings import Settings
from schemas import ApprovalDecision, CancelRequest, ModelResponseEvent, TurnResult


class TurnTimeoutError(UnavailableError, TimeoutError):
    """No TurnResult arrived in time; check that the planner, workers and aggregator run."""


class FleetClient:
    """Publishes model responses, approvals and cancellations; collects TurnResults.

    Results are read from the end of ``turn-results`` as it was when the client started,
    so start the client before submitting.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.bus = KafkaBus(settings, service="client")
        self.auth = DecisionAuth.of(settings)
        self._results: dict[tuple[str, int], TurnResult] = {}
        self._arrived = asyncio.Condition()
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        await self.bus.start()
        topic = self.settings.topic("turn-results")
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka_servers(),
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        await consumer.start()
        partitions = await self.bus.producer.partitions_for(topic)  # waits for metadata
        assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(assigned)
        await consumer.seek_to_end(*assigned)
        for tp in assigned:  # resolve the end offsets now, before anything is submitted
            await consumer.position(tp)
        self._consumer = consumer
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._consumer is not None:
            await self._consumer.stop()
        await self.bus.stop()

    async def submit(self, event: ModelResponseEvent) -> None:
        """Hand a model response to the planner."""
        await self.bus.publish_and_wait("model-responses", event.run_id, event)

    async def decide(self, decision: ApprovalDecision) -> None:
        """Approve or reject a call that waits for approval (signed with the tenant's key)."""
        signed = self.auth.sign(decision)
        await self.bus.publish_and_wait("approvals", decision.run_id, signed)

    async def cancel(self, request: CancelRequest) -> None:
        """Cancel a run (no call_id) or one call (signed with the tenant's key)."""
        await self.bus.publish_and_wait("cancellations", request.run_id, self.auth.sign(request))

    async def result(self, run_id: str, turn_id: int, *, within: float = 60.0) -> TurnResult:
        """The TurnResult of one turn, waiting up to ``within`` seconds."""
        key = (run_id, turn_id)
        try:
            async with asyncio.timeout(within), self._arrived:
                await self._arrived.wait_for(lambda: key in self._results)
        except TimeoutError:
            raise TurnTimeoutError(
                f"no TurnResult for run {run_id} turn {turn_id} within {within:g} s; "
                "are the planner, a worker of the tool's pool and the aggregator running?"
            ) from None
        return self._results.pop(key)

    async def run_turn(self, event: ModelResponseEvent, *, within: float = 60.0) -> TurnResult:
        """Submit a model response and wait for its TurnResult."""
        await self.submit(event)
        return await self.result(event.run_id, event.turn_id, within=within)

    async def _read(self) -> None:
        assert self._consumer is not None
        async for record in self._consumer:
            try:
                result = TurnResult.decode(record.value or b"")
            except InvalidMessageError:
                continue
            async with self._arrived:
                self._results[(result.run_id, result.turn_id)] = result
                self._arrived.notify_all()
