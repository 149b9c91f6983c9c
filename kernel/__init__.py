"""The kernel every toolfleet service stands on, in four layers (top to bottom):

- ``kernel.tools``: the tool API and the lifecycle of one call (pure of Kafka and Redis);
- ``kernel.stores``: state in Redis (ledger, admission, circuits, tasks, tool registry);
- ``kernel.adapters``: the connections (Kafka bus, Redis, metrics, logs, topics);
- ``kernel.rules``: pure decisions (effects, limits, versions, texts, decision signing).

``kernel.settings`` and ``kernel.errors`` sit under all four. The services (``planner``,
``executors``, ``aggregator``, ``reconciler``) import the kernel; the kernel imports no service.
"""

__all__ = ["adapters", "errors", "rules", "settings", "stores", "tools"]
