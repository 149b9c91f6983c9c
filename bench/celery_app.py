"""Baseline 3: Celery with Redis as broker and result backend, one chord per turn.

The calls of a turn are the chord's header (one ``bench.noop`` task each); its body
``bench.collect`` gets their outputs in model order and pushes a turn result (the same
``function_call_output`` items) onto a Redis list the load generator reads. This is what
many teams would build instead of toolfleet.

Workers: ``celery -A bench.celery_app worker --pool threads --concurrency 8 ...``, one process
each (see ``bench.systems.CELERY_POOL``).
Configured by ``BENCH_CELERY_URL`` (broker and backend) and ``BENCH_CELERY_QUEUE``.
"""

from __future__ import annotations

import json
import os
from functools import cache
from typing import Any

import redis
from celery import Celery  # type: ignore[import-untyped]
from celery.signals import worker_ready  # type: ignore[import-untyped]

BROKER_URL = os.environ.get("BENCH_CELERY_URL", "redis://127.0.0.1:16379/3")
QUEUE = os.environ.get("BENCH_CELERY_QUEUE", "bench")

app = Celery("bench", broker=BROKER_URL, backend=BROKER_URL)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_default_queue=QUEUE,
    result_expires=900,
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=4,
    worker_hijack_root_logger=True,
)


@cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(BROKER_URL)


def ready_key(queue: str) -> str:
    """Redis set of the hostnames of the workers of ``queue`` that are ready."""
    return f"bench:celery:ready:{queue}"


@worker_ready.connect  # type: ignore[untyped-decorator]
def _announce(sender: Any, **_: Any) -> None:
    _redis().sadd(ready_key(QUEUE), sender.hostname)


@app.task(name="bench.noop")  # type: ignore[untyped-decorator]
def noop(call_id: str, arguments: str) -> str:
    """The no-op tool: parses its arguments and answers ``ok``."""
    json.loads(arguments)
    return "ok"


@app.task(name="bench.collect", ignore_result=True)  # type: ignore[untyped-decorator]
def collect(outputs: list[Any], run_id: str, call_ids: list[str], results_key: str) -> None:
    """The chord's body: one turn result, outputs in model order, onto the results list."""
    result = {
        "run_id": run_id,
        "status": "completed",
        "outputs": [
            {"type": "function_call_output", "call_id": c, "output": o}
            for c, o in zip(call_ids, outputs, strict=True)
        ],
    }
    _redis().rpush(results_key, json.dumps(result))
