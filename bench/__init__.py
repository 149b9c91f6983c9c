"""Benchmarks: toolfleet against the raw Kafka relay, in-process asyncio and Celery.

Run ``make bench`` (or ``python -m bench`` with Kafka and Redis up); see ``bench/__main__.py``.
"""

__all__: list[str] = []  # run as ``python -m bench``; nothing to import
