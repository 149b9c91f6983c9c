"""toolfleet's state in Redis, one store per concern, each over a Redis connection passed in.

- ``keys``: every Redis key name (one home for the prefix and hash tags);
- ``scripts``: the stores' Lua scripts, one file each under ``lua/<store>/``;
- ``ledger``: the call ledger, from ``planned`` to ``committed``, with its audit chain;
- ``circuit``: circuit breakers per tool version;
- ``admission``: queues, quotas, weights and rate limits, before Kafka;
- ``admitting``: the services' side of it (queue, publish what is admitted, free slots);
- ``gates``: the concurrency gates of turns with ``max_concurrency``;
- ``turns``: the aggregator's turn state;
- ``reconciling``: the reconciler's state per call and its schedule;
- ``tasks``: the human task queue;
- ``registry``: published tools, their versions, pins and rollbacks.
"""

__all__ = [
    "admission",
    "admitting",
    "circuit",
    "gates",
    "keys",
    "ledger",
    "reconciling",
    "registry",
    "scripts",
    "tasks",
    "turns",
]
