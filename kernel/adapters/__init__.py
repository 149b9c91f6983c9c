"""The connections to the outside: everything that talks to Kafka, Redis or a scraper.

- ``bus``: the ``Bus`` interface and its Kafka implementation, consume loops, dead letters;
- ``redis``: connecting to Redis, scripts and the small state helpers every store uses;
- ``topics``: topic names and their creation;
- ``offsets``: which offsets are safe to commit;
- ``dependencies``: whether Kafka and Redis answer, said once when one goes and once when it
  is back; ``backoff``: waiting by the one retry policy (``kernel.rules.backoff``);
- ``background``: a service's loops beside its consume loop; one that ends stops the service;
- ``metrics``, ``logs``, ``spans``, ``health``: what an operator sees.
"""

__all__ = [
    "background",
    "backoff",
    "bus",
    "dependencies",
    "health",
    "logs",
    "metrics",
    "offsets",
    "redis",
    "spans",
    "topics",
]
