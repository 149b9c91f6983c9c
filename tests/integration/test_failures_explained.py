"""Failures that explain themselves, on the real services (this event loop, real Kafka and
Redis: ``InProcessFleet``, whose spans an in-memory exporter sees):

- every failed attempt keeps its traceback in the ledger, secrets redacted; the console's call
  API returns each one, and the worker's log line for it names the call in full and links to
  the console's call view at that attempt;
- the reconciler's retries, probes and compensations (and a lost worker's call, an operator's
  resolution) are spans in the call's trace, between the worker spans they cause;
- a circuit's human tasks name each call by run and call, one task per tenant.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from playwright.async_api import async_playwright, expect
from pydantic import SecretStr
from redis.asyncio import Redis

from executors import ProbeResult, ToolContext, ToolRegistry
from kernel.adapters.bus import KafkaBus
from kernel.adapters.logs import JsonFormatter
from kernel.settings import Settings
from kernel.stores.ledger import Ledger, NewCall
from kernel.stores.tasks import StoredTask, TaskStore
from schemas import ModelResponseEvent
from tests.conftest import wait_for
from tests.integration.console_support import bearer, served_console, tokens_setting
from toolfleet.app import operations
from toolfleet.app.console import ConsoleOptions
from toolfleet.testing import InProcessFleet, capture_spans

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]

CONSOLE_URL = "https://console.example"
CHROMIUM = Path("/usr/bin/chromium")
SECRET = "hunter2-secret"
"""In each failure's message as ``password=...``: it must reach neither the ledger nor a log."""

tools = ToolRegistry()
upstream: dict[str, str] = {}
"""The fake upstream of the tools below (this process is the fleet's): idempotency key ->
what it holds."""


@tools.tool(effect="idempotent", timeout=10)
async def explained_upload(ctx: ToolContext, name: str) -> str:
    """Refused (nothing sent) on its first two attempts, stored on the third."""
    if ctx.attempt < 3:
        raise ConnectionRefusedError(
            111, f"Connection refused by files:443 (attempt {ctx.attempt}, password={SECRET})"
        )
    return f"uploaded {name}"


@tools.tool(effect="non_idempotent", timeout=10)
async def explained_ticket(ctx: ToolContext, title: str) -> str:
    """Opens the ticket upstream, then its response is lost: its effect is unknown."""
    upstream[ctx.idempotency_key] = f"ticket {title}"
    raise TimeoutError("The read operation timed out")


@explained_ticket.probe
async def _find_ticket(ctx: ToolContext) -> ProbeResult:
    found = upstream.get(ctx.idempotency_key)
    return ProbeResult.applied(found) if found else ProbeResult.not_applied()


@tools.tool(effect="non_idempotent", timeout=10)
async def explained_booking(ctx: ToolContext, seat: str) -> str:
    """Books the wrong seat upstream, then its response is lost."""
    upstream[ctx.idempotency_key] = f"WRONG {seat}"
    raise TimeoutError("The read operation timed out")


@explained_booking.probe
async def _find_booking(ctx: ToolContext) -> ProbeResult:
    found = upstream.get(ctx.idempotency_key, "")
    if found.startswith("WRONG"):
        return ProbeResult.wrong_effect(found, detail="upstream holds another seat")
    return ProbeResult.applied(found) if found else ProbeResult.not_applied()


@explained_booking.compensate
async def _cancel_booking(ctx: ToolContext, original_output: str) -> str:
    upstream[ctx.idempotency_key] = "CANCELLED"
    return "cancelled"


@tools.tool(effect="read_only", timeout=10)
async def explained_breaks(ctx: ToolContext) -> str:
    """A version that fails on every call: its circuit opens."""
    raise RuntimeError("the v2 index is corrupt")


@dataclass
class Fleet:
    """The fleet, the spans its services made, and a console of its tenants."""

    fleet: InProcessFleet
    spans: InMemorySpanExporter
    console: str

    @property
    def settings(self) -> Settings:
        """The fleet's settings (its own topic prefix and Redis namespace)."""
        return self.fleet.settings


