"""Traces exported over OTLP/HTTP by a fleet of processes, as a deployment configures it.

A small OTLP/HTTP receiver written for the test (the collector's ``POST /v1/traces``, protobuf
bodies) stands where an OpenTelemetry Collector would; the planner, the workers and the
aggregator run as processes with ``TOOLFLEET_TRACES=otlp`` and the standard
``OTEL_EXPORTER_OTLP_ENDPOINT``. One turn's spans arrive from each service under its own
``service.name``, in one trace: the client's.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from kernel.settings import Settings
from tests.conftest import wait_for
from tests.integration.test_pipeline import turn
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]


class Receiver:
    """Spans received on ``/v1/traces``: (service.name, span name, trace id hex, attributes)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest.FromString(body)
                with receiver.lock:
                    for resource_spans in request.resource_spans:
                        service = next(
                            a.value.string_value
                            for a in resource_spans.resource.attributes
                            if a.key == "service.name"
                        )
                        for scope in resource_spans.scope_spans:
                            for span in scope.spans:
                                attributes = {
                                    a.key: a.value.string_value or a.value.int_value
                                    for a in span.attributes
                                }
                                receiver.spans.append(
                                    (service, span.name, span.trace_id.hex(), attributes)
                                )
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        """What ``OTEL_EXPORTER_OTLP_ENDPOINT`` names."""
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def of_run(self, run_id: str) -> list[tuple[str, str, str, dict[str, Any]]]:
        """The spans that name ``run_id``."""
        with self.lock:
            return [s for s in self.spans if s[3].get("toolfleet.run_id") == run_id]


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.server.shutdown()


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str], receiver: Receiver) -> Iterator[LocalFleet]:
    env = {"TOOLFLEET_TRACES": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
    with LocalFleet(
        settings, tools="tests.integration.fleet_tools:tools", workers=2, extra_env=env
    ) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


async def test_every_service_exports_its_spans_of_the_turn_in_the_clients_trace(
    client: FleetClient, receiver: Receiver
) -> None:
    trace_id = uuid.uuid4().hex
    event = turn(("a", "add", {"a": 1, "b": 2}), ("b", "add", {"a": 3, "b": 4}))
    result = await client.run_turn(event, traceparent=f"00-{trace_id}-{'1' * 16}-01")
    assert result.status == "completed"

    async def exported() -> set[tuple[str, str]]:
        spans = receiver.of_run(event.run_id)
        names = {(service, name) for service, name, _, _ in spans}
        wanted = {
            ("toolfleet-planner", "toolfleet plan"),
            ("toolfleet-worker-default", "toolfleet call add"),
            ("toolfleet-aggregator", "toolfleet aggregate"),
        }
        # Both calls' spans: each worker process exports its own, in its own batches.
        calls = [s for s in spans if s[1] == "toolfleet call add"]
        return names if wanted <= names and len(calls) >= 2 else set()

    await wait_for(exported, within=15)  # each batch processor exports every 0.2 s
    spans = receiver.of_run(event.run_id)
    assert {trace for _, _, trace, _ in spans} == {trace_id}
    assert len([s for s in spans if s[1] == "toolfleet call add"]) == 2
