"""The connections to the outside: everything that talks to Kafka, Redis or a scraper.

- ``bus``: the ``Bus`` interface and its Kafka implementation, consume loops, dead letters;
- ``redis``: connecting to Redis, scripts and the small state helpers every store uses;
- ``topics``: topic names and their creation;
- ``offsets``: which offsets are safe to commit;
- ``metrics``, ``logs``, ``spans``: what an operator sees.
"""

__all__ = ["bus", "logs", "metrics", "offsets", "redis", "spans", "topics"]
