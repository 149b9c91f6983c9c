"""The application: the ``toolfleet`` command, operator commands and the live console (their
actions in ``operations``), the demo, local infrastructure.

The only code that imports the services; it builds their Kafka bus and Redis stores from
``Settings`` and hands them in.
"""

__all__ = ["cli", "console", "demo", "infra", "operations", "ops_cli", "service"]
