"""The log exporter (TOOLFLEET_TRACES=log): a batch of spans is one JSON log record."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from kernel.adapters.spans import LogSpanExporter


def _exported(caplog: pytest.LogCaptureFixture) -> list[list[dict[str, object]]]:
    return [
        record.spans  # type: ignore[attr-defined]
        for record in caplog.records
        if record.name == "kernel.adapters.spans"
    ]


def test_each_batch_is_one_record_with_ids_parents_and_attributes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kernel.adapters.spans")
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(LogSpanExporter()))
    tracer = provider.get_tracer("test")
    call_attributes = {"toolfleet.call_id": "c1"}
    with (
        tracer.start_as_current_span("toolfleet call add", attributes=call_attributes),
        tracer.start_as_current_span("body"),
    ):
        pass
    [body], [call] = _exported(caplog)
    assert call["name"] == "toolfleet call add" and call["toolfleet.call_id"] == "c1"
    assert body["name"] == "body" and body["parent_id"] == call["span_id"]
    assert body["trace_id"] == call["trace_id"] and len(str(call["trace_id"])) == 32
    assert call["parent_id"] is None
    assert float(str(call["end"])) >= float(str(call["start"])) > 0
