"""toolfleet's state in Redis, one store per concern, each over a Redis connection passed in.

- ``door``: ``Stores``, what a service is given: it builds the service's stores over one
  connection (services never talk to Redis themselves);
- ``keys``: every Redis key name (one home for the prefix and hash tags);
- ``scripts``: the stores' Lua scripts, one file each under ``lua/<store>/``;
- ``ledger``: the call ledger, from ``planned`` to ``committed``, with its audit chain;
- ``circuit``: circuit breakers per tool version;
- ``admission``: queues, quotas, weights and rate limits, before Kafka;
- ``admitting``: the services' side of it (queue, publish what is admitted, free slots);
- ``gates``: the concurrency gates of turns with ``max_concurrency``;
- ``turns``: the aggregator's turn state, each run's turns and the turns attached to a call;
- ``reconciling``: the reconciler's state per call and its schedule;
- ``tasks``: the human task queue;
- ``registry``: published tools, their versions, pins and rollbacks;
- ``schema``: the deployment's state version marker (``toolfleet migrate``).
"""

__all__ = [
    "admission",
    "admitting",
    "circuit",
    "door",
    "gates",
    "keys",
    "ledger",
    "reconciling",
    "registry",
    "schema",
    "scripts",
    "tasks",
    "turns",
]
