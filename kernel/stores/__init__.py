"""toolfleet's state in Redis, one store per concern, each over a Redis connection passed in.

- ``keys``: every Redis key name (one home for the prefix and hash tags);
- ``ledger``: the call ledger, from ``planned`` to ``committed``, with its audit chain;
- ``circuit``: circuit breakers per tool version;
- ``semaphore``: fleet-wide concurrency limits;
- ``tasks``: the human task queue;
- ``registry``: published tools, their versions, pins and rollbacks.
"""

__all__ = ["circuit", "keys", "ledger", "registry", "semaphore", "tasks"]
