"""Testing helpers shipped with toolfleet.

- ``LocalFleet``, ``connected_client``, ``result_of``: a whole fleet as local processes, against
  real Kafka and Redis, for end-to-end tests of an agent platform;
- ``ToolEnvironment``: one tool run in-process through a worker's lifecycle (approval,
  guardrails, timeout, effect classification, hooks), no broker needed: for tool authors.
"""

from toolfleet.testing._fleet import ChildProcess, LocalFleet, connected_client, result_of
from toolfleet.testing._tools import ToolEnvironment

__all__ = ["ChildProcess", "LocalFleet", "ToolEnvironment", "connected_client", "result_of"]
