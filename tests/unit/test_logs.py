"""JSON log lines carry the ids of the call, run and tenant being handled (``log_context``)."""

from __future__ import annotations

import asyncio
import json
import logging

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from kernel.adapters.logs import JsonFormatter, configure_logging, log_context
from kernel.adapters.spans import LogSpanExporter


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter("test"))
        self.lines: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


def _capture() -> tuple[logging.Logger, _Lines]:
    handler = _Lines()
    logger = logging.getLogger(f"test.logs.{id(handler)}")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger, handler


async def test_records_inside_a_context_carry_its_ids_and_tasks_inherit_them() -> None:
    logger, lines = _capture()
    logger.info("outside")
    with log_context(tenant_id="acme", run_id="r1", call_id=None):
        logger.info("run")
        with log_context(call_id="c1", tool="charge"):
            await asyncio.create_task(asyncio.sleep(0, logger.info("in a task")))
            logger.info("call", extra={"tool": "explicit wins"})
        logger.info("run again")
    ids = [
        {k: line.get(k) for k in ("tenant_id", "run_id", "call_id", "tool")} for line in lines.lines
    ]
    assert ids == [
        {"tenant_id": None, "run_id": None, "call_id": None, "tool": None},
        {"tenant_id": "acme", "run_id": "r1", "call_id": None, "tool": None},
        {"tenant_id": "acme", "run_id": "r1", "call_id": "c1", "tool": "charge"},
        {"tenant_id": "acme", "run_id": "r1", "call_id": "c1", "tool": "explicit wins"},
        {"tenant_id": "acme", "run_id": "r1", "call_id": None, "tool": None},
    ]


def test_records_inside_a_span_carry_its_trace_and_span_ids() -> None:
    logger, lines = _capture()
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("toolfleet call add") as span:
        logger.info("in the call")
    logger.info("after it")
    context = span.get_span_context()
    inside, after = lines.lines
    assert inside["trace_id"] == format(context.trace_id, "032x")
    assert inside["span_id"] == format(context.span_id, "016x")
    assert "trace_id" not in after and "span_id" not in after


def test_a_batch_of_spans_is_not_tagged_with_one_calls_ids() -> None:
    _, lines = _capture()
    spans = logging.getLogger("kernel.adapters.spans")
    spans.addHandler(lines)
    level, spans.level = spans.level, logging.INFO
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(LogSpanExporter()))
    tracer = provider.get_tracer("test")
    try:
        # The span ends, and is exported, inside c2's log context and its own trace.
        with log_context(call_id="c2"), tracer.start_as_current_span("b"):
            pass
    finally:
        spans.removeHandler(lines)
        spans.setLevel(level)
    (line,) = lines.lines
    assert line["msg"] == "spans" and len(line["spans"]) == 1  # type: ignore[arg-type]
    assert "call_id" not in line and "trace_id" not in line


def test_the_level_setting_applies_to_the_whole_process() -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        configure_logging("test", "WARNING")
        assert root.level == logging.WARNING
        assert not logging.getLogger("any.module").isEnabledFor(logging.INFO)
    finally:
        root.handlers[:], root.level = handlers, level
