"""The console overview's counts as a faust-streaming app, for ``bench.overview_aggregates``.

Runs in a virtualenv of its own (faust-streaming is no dependency of toolfleet), so it imports
nothing of toolfleet: it folds exactly what ``toolfleet.app.console._overview.OverviewJob``
folds (``kernel.rules.overview``'s fields: ``calls|STATUS|EFFECT``, ``tenant|T``, ``tool|T``,
``turns|STATUS``, ``lat|B``) into two windowed faust Tables, tumbling 60 s and 3600 s, keyed
by field name and windowed by the record's timestamp, in faust's in-memory store (each update
also goes to the table's changelog topic, as faust does for every table).

One agent reads the three topics as one stream, as the job's one consumer does, and keeps the
model responses it saw last (a bounded dict) for a turn's latency. ``GET /export`` on faust's
web server answers every table entry as ``[width, field, start, count]``.

``BENCH_FAUST_MODE``: ``windowed`` (the above: each record's fields added one by one to the
windowed tables, as faust's documentation does it) or ``batched``: up to 5,000 records at a
time (``take_events``) folded first, as the job folds a batch, then added to one plain Table
keyed by ``WIDTH|START|FIELD`` (windows the app computes; a changelog record per key a batch
touches instead of per record and field; changelog partitions by key, ``use_partitioner``).

Configured by the environment: ``BENCH_KAFKA`` (bootstrap servers), ``BENCH_PREFIX`` (topic
prefix), ``BENCH_APP_ID`` (the app's id: its consumer group and its topics' prefix),
``BENCH_PARTITIONS``, ``BENCH_WEB_PORT``, ``BENCH_DATA_DIR`` (faust's data directory).
Run: ``python overview_faust.py worker``.
"""

from __future__ import annotations

import math
import os
from collections import Counter, OrderedDict
from datetime import timedelta
from typing import Any

import faust
import orjson

PREFIX = os.environ["BENCH_PREFIX"]
PARTITIONS = int(os.environ["BENCH_PARTITIONS"])
PENDING_TURNS = 100_000  # as the job's PENDING_TURNS
MODE = os.environ.get("BENCH_FAUST_MODE", "windowed")
BATCH = 5_000  # as the job's getmany

app = faust.App(
    os.environ["BENCH_APP_ID"],
    broker=f"kafka://{os.environ['BENCH_KAFKA']}",
    store="memory://",
    autodiscover=False,
    topic_partitions=PARTITIONS,
    topic_replication_factor=1,
    consumer_auto_offset_reset="earliest",
    web_bind="127.0.0.1",
    web_port=int(os.environ["BENCH_WEB_PORT"]),
    web_in_thread=False,
    datadir=os.environ["BENCH_DATA_DIR"],
)

if MODE == "windowed":
    # The job's keep times (kernel.stores.overview): a window older than these is dropped.
    minute = (
        app.Table("minute", default=int, partitions=PARTITIONS)
        .tumbling(60, expires=timedelta(hours=26))
        .relative_to_stream()
    )
    hour = (
        app.Table("hour", default=int, partitions=PARTITIONS)
        .tumbling(3600, expires=timedelta(days=8))
        .relative_to_stream()
    )
else:
    # A batch is not one event: its changelog records go to the partition of their key
    # (use_partitioner), as faust needs when a table is changed outside one event.
    counts = app.Table("counts", default=int, partitions=PARTITIONS, use_partitioner=True)
source = app.topic(
    *(f"{PREFIX}{name}" for name in ("model-responses", "outcomes", "turn-results")),
    key_serializer="raw",
    value_serializer="raw",
)
pending: OrderedDict[tuple[str, str, int], float] = OrderedDict()


def latency_bucket(seconds: float) -> int:
    """kernel.rules.overview.latency_bucket, copied (this venv has no toolfleet)."""
    ms = max(0.0, seconds * 1000.0)
    if ms <= 1.0:
        return 0
    return min(95, math.ceil(math.log2(ms / 1.0) * 4))


def fields_of(topic: str, data: dict[str, Any], at: float) -> list[str]:
    """The fields one record counts (the job's OverviewJob.facts, then Fold)."""
    tenant = str(data["tenant_id"])
    if topic == "model-responses":
        pending[tenant, str(data["run_id"]), int(data["turn_id"])] = at
        if len(pending) > PENDING_TURNS:
            pending.popitem(last=False)
        return []
    if topic == "outcomes":
        if data.get("kind", "execute") != "execute" or data.get("status") in (
            None,
            "pending_approval",
        ):
            return []
        return [
            f"calls|{data['status']}|{data['effect']}",
            f"tenant|{tenant}",
            f"tool|{data['tool_name']}",
        ]
    if topic == "turn-results":
        found = [f"turns|{data['status']}"]
        asked = pending.pop((tenant, str(data["run_id"]), int(data["turn_id"])), None)
        if asked is not None and at >= asked:
            found.append(f"lat|{latency_bucket(at - asked)}")
        return found
    return []


def fields_of_event(event: Any) -> list[str]:
    """An event's fields (none for a record that does not read, as the job skips it)."""
    message = event.message
    try:
        data = orjson.loads(event.value or b"")
        return fields_of(message.topic.removeprefix(PREFIX), data, message.timestamp)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return []


@app.agent(source)
async def fold(stream: Any) -> None:
    """Count every record's fields in its minute's and its hour's window."""
    if MODE == "windowed":
        async for event in stream.events():
            for name in fields_of_event(event):
                minute[name] += 1
                hour[name] += 1
        return
    async for events in stream.take_events(BATCH, within=1.0):
        increments: Counter[str] = Counter()
        for event in events:
            at = event.message.timestamp
            for name in fields_of_event(event):
                for width in (60, 3600):
                    increments[f"{width}|{int(at // width) * width}|{name}"] += 1
        for key, count in increments.items():
            counts[key] += count


@app.page("/export")
async def export(web: Any, request: Any) -> Any:
    """Every window's count: ``[width, field, start, count]``."""
    rows = []
    if MODE == "windowed":
        for width, wrapper in ((60, minute), (3600, hour)):
            for (name, (start, _end)), count in wrapper.table.data.items():
                rows.append([width, name, int(start), int(count)])
    else:
        for key, count in counts.data.items():
            width, start, name = key.split("|", 2)
            rows.append([int(width), name, int(start), int(count)])
    return web.json({"faust": faust.__version__, "mode": MODE, "rows": rows})


if __name__ == "__main__":
    app.main()
