"""Structured logging: one JSON object per line on stderr, with the ``extra`` fields merged in.

Every record written while a call, a run or a tenant is being handled carries their ids
(``log_context``: a context variable, so a task inherits the ids of the code that started it;
which ids: ``ids_of``);
argument values are never among them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any

from opentelemetry import trace

from kernel.adapters.dependencies import DEPENDENCIES, LibraryLogFilter

_BOUND: ContextVar[Mapping[str, str]] = ContextVar(
    "toolfleet_log_context", default=MappingProxyType({})
)


_IDS = (("tenant_id", "tenant_id"), ("run_id", "run_id"), ("call_id", "call_id"),
        ("tool", "tool_name"))  # fmt: skip
"""The ids a log line carries, and the field of a handled message each is read from."""


def ids_of(handled: object) -> dict[str, str | None]:
    """The ids of what a handler is handling (a command, an outcome, a response, a decision,
    a cancellation): tenant, run, call and tool, as far as the message names them. Every
    service binds them the same way: ``with log_context(**ids_of(message)):``."""
    ids: dict[str, str | None] = {}
    for name, field in _IDS:
        value = getattr(handled, field, None)
        ids[name] = value if isinstance(value, str) else None
    return ids


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
        elif record.exc_text:  # a traceback kept as text (a tool's, with arguments redacted)
            entry["exc"] = record.exc_text
        return json.dumps(entry, default=str)


def configure_logging(service: str, level: str = "INFO") -> None:
    """Send every log record of the process to stderr as JSON lines tagged with ``service``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    # aiokafka and redis-py log every reconnect attempt: folded into one line when Kafka or
    # Redis goes away and one when it is back (kernel.adapters.dependencies).
    handler.addFilter(LibraryLogFilter(DEPENDENCIES, debug=level.upper() == "DEBUG"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Not aiokafka's chatty INFO (every group join, every metadata refresh).
    logging.getLogger("aiokafka").setLevel(max(logging.WARNING, root.level))


class RecurringFailure:
    """A failure that may repeat on every pass of a loop, logged without flooding: the first
    with its traceback, then at most one line per ``every_s`` with how many passes failed
    since, and one line when a pass succeeds again.

    A loop that fails every 50 ms (admission's tick against a Redis that is away) wrote a
    traceback every 50 ms; dependency outages are said by the dependency monitor instead, and
    this is for everything else (a bug, a script the server refuses).
    """

    def __init__(self, logger: logging.Logger, what: str, *, every_s: float = 60.0) -> None:
        self.logger = logger
        self.what = what
        self.every_s = every_s
        self.failures = 0
        self._unsaid = 0
        self._said_at = float("-inf")

    def failed(self, exc: BaseException) -> None:
        """One more failed pass."""
        self.failures += 1
        now = time.monotonic()
        if self.failures == 1:
            self.logger.error("%s", self.what, exc_info=exc)
            self._said_at = now
        elif now - self._said_at >= self.every_s:
            self.logger.error(
                "%s again (%d times in %.0f s): %r",
                self.what,
                self._unsaid + 1,
                now - self._said_at,
                exc,
            )
            self._said_at, self._unsaid = now, 0
        else:
            self._unsaid += 1

    def succeeded(self) -> None:
        """A pass worked: say so if passes had failed."""
        if self.failures:
            self.logger.warning("%s: works again after %d failed passes", self.what, self.failures)
        self.failures, self._unsaid = 0, 0