@pytest.fixture(scope="module")
async def explained(settings: Settings) -> AsyncIterator[Fleet]:
    tuned = settings.model_copy(
        update={
            "recovery_max_attempts": 3,
            "recovery_retry_backoff_s": 0.05,
            "recovery_probe_backoff_s": 0.05,
            "recovery_report_after_s": 120.0,  # turns wait for the reconciler's verdict
            # Only a version that fails every call trips (explained_upload fails two in three).
            "circuit_min_calls": 6,
            "circuit_error_rate": 0.9,
            "circuit_cache_s": 0.0,
            "console_public_url": CONSOLE_URL,
            "console_tokens": SecretStr(tokens_setting()),
        }
    )
    with capture_spans() as spans:
        async with (
            InProcessFleet(tuned, tools, workers=1) as fleet,
            served_console(fleet.settings) as console,
        ):
            yield Fleet(fleet, spans, console)


def turn(tenant: str, *calls: tuple[str, str, dict[str, Any]], run: str = "") -> ModelResponseEvent:
    """A model response of ``tenant`` calling (call id, tool, arguments) in order."""
    run = run or f"run-{uuid.uuid4().hex[:10]}"
    return ModelResponseEvent.model_validate(
        {
            "tenant_id": tenant,
            "run_id": run,
            "turn_id": 0,
            "agent": {"name": "assistant"},
            "response_id": f"resp-{uuid.uuid4().hex[:8]}",
            "items": [
                {"type": "function_call", "call_id": c, "name": n, "arguments": json.dumps(a)}
                for c, n, a in calls
            ],
        }
    )


def traceparent() -> tuple[str, str]:
    """A new client trace: (trace id, traceparent header)."""
    trace_id = uuid.uuid4().hex
    return trace_id, f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"


class Trace:
    """The finished spans of one trace."""

    def __init__(self, spans: Sequence[ReadableSpan], trace_id: str) -> None:
        self.all = [s for s in spans if _trace(s) == trace_id]

    def named(self, name: str, **attributes: Any) -> list[ReadableSpan]:
        """Spans called ``name`` whose attributes include ``attributes`` (toolfleet.*)."""
        return [
            s
            for s in self.all
            if s.name == name
            and all((s.attributes or {}).get(f"toolfleet.{k}") == v for k, v in attributes.items())
        ]

    def parent_of(self, span: ReadableSpan) -> ReadableSpan:
        """The span's parent, which must be in the trace."""
        assert span.parent is not None, span.name
        [parent] = [s for s in self.all if _id(s) == span.parent.span_id]
        return parent

    def published_by(self, span: ReadableSpan) -> ReadableSpan:
        """The worker's call span whose outcome ``span`` handles: the parent of the call's
        ``publish`` phase, in which the outcome went out."""
        publish = self.parent_of(span)
        assert publish.name == "publish", publish.name
        return self.parent_of(publish)


async def trace_with(
    fleet: Fleet, trace_id: str, wanted: dict[str, int], within: float = 30.0
) -> Trace:
    """The trace once it holds at least ``wanted[name]`` finished spans of each name."""

    async def complete() -> list[Trace]:
        found = Trace(fleet.spans.get_finished_spans(), trace_id)
        counts = {name: len(found.named(name)) for name in wanted}
        return [found] if all(counts[n] >= k for n, k in wanted.items()) else []

    try:
        [done] = await wait_for(complete, within=within)
        return done
    except AssertionError:
        got = [
            (s.name, dict(s.attributes or {}))
            for s in Trace(fleet.spans.get_finished_spans(), trace_id).all
        ]
        raise AssertionError(f"trace {trace_id} lacks {wanted}: {got}") from None


def _id(span: ReadableSpan) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.span_id


def _trace(span: ReadableSpan) -> str:
    context = span.get_span_context()
    assert context is not None
    return format(context.trace_id, "032x")


