"""The application: the ``toolfleet`` command, operator commands, the demo, local infrastructure.

The only code that imports the services; it builds their Kafka bus and Redis stores from
``Settings`` and hands them in.
"""

__all__ = ["cli", "demo", "infra", "ops_cli", "service"]
