"""Testing helpers shipped with toolfleet.

- ``InProcessFleet``: the real planner, aggregator, reconciler and workers on the test's event
  loop, against real Kafka and Redis, serving tool objects made anywhere (see below);
- ``LocalFleet``, ``connected_client``, ``result_of``: a whole fleet as local processes, against
  real Kafka and Redis, for end-to-end tests of an agent platform;
- ``InMemoryBus`` and ``ConsumedRecord``: drive a service's handlers without Kafka (the service
  takes its bus in its constructor) and assert on what it published or dead-lettered;
- ``ToolEnvironment``: one tool run in-process through a worker's lifecycle (approval,
  guardrails, timeout, effect classification, hooks), no broker needed: for tool authors;
- ``capture_spans``: the OpenTelemetry spans of services built in this process, in memory.

``InProcessFleet(settings, *tools, workers=1, pool="default", auto_serve=False, hooks=None,
limits=None, cleanup=True, ready_within=60.0, quiet_within=5.0)``, used as
``async with InProcessFleet(settings) as fleet:`` (or ``await fleet.start()`` / ``stop()``):

- it runs under a topic prefix of its own (``settings.topic_prefix`` + ``inproc-<hex>.``, so its
  own topics and Redis namespace), given in ``fleet.settings``; ``fleet.client`` is a started
  ``FleetClient`` on it, for ``toolfleet.agents.FleetRunner(fleet.client, tenant_id=...)`` or
  turns by hand. ``start`` returns once a first turn went through and the workers own their
  command topic (about 0.3 s with a warm local broker); ``stop`` waits until every record on
  the fleet's topics is handled and committed (``quiet_within``), stops every service (calls in
  flight finish, offsets are committed, no task is left), and deletes the topics and Redis keys
  (``cleanup``; ``purge()`` does it later). A service that stops on an error, or loses one of
  its background loops (a worker's capacity registration, the planner's admission tick: the
  service then stops), makes the next ``serve``, ``check()`` or ``stop`` raise
  UnavailableError with that error chained. Those loops wait through asyncio's functions as
  imported, so a test that patches ``asyncio.wait_for`` or ``asyncio.sleep`` module-wide
  changes the fleet's Kafka and Redis I/O while it runs, not the loops after it.
- ``await fleet.serve(*tools, **options)`` serves Agents SDK ``FunctionTool`` objects, toolfleet
  ``Tool`` objects and whole ``ToolRegistry`` objects, defined anywhere (inside a test, as a
  closure, from a factory); ``options`` are toolfleet's options of an SDK function tool
  (``ServeOptions``: ``effect``, ``probe``...; see ``ToolRegistry.add_function_tool``). One
  object is served per lookup key: a later object under a name already served replaces the
  earlier one for the calls submitted after it, as the next version of that name ("1", "2",
  ...) and its only live one, so the planner plans with the new object's spec (release gate,
  effect class), the workers run its body, and its circuit starts closed. ``fleet.served(name)``
  is the Tool served now.
- ``auto_serve=True``: while it runs, the fleet is the process's tool server
  (``toolfleet.serving``), so a runner that follows that contract (``FleetRunner``) serves each
  function tool before it sends a call of it: an agent test runs on the fleet unchanged. Two
  different objects under one name in one batch (or in concurrent runs) run the one served last.
"""

from toolfleet.testing._bus import ConsumedRecord, DeadLettered, InMemoryBus, Published
from toolfleet.testing._fleet import ChildProcess, LocalFleet, connected_client, result_of
from toolfleet.testing._inprocess import InProcessFleet
from toolfleet.testing._served import ServeOptions
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
    "ServeOptions",
    "ToolEnvironment",
    "capture_spans",
    "connected_client",
    "result_of",
]
