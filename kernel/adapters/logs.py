"""Structured logging: one JSON object per line on stderr, with the ``extra`` fields merged in.

Every record written while a call, a run or a tenant is being handled carries their ids
(``log_context``: a context variable, so a task inherits the ids of the code that started it);
argument values are never among them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any

from opentelemetry import trace

_BOUND: ContextVar[Mapping[str, str]] = ContextVar(
    "toolfleet_log_context", default=MappingProxyType({})
)


@contextlib.contextmanager
def log_context(**ids: str | None) -> Iterator[None]:
    """Add ``ids`` (tenant_id, run_id, call_id, tool, trace_id...) to every record written
    inside the block and by the tasks started in it; None values are left out."""
    merged = {**_BOUND.get(), **{k: v for k, v in ids.items() if v is not None}}
    token = _BOUND.set(MappingProxyType(merged))
    try:
        yield
    finally:
        _BOUND.reset(token)


_STANDARD_FIELDS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Formats a record as JSON: time, level, logger, message, service and every extra field."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as a single JSON line."""
        entry: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_BOUND.get())
        span = trace.get_current_span().get_span_context()
        if span.is_valid:  # the record belongs to a traced call or turn: say which
            entry["trace_id"] = format(span.trace_id, "032x")
            entry["span_id"] = format(span.span_id, "016x")
        entry.update((k, v) for k, v in record.__dict__.items() if k not in _STANDARD_FIELDS)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(service: str, level: str = "INFO") -> None:
    """Send every log record of the process to stderr as JSON lines tagged with ``service``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiokafka logs every reconnect at WARNING/ERROR; keep it, but not its chatty INFO.
    logging.getLogger("aiokafka").setLevel(max(logging.WARNING, root.level))