def _attr(span: ReadableSpan, name: str) -> Any:
    return (span.attributes or {}).get(name)


# -- tracebacks kept with each attempt --------------------------------------------------------


async def test_each_failed_attempt_keeps_its_traceback_shown_by_the_api_and_linked_from_the_log(
    explained: Fleet, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="kernel.tools")
    event = turn("acme", ("call_1", "explained_upload", {"name": "report.pdf"}))
    result = await explained.fleet.client.run_turn(event, within=60)
    assert [o.output for o in result.outputs] == ["uploaded report.pdf"]

    # The ledger keeps both failed attempts, each with its own traceback, the secret out.
    view = await operations.read_call(redis, explained.settings, "acme", event.run_id, "call_1")
    assert [f.attempt for f in view.entry.failures] == [1, 2]
    for failure in view.entry.failures:
        assert failure.type == "ConnectionRefusedError"
        assert f"attempt {failure.attempt}, password=<redacted>" in failure.message
        assert failure.traceback.startswith("Traceback (most recent call last):")
        assert "raise ConnectionRefusedError(" in failure.traceback
        assert failure.traceback.rstrip().endswith("password=<redacted>)")
        assert failure.worker_id is not None
    assert view.entry.outcome is not None and view.entry.outcome.status == "succeeded"

    # The console's call API returns every failed attempt with its traceback.
    async with httpx.AsyncClient(base_url=explained.console, headers=bearer("vera")) as http:
        reply = await http.get(f"/api/calls/acme/call_1?run={event.run_id}")
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert [(f["attempt"], f["type"]) for f in body["failures"]] == [
            (1, "ConnectionRefusedError"), (2, "ConnectionRefusedError"),
        ]  # fmt: skip
        assert all("raise ConnectionRefusedError(" in f["traceback"] for f in body["failures"])
        assert body["entry"]["failure"]["attempt"] == 2  # the latest, where it always was
        assert SECRET not in reply.text

        # The worker logged each failure naming the call in full, with a link to its view.
        lines = [
            r for r in caplog.records
            if r.name == "kernel.tools" and r.__dict__.get("call_id") == "call_1"
            and r.__dict__.get("run_id") == event.run_id
        ]  # fmt: skip
        assert [r.__dict__["attempt"] for r in lines] == [1, 2]
        formatter = JsonFormatter("worker-default")
        for record in lines:
            line = json.loads(formatter.format(record))
            assert (line["tenant_id"], line["run_id"], line["call_id"]) == (
                "acme", event.run_id, "call_1",
            )  # fmt: skip
            assert line["call_view"] == (
                f"{CONSOLE_URL}/calls/acme/call_1?run={event.run_id}#attempt-{line['attempt']}"
            )
            assert SECRET not in json.dumps(line)
            # From the log line to the call view: its page, and the failure of that attempt.
            link = urlsplit(line["call_view"])
            assert link.geturl().startswith(CONSOLE_URL)
            page = await http.get(f"{link.path}?{link.query}")
            assert page.status_code == 200 and "<html" in page.text.lower()
            _, _, tenant, call = link.path.split("/", 3)
            run = parse_qs(link.query)["run"][0]
            shown = (await http.get(f"/api/calls/{tenant}/{call}?run={run}")).json()
            attempt = int(link.fragment.removeprefix("attempt-"))
            [failure] = [f for f in shown["failures"] if f["attempt"] == attempt]
            assert failure["type"] == line["error_type"]
            assert unquote(call) == "call_1"


@pytest.fixture(scope="module")
def chromium() -> Path:
    """Debian's chromium: missing, the test fails (it never skips)."""
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: run scripts/install-chromium.sh"
    return CHROMIUM


