"""A span exporter that writes spans as JSON log lines (``TOOLFLEET_TRACES=log``).

For deployments whose log pipeline is their tracing backend, and for looking at a fleet's
traces without a collector. OpenTelemetry's batch processor hands it many spans at once; they
are written as one record, ``{"msg": "spans", "spans": [...]}``, outside any one call's log
context (a batch holds many calls' spans).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

_log = logging.getLogger("kernel.adapters.spans")


class LogSpanExporter(SpanExporter):
    """Logs each batch of finished spans as one JSON record."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Write ``spans`` as one log record."""
        batch = [span_record(span) for span in spans]
        if batch:
            contextvars.Context().run(_log.info, "spans", extra={"spans": batch})
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release."""


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """One span as a JSON-ready dict: ids in hex, times in seconds, attributes as set."""
    context = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name,
        "trace_id": format(context.trace_id, "032x") if context else None,
        "span_id": format(context.span_id, "016x") if context else None,
        "parent_id": format(parent.span_id, "016x") if parent else None,
        "service": span.resource.attributes.get("service.name"),
        "start": (span.start_time or 0) / 1e9,
        "end": (span.end_time or 0) / 1e9,
        "status": span.status.status_code.name.lower(),
        **dict(span.attributes or {}),
    }
