"""toolfleet's state in Redis, one store per concern, each over a Redis connection passed in.

- ``keys``: every Redis key name (one home for the prefix and hash tags);
- ``ledger``: the call ledger, from ``planned`` to ``committed``, with its audit chain;
- ``circuit``: circuit breakers per tool version;
- ``admission``: queues, quotas, weights and rate limits, before Kafka;
- ``admitting``: the services' side of it (queue, publish what is admitted, free slots);
- ``tasks``: the human task queue;
- ``registry``: published tools, their versions, pins and rollbacks.
"""

__all__ = ["admission", "admitting", "circuit", "keys", "ledger", "registry", "tasks"]
