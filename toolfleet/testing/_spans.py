"""Spans made in this process, kept in memory: for tests of what a fleet traces."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kernel.adapters.tracing import use_tracer_provider


@contextlib.contextmanager
def capture_spans() -> Iterator[InMemorySpanExporter]:
    """Record the spans of every toolfleet service built inside the block (services take
    their tracer when they are built), in memory: ``exporter.get_finished_spans()``."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    previous = use_tracer_provider(provider)
    try:
        yield exporter
    finally:
        use_tracer_provider(previous)
        provider.shutdown()