async def test_the_call_page_shows_each_failed_attempt_opening_the_one_a_log_line_links(
    explained: Fleet, chromium: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """In headless Chromium (Debian's): the link of a failure's log line opens the call's page
    at that attempt's traceback; every other failed attempt is there, folded."""
    caplog.set_level(logging.WARNING, logger="kernel.tools")
    event = turn("acme", ("call_1", "explained_upload", {"name": "slides.key"}))
    assert (await explained.fleet.client.run_turn(event, within=60)).status == "completed"
    [first] = [
        r.__dict__["call_view"] for r in caplog.records
        if r.__dict__.get("run_id") == event.run_id and r.__dict__.get("attempt") == 1
    ]  # fmt: skip
    link = urlsplit(first)
    token = uuid.uuid4().hex
    local = explained.settings.model_copy(update={"console_tokens": None})
    async with (
        served_console(local, ConsoleOptions(local_token=token)) as url,
        async_playwright() as playwright,
    ):
        browser = await playwright.chromium.launch(executable_path=str(chromium), headless=True)
        try:
            page = await browser.new_page(base_url=url)
            await page.goto(f"/?token={token}")  # this console's local login
            await page.goto(f"{link.path}?{link.query}#{link.fragment}")
            await expect(page.locator("h1")).to_have_text("call call_1")
            await expect(page.locator("h2", has_text="What the tool raised")).to_have_text(
                "What the tool raised (2 failed attempts)"
            )
            linked, later = page.locator("details#attempt-1"), page.locator("details#attempt-2")
            await expect(linked).to_have_attribute("open", "")
            await expect(later).not_to_have_attribute("open", "")
            await expect(linked.locator("summary")).to_contain_text(
                "attempt 1: ConnectionRefusedError"
            )
            await expect(linked.locator("pre")).to_contain_text("raise ConnectionRefusedError(")
            await expect(linked.locator("pre")).to_be_visible()
            await expect(later.locator("summary")).to_contain_text("attempt 2")
            await later.locator("summary").click()
            await expect(later.locator("pre")).to_contain_text("(attempt 2, password=<redacted>)")
            assert SECRET not in await page.content()
        finally:
            await browser.close()


# -- the reconciler's spans in the call's trace -----------------------------------------------


async def test_the_reconcilers_retries_are_spans_between_the_attempts_they_cause(
    explained: Fleet,
) -> None:
    trace_id, parent = traceparent()
    event = turn("acme", ("call_1", "explained_upload", {"name": "notes.txt"}))
    result = await explained.fleet.client.run_turn(event, within=60, traceparent=parent)
    assert [o.output for o in result.outputs] == ["uploaded notes.txt"]
    trace = await trace_with(
        explained,
        trace_id,
        {"toolfleet call explained_upload": 3, "toolfleet retry explained_upload": 2},
    )
    calls = {
        _attr(s, "toolfleet.attempt"): s
        for s in trace.named("toolfleet call explained_upload", run_id=event.run_id)
    }
    assert set(calls) == {1, 2, 3}
    retries = trace.named("toolfleet retry explained_upload", run_id=event.run_id)
    assert sorted(_attr(r, "toolfleet.attempt") for r in retries) == [2, 3]
    for retry in retries:
        attempt = _attr(retry, "toolfleet.attempt")
        assert retry.instrumentation_scope is not None
        assert retry.instrumentation_scope.name == "toolfleet.reconciler"
        assert _attr(retry, "toolfleet.call_id") == "call_1"
        assert _attr(retry, "toolfleet.tenant_id") == "acme"
        assert _attr(retry, "messaging.destination.name") == explained.settings.topic(
            "commands.default"
        )
        # attempt N's failure -> the reconciler's reconciliation -> its retry -> attempt N+1
        reconcile = trace.parent_of(retry)
        assert reconcile.name == "toolfleet reconcile explained_upload"
        assert _attr(reconcile, "toolfleet.action") == "Retry"
        assert _attr(reconcile, "toolfleet.attempt") == attempt - 1
        assert _attr(reconcile, "messaging.consumer.group.name") == explained.settings.group(
            "reconciler"
        )
        assert trace.published_by(reconcile) is calls[attempt - 1]
        assert trace.parent_of(calls[attempt]) is retry


async def test_a_probe_is_a_span_between_the_unknown_call_and_the_workers_probe(
    explained: Fleet,
) -> None:
    trace_id, parent = traceparent()
    event = turn("acme", ("call_7", "explained_ticket", {"title": "printer jam"}))
    result = await explained.fleet.client.run_turn(event, within=60, traceparent=parent)
    assert [(c.effect, o.output) for c, o in zip(result.calls, result.outputs, strict=True)] == [
        ("applied", "ticket printer jam"),
    ]
    trace = await trace_with(
        explained,
        trace_id,
        {"toolfleet call explained_ticket": 2, "toolfleet reconcile explained_ticket": 2},
    )
    [executed] = trace.named("toolfleet call explained_ticket", kind="execute")
    [probe] = trace.named("toolfleet probe explained_ticket")
    assert trace.published_by(trace.parent_of(probe)) is executed  # unknown -> reconcile -> probe
    assert _attr(trace.parent_of(probe), "toolfleet.action") == "Probe"
    [probed] = trace.named("toolfleet call explained_ticket", kind="probe")
    assert trace.parent_of(probed) is probe
    [answer] = trace.named("toolfleet reconcile explained_ticket", kind="probe")
    assert trace.published_by(answer) is probed
    assert _attr(answer, "toolfleet.action") == "ResolveApplied"


async def test_a_compensation_an_operator_approves_is_in_the_calls_trace(
    explained: Fleet, redis: Redis
) -> None:
    trace_id, parent = traceparent()
    event = turn("acme", ("call_3", "explained_booking", {"seat": "12A"}))
    await explained.fleet.client.submit(event, traceparent=parent)
    tasks = TaskStore(redis, explained.fleet.keys)

    async def asked() -> StoredTask | None:
        found = [
            t for t in await tasks.all()
            if t.task.kind == "compensation_approval" and t.task.run_id == event.run_id
        ]  # fmt: skip
        return found[0] if found else None

    task = await wait_for(asked, within=30)
    assert task is not None
    bus = KafkaBus(explained.settings, "test-operator")
    await bus.start()
    try:
        await operations.resolve_task(
            redis, bus, explained.settings, task.task.task_id, "approve_compensation",
            decided_by="ops",
        )  # fmt: skip
    finally:
        await bus.stop()
    result = await explained.fleet.client.result(event.run_id, 0, within=60)
    assert result.calls[0].effect == "compensated"
    trace = await trace_with(
        explained,
        trace_id,
        {"toolfleet call explained_booking": 3, "toolfleet compensate explained_booking": 1},
    )
    # The operator's resolution joins the call's trace (the ledger keeps its id, not a span).
    [resolution] = trace.named("toolfleet resolution explained_booking")
    assert resolution.parent is not None and resolution.parent.is_remote
    assert _attr(resolution, "toolfleet.resolution") == "approve_compensation"
    assert _attr(resolution, "toolfleet.task_id") == task.task.task_id
    [compensate] = trace.named("toolfleet compensate explained_booking")
    assert trace.parent_of(compensate) is resolution
    [ran] = trace.named("toolfleet call explained_booking", kind="compensate")
    assert _attr(ran, "toolfleet.call_id") == "call_3#compensate"
    assert trace.parent_of(ran) is compensate
    [answer] = trace.named("toolfleet reconcile explained_booking", kind="compensate")
    assert trace.published_by(answer) is ran


async def test_a_lost_workers_call_is_reconciled_in_its_trace(
    explained: Fleet, redis: Redis
) -> None:
    """A worker that died without an outcome leaves only the ledger: the call's trace id
    there is where the reconciler's spans of it go."""
    trace_id = uuid.uuid4().hex
    run = f"run-{uuid.uuid4().hex[:10]}"
    ledger = Ledger(redis, explained.fleet.keys)
    call = NewCall(
        "call_9", "fp", f"idem-{run}", run, 0, "explained_vanished", "default",
        trace_id=trace_id,
    )  # fmt: skip
    await ledger.create("acme", run, [call], dispatch=["call_9"])
    verdict, _ = await ledger.begin(
        "acme", run, "call_9", token=1, worker_id="gone-worker", lease_s=0.2
    )
    assert verdict == "run"  # started, then its worker is gone: the lease runs out
    trace = await trace_with(
        explained,
        trace_id,
        {
            "toolfleet lease expired explained_vanished": 1,
            "toolfleet reconcile explained_vanished": 1,
        },
    )
    [expired] = trace.named("toolfleet lease expired explained_vanished")
    assert expired.parent is not None and expired.parent.is_remote
    assert (_attr(expired, "toolfleet.run_id"), _attr(expired, "toolfleet.call_id")) == (
        run, "call_9",
    )  # fmt: skip
    [reconcile] = trace.named("toolfleet reconcile explained_vanished")
    assert trace.parent_of(reconcile) is expired
    assert _attr(reconcile, "toolfleet.effect") == "unknown"


# -- tasks that name calls in full ------------------------------------------------------------


async def test_a_circuits_tasks_name_each_call_by_run_one_task_per_tenant(
    explained: Fleet, redis: Redis
) -> None:
    """The same call ids in every run (as a model's are): a task that listed bare ids
    (``call_2, call_2, ...``) named no call an operator could find."""
    runs = [("acme", "a-acme-1"), ("globex", "a-globex-1"), ("acme", "a-acme-2")]
    for tenant, run in runs:  # one after another: the 6th failure opens the circuit
        event = turn(
            tenant, ("call_1", "explained_breaks", {}), ("call_2", "explained_breaks", {}), run=run
        )
        result = await explained.fleet.client.run_turn(event, within=60)
        assert {c.status for c in result.calls} == {"failed"}
    store = TaskStore(redis, explained.fleet.keys)

    async def filed() -> dict[str, StoredTask] | None:
        found = {
            t.task.tenant_id: t for t in await store.all()
            if t.task.kind == "circuit_open" and t.task.tool_name == "explained_breaks"
        }  # fmt: skip
        return found if len(found) == 2 else None

    tasks = await wait_for(filed, within=30)
    assert tasks is not None
    assert sorted(tasks["acme"].task.calls) == [
        "a-acme-1/call_1", "a-acme-1/call_2", "a-acme-2/call_1", "a-acme-2/call_2",
    ]  # fmt: skip
    assert sorted(tasks["globex"].task.calls) == ["a-globex-1/call_1", "a-globex-1/call_2"]
    assert "(run/call)" in tasks["acme"].task.reason

    # The console lists them apart, each one a call an operator can open.
    async with httpx.AsyncClient(base_url=explained.console, headers=bearer("vera")) as http:
        reply = await http.get("/api/tasks")
        assert reply.status_code == 200, reply.text
    shown = {
        t["tenant_id"]: t for t in reply.json()["tasks"] if t["tool_name"] == "explained_breaks"
    }
    assert sorted((c["run_id"], c["call_id"]) for c in shown["acme"]["call_refs"]) == [
        ("a-acme-1", "call_1"), ("a-acme-1", "call_2"), ("a-acme-2", "call_1"),
        ("a-acme-2", "call_2"),
    ]  # fmt: skip
    assert sorted((c["run_id"], c["call_id"]) for c in shown["globex"]["call_refs"]) == [
        ("a-globex-1", "call_1"), ("a-globex-1", "call_2"),
    ]  # fmt: skip
    # Every listed call is one the ledger knows, under that run.
    for ref in shown["acme"]["call_refs"]:
        view = await operations.read_call(
            redis, explained.settings, "acme", ref["run_id"], ref["call_id"]
        )
        assert view.entry.run_id == ref["run_id"]
