"""Testing helpers shipped with toolfleet.

- ``LocalFleet``, ``connected_client``, ``result_of``: a whole fleet as local processes, against
  real Kafka and Redis, for end-to-end tests of an agent platform;
- ``InMemoryBus`` and ``ConsumedRecord``: drive a service's handlers without Kafka (the service
  takes its bus in its constructor) and assert on what it published or dead-lettered;
- ``ToolEnvironment``: one tool run in-process through a worker's lifecycle (approval,
  guardrails, timeout, effect classification, hooks), no broker needed: for tool authors;
- ``capture_spans``: the OpenTelemetry spans of services built in this process, in memory.
"""

from toolfleet.testing._bus import ConsumedRecord, DeadLettered, InMemoryBus, Published
from toolfleet.testing._fleet import ChildProcess, LocalFleet, connected_client, result_of
from toolfleet.testing._inprocess import InProcessFleet
from toolfleet.testing._spans import capture_spans
from toolfleet.testing._tools import ToolEnvironment

__all__ = [
    "ChildProcess",
    "ConsumedRecord",
    "DeadLettered",
    "InMemoryBus",
    "InProcessFleet",
    "LocalFleet",
    "Published",
    "ToolEnvironment",
    "capture_spans",
    "connected_client",
    "result_of",
]
