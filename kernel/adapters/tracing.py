"""OpenTelemetry traces: one trace per turn, its context carried from hop to hop in Kafka headers.

A turn's trace starts where its model response was made: the client puts the current W3C
``traceparent`` (or the one it is given) in the record's headers, so the turn joins the
agent's own trace. The planner's span (``toolfleet plan``) is the turn's root inside the fleet;
each call's execution on a worker (``toolfleet call <tool>``, with ``gate``, guardrail, ``body``
and ``publish`` phases) and the aggregation (``toolfleet aggregate``) are its children. Where a
hop waits in Redis rather than on a topic (a command queued for admission, a turn's plan in the
aggregator's state), the ``traceparent`` string is kept with it.

Nothing is recorded unless a tracer provider is configured (``configure_tracing``, from
``TOOLFLEET_TRACES``): without one the context still travels, so a trace started by the
client keeps its id across the fleet, but no span is made. Span attributes follow the
messaging and RPC semantic conventions plus ``toolfleet.*`` ids; never an argument value.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    TraceFlags,
    Tracer,
    TracerProvider,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kernel.errors import MissingExtraError
from kernel.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider

log = logging.getLogger(__name__)

Headers = list[tuple[str, bytes]]
"""Kafka record headers, as aiokafka takes and gives them."""

_PROPAGATOR = TraceContextTextMapPropagator()
_FIELDS = frozenset(_PROPAGATOR.fields)
_provider: TracerProvider | None = None
"""The provider spans go to; None: OpenTelemetry's global one."""


def use_tracer_provider(provider: TracerProvider | None) -> TracerProvider | None:
    """Send the spans of tracers made from now on to ``provider`` (None: back to the global
    provider); returns the one used before. For tests (``toolfleet.testing.capture_spans``)
    and embedders that keep their own provider."""
    global _provider
    previous, _provider = _provider, provider
    return previous


def tracer(service: str) -> Tracer:
    """The tracer of one service (instrumentation scope ``toolfleet.<service>``)."""
    provider = _provider if _provider is not None else trace.get_tracer_provider()
    return provider.get_tracer(f"toolfleet.{service}", _version())


def headers() -> Headers:
    """The current span's context as Kafka headers (none when no trace is current)."""
    return headers_of(trace.get_current_span())


def headers_of(span: Span) -> Headers:
    """``span``'s context as Kafka headers (none when it has no valid context)."""
    if not span.get_span_context().is_valid:  # the usual case with tracing off: no work
        return []
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return [(name, value.encode()) for name, value in carrier.items()]


def traceparent() -> str | None:
    """The current span's context as a W3C ``traceparent`` string, for state kept in Redis."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


def trace_id() -> str | None:
    """The current trace's id, 32 hex digits (None without a current trace)."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def context_from_headers(record_headers: Sequence[tuple[str, bytes]] | None) -> Context:
    """The trace context a record's headers carry (an empty context when they carry none)."""
    carrier = {
        name: value.decode("latin-1")
        for name, value in record_headers or ()
        if name in _FIELDS and value is not None
    }
    return _PROPAGATOR.extract(carrier)


def context_from_traceparent(value: str | None) -> Context:
    """The trace context of a ``traceparent`` string kept in Redis (empty when None)."""
    return _PROPAGATOR.extract({"traceparent": value} if value else {})


def context_of_trace(trace_id: str | None) -> Context:
    """A context in the trace ``trace_id`` (32 hex digits, as the ledger keeps a call's), for
    work on a call that no record's headers carry the context of: a lost worker's call, an
    operator's resolution. The ledger keeps the trace, not a span of it, so a span started
    here has a parent that is in no exporter's batch: it joins the trace at its top. Empty
    (a new trace) when ``trace_id`` is None or not a trace id."""
    try:
        number = int(trace_id or "", 16)
    except ValueError:
        number = 0
    if not 0 < number < 1 << 128 or len(trace_id or "") != 32:
        return Context()
    parent = SpanContext(
        trace_id=number,
        span_id=(number & ((1 << 64) - 1)) or 1,  # no span of the trace has it: a stand-in
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


@contextlib.contextmanager
def within(context: Context) -> Iterator[None]:
    """Run the block in ``context``'s trace (``context_from_traceparent``,
    ``context_of_trace``): its spans are children of that context's span, and what it
    publishes carries it."""
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


def messaging(topic: str, partition: int, offset: int, group: str) -> dict[str, Any]:
    """Semantic-convention attributes of processing one consumed Kafka record: ``topic`` and
    ``group`` as Kafka knows them (``Settings.topic``, ``Settings.group``: with the
    deployment's prefix), so a span names the topic and group an operator finds there."""
    return {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": topic,
        "messaging.destination.partition.id": str(partition),
        "messaging.kafka.offset": offset,
        "messaging.consumer.group.name": group,
    }


@contextlib.contextmanager
def consuming(service_tracer: Tracer, name: str, record: Any, group: str) -> Iterator[Span]:
    """A consumer span around handling ``record`` (read by consumer group ``group``, its full
    name: ``Settings.group``), child of the context in its headers. Its attributes are set
    only when it is recorded (the caller adds its own the same way): with tracing off,
    handling a record builds none."""
    with service_tracer.start_as_current_span(
        name,
        context=context_from_headers(getattr(record, "headers", None)),
        kind=SpanKind.CONSUMER,
    ) as span:
        if span.is_recording():
            span.set_attributes(messaging(record.topic, record.partition, record.offset, group))
        yield span


@contextlib.contextmanager
def phase(service_tracer: Tracer, name: str) -> Iterator[None]:
    """A child span of the current one for one phase of its work, only when the current one
    is recorded: a phase costs nothing while tracing is off."""
    if not trace.get_current_span().is_recording():
        yield
        return
    with service_tracer.start_as_current_span(name):
        yield


def configure_tracing(service: str, settings: Settings) -> SdkTracerProvider | None:
    """Install the process's tracer provider as ``TOOLFLEET_TRACES`` says: ``otlp`` exports
    over OTLP/HTTP (endpoint, headers and sampler from the standard ``OTEL_*`` variables),
    ``log`` writes batches of spans as JSON log lines, ``off`` records nothing. Returns the
    provider (shut it down on exit to flush), or None when off. ``otlp`` needs the exporter
    of the ``otlp`` extra; without it this raises ``MissingExtraError``, which says so."""
    if settings.traces == "off":
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

    exporter: SpanExporter
    if settings.traces == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ModuleNotFoundError as exc:  # the exporter, or a package it needs
            raise MissingExtraError(
                "TOOLFLEET_TRACES=otlp", extra="otlp", missing=exc.name
            ) from exc

        exporter = OTLPSpanExporter()
    else:
        from kernel.adapters.spans import LogSpanExporter

        exporter = LogSpanExporter()
    resource = Resource.create(
        {"service.name": f"toolfleet-{service}", "service.version": _version()}
    )
    provider = SdkTracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
    trace.set_tracer_provider(provider)
    log.info("tracing on", extra={"exporter": settings.traces})
    return provider


@functools.cache
def _version() -> str:
    try:
        return metadata.version("toolfleet")
    except metadata.PackageNotFoundError:
        return "0"
