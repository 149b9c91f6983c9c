"""The console's web application: HTML pages, a JSON API under ``/api``, the live feed as
server-sent events on ``/events``, and ``/healthz``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kernel.adapters.bus import TRANSIENT_ERRORS, KafkaBus
from kernel.adapters.redis import connect_redis
from kernel.errors import (
    ConfigurationError,
    InvalidMessageError,
    ToolfleetError,
    UnavailableError,
    UsageError,
)
from kernel.rules.versions import version_ref
from kernel.settings import Settings
from toolfleet.app import operations
from toolfleet.app.console._access import Access
from toolfleet.app.console._feed import Dropped, FeedEvent, Filter, LiveFeed, StatusChange
from toolfleet.app.console._views import (
    approval_json,
    call_json,
    circuits_json,
    task_json,
    tool_json,
)

log = logging.getLogger(__name__)

PAGES = ("/", "/tasks", "/circuits")
"""The console's pages (and every call's, under /calls/TENANT/CALL_ID)."""

_BODY_MAX_BYTES = 65_536
_PING_S = 15.0


@dataclass(frozen=True)
class ConsoleOptions:
    """How one console runs: whom it shows, who decides, how much it keeps."""

    tenant: str | None = None
    """Show and act for this tenant only (None: every tenant)."""
    operator: str | None = None
    """A fixed operator name, for a console on one's own machine."""
    operator_header: str | None = "X-Forwarded-User"
    """The header the authenticating proxy in front of the console sets to the operator."""
    ring_size: int = 500
    """Recent turns (and outcomes) kept for a page that has just opened."""
    queue_size: int = 1_000
    """Events one browser may fall behind by before it loses some (and is told)."""
    max_subscribers: int = 100
    """Live connections served at once."""
    refresh_s: float = 2.0
    """How often the task and circuit pages refresh."""


class _Unavailable(UnavailableError):
    """Kafka is not connected yet: decisions cannot be published now."""


def _status_of(exc: ToolfleetError) -> int:
    if isinstance(exc, operations.NotAllowedError):
        return 403
    if isinstance(exc, operations.NotFoundError):
        return 404
    if isinstance(exc, operations.AlreadyDecidedError):
        return 409
    if isinstance(exc, ConfigurationError):
        return 500
    if isinstance(exc, UsageError | InvalidMessageError):
        return 400
    return 503


class _Headers:
    """Security headers on every response (pure ASGI: streaming responses stay streamed)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [
                    (b"content-security-policy", _CSP),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"x-frame-options", b"DENY"),
                ]
                if not scope["path"].startswith("/static/"):
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


_CSP = (
    b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


class Console:
    """The console's state (feed, Redis, Kafka producer) and its request handlers."""

    def __init__(self, settings: Settings, options: ConsoleOptions) -> None:
        self.settings = settings
        self.options = options
        self.access = Access(options.tenant, options.operator, options.operator_header)
        self.feed = LiveFeed(
            settings,
            tenant=options.tenant,
            ring_size=options.ring_size,
            queue_size=options.queue_size,
            max_subscribers=options.max_subscribers,
        )
        self.bus = KafkaBus(settings, service="console")
        self.bus_ready = False
        self._redis: Redis | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._page = (resources.files(__package__) / "static" / "index.html").read_text()

    @property
    def redis(self) -> Redis:
        """The console's Redis connection (made at start-up)."""
        assert self._redis is not None, "the console is not started"
        return self._redis

    # --- life ---------------------------------------------------------------------------------
    @asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        """Connect Redis, start the feed and the producer; close them at the end."""
        self._redis = connect_redis(self.settings)
        await self.feed.start()
        self._connecting = asyncio.create_task(self._start_bus())
        try:
            yield
        finally:
            self._connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connecting
            await self.feed.stop()
            with contextlib.suppress(*TRANSIENT_ERRORS):
                await self.bus.stop()
            await self._redis.aclose()

    async def _start_bus(self) -> None:
        backoff = 0.5
        while True:
            try:
                await self.bus.start()
            except TRANSIENT_ERRORS as exc:
                log.warning("console: Kafka unavailable", extra={"error": repr(exc)})
                with contextlib.suppress(*TRANSIENT_ERRORS):
                    await self.bus.stop()
                await asyncio.sleep(backoff)  # wait-ok: reconnect backoff
                backoff = min(backoff * 2, 10.0)
            else:
                self.bus_ready = True
                return

    def _started_bus(self) -> KafkaBus:
        if not self.bus_ready:
            raise _Unavailable("Kafka is not connected yet: the decision was not sent; retry")
        return self.bus

    # --- pages and probes ---------------------------------------------------------------------
    async def page(self, _request: Request) -> Response:
        """Every page is the same document; its script renders what the path names."""
        return HTMLResponse(self._page)

    async def healthz(self, _request: Request) -> Response:
        """200 while Redis answers and the feed is live; 503 with what is wrong otherwise."""
        problems = []
        try:
            await asyncio.wait_for(self.redis.ping(), 2.0)
        except TRANSIENT_ERRORS as exc:
            problems.append(f"redis: {exc!r}")
        if self.feed.state != "live":
            problems.append(f"feed: {self.feed.state} {self.feed.error or ''}".strip())
        if not self.bus_ready:
            problems.append("kafka producer: not connected")
        body = {"ok": not problems, "feed": self.feed.state, "problems": problems}
        return JSONResponse(body, status_code=200 if not problems else 503)

    async def config(self, request: Request) -> Response:
        """What the page needs to know: the tenant scope, the operator, the refresh."""
        operator, source = self.access.who(request)
        return JSONResponse(
            {
                "tenant": self.options.tenant,
                "operator": operator,
                "operator_source": source,
                "operator_header": self.options.operator_header,
                "decision_auth": self.settings.decision_auth,
                "refresh_s": self.options.refresh_s,
                "feed": {"state": self.feed.state, "error": self.feed.error},
            }
        )

    # --- the live feed ------------------------------------------------------------------------
    def _filter(self, request: Request) -> Filter:
        q = request.query_params
        tenant = self.access.scope(q.get("tenant"))
        return Filter(tenant=tenant, run=q.get("run") or None, tool=q.get("tool") or None)

    async def recent(self, request: Request) -> Response:
        """Recent turns (and outcomes, unless outcomes=0) that pass the filter, oldest first."""
        flt = self._filter(request)
        outcomes = request.query_params.get("outcomes", "1") != "0"
        limit = _int(request.query_params.get("limit"), 200, high=self.options.ring_size * 2)
        events = self.feed.recent(flt, outcomes=outcomes, limit=limit)
        return JSONResponse({"events": [e.data for e in events], "feed": self.feed.state})

    async def events(self, request: Request) -> Response:
        """The live feed as server-sent events: ``status``, then the recent events that pass
        the filter, then each new one as it is read (``turn``, ``outcome``), and ``dropped``
        when this browser fell too far behind."""
        flt = self._filter(request)
        outcomes = request.query_params.get("outcomes", "1") != "0"
        after = _int(request.headers.get("last-event-id"), 0)
        subscribed = self.feed.subscribe(flt, outcomes=outcomes, after=after)
        if subscribed is None:
            return JSONResponse({"error": "too many live connections; retry later"}, 503)
        subscription, backlog = subscribed

        async def stream() -> AsyncIterator[ServerSentEvent]:
            try:
                status = {"state": self.feed.state, "error": self.feed.error}
                yield ServerSentEvent(data=json.dumps(status), event="status", retry=2_000)
                for event in backlog:
                    yield _sse(event)
                while True:
                    item = await subscription.next()
                    if item is None:
                        return
                    if isinstance(item, FeedEvent):
                        yield _sse(item)
                    elif isinstance(item, Dropped):
                        yield ServerSentEvent(
                            data=json.dumps({"count": item.count}), event="dropped"
                        )
                    elif isinstance(item, StatusChange):
                        data = json.dumps({"state": item.state, "error": item.error})
                        yield ServerSentEvent(data=data, event="status")
            finally:
                self.feed.unsubscribe(subscription)

        return EventSourceResponse(stream(), ping=_PING_S, headers={"X-Accel-Buffering": "no"})

    # --- calls, tasks, approvals --------------------------------------------------------------
    async def call(self, request: Request) -> Response:
        """A call's ledger entry (arguments as their digest), audit chain, upstream reference
        and trace link."""
        tenant = request.path_params["tenant"]
        self.access.scope(tenant)
        view = await operations.read_call(
            self.redis,
            self.settings,
            tenant,
            request.query_params.get("run", ""),
            request.path_params["call_id"],
            tenant=self.options.tenant,
        )
        return JSONResponse(call_json(view, self.settings.trace_url_template))

    async def tasks(self, request: Request) -> Response:
        """Open human tasks (all=1: resolved ones too), oldest first."""
        found = await operations.list_tasks(
            self.redis,
            self.settings,
            include_resolved=request.query_params.get("all") == "1",
            tenant=self.options.tenant,
        )
        return JSONResponse({"tasks": [task_json(t) for t in found]})

    async def resolve(self, request: Request) -> Response:
        """Answer a human task (signed, published; the reconciler carries it out)."""
        operator = self._decider(request)
        body = await _body(request)
        resolution = body.get("resolution")
        if resolution not in operations.RESOLUTIONS:
            raise UsageError(f"resolution must be one of {', '.join(operations.RESOLUTIONS)}")
        task_id = request.path_params["task_id"]
        sent = await operations.resolve_task(
            self.redis,
            self._started_bus(),
            self.settings,
            task_id,
            resolution,
            decided_by=operator,
            output=_text(body, "output"),
            note=_text(body, "note"),
            tenant=self.options.tenant,
        )
        log.info(
            "console decision",
            extra={"operator": operator, "task": task_id, "resolution": resolution},
        )
        return JSONResponse({"sent": sent.model_dump(mode="json", exclude={"signature"})}, 202)

    async def approvals(self, _request: Request) -> Response:
        """Calls waiting for approval: the ledger's index, and interruptions seen live."""
        seen = [
            (e.tenant_id, e.run_id, i["call_id"])
            for e in self.feed.recent(Filter(tenant=self.options.tenant), outcomes=False)
            for i in e.data["interruptions"]
        ]
        found = await operations.pending_approvals(
            self.redis, self.settings, tenant=self.options.tenant, also=seen
        )
        return JSONResponse({"approvals": [approval_json(p) for p in found]})

    async def decide(self, request: Request) -> Response:
        """Approve or reject a call waiting for approval (signed, published; the planner
        records it, and the agent runtime's resumed turn acts on it)."""
        operator = self._decider(request)
        body = await _body(request)
        approve = body.get("approve")
        if not isinstance(approve, bool):
            raise UsageError("approve must be true or false")
        ids = {k: _text(body, k) for k in ("tenant_id", "run_id", "call_id")}
        missing = [k for k, v in ids.items() if not v]
        if missing:
            raise UsageError(f"missing {', '.join(missing)}")
        self.access.scope(ids["tenant_id"])
        sent = await operations.decide_approval(
            self.redis,
            self._started_bus(),
            self.settings,
            tenant_id=str(ids["tenant_id"]),
            run_id=str(ids["run_id"]),
            call_id=str(ids["call_id"]),
            approve=approve,
            decided_by=operator,
            message=_text(body, "message"),
            tenant=self.options.tenant,
        )
        log.info(
            "console decision",
            extra={"operator": operator, "call": sent.call_id, "approve": approve},
        )
        return JSONResponse({"sent": sent.model_dump(mode="json", exclude={"signature"})}, 202)

    # --- circuits and versions ----------------------------------------------------------------
    async def circuits(self, _request: Request) -> Response:
        """Every tool's live versions (where new calls go, pins) and their open circuits
        (read per live version: ``toolfleet tools circuits`` scans the whole keyspace, too
        slow for a page that refreshes every few seconds)."""
        views = []
        for name in await operations.list_tools(self.redis, self.settings):
            with contextlib.suppress(operations.NotFoundError):  # unpublished meanwhile
                views.append(await operations.tool_versions(self.redis, self.settings, name))
        opened = {
            version_ref(view.name, v.version): v.circuit
            for view in views
            for v in view.versions
            if v.circuit is not None
        }
        return JSONResponse(
            {
                "circuits": circuits_json(opened),
                "tools": [tool_json(v) for v in views],
                "actions": self.options.tenant is None,
            }
        )

    async def resume(self, request: Request) -> Response:
        """Close an open circuit."""
        operator = self._decider(request)
        await _body(request)
        ref = request.path_params["ref"]
        closed = await operations.resume_circuit(
            self.redis, self.settings, ref, tenant=self.options.tenant
        )
        log.info("console decision", extra={"operator": operator, "resume": ref})
        return JSONResponse({"ref": ref, "closed": closed})

    async def rollback(self, request: Request) -> Response:
        """Pin new calls of a tool to one of its live versions."""
        operator = self._decider(request)
        body = await _body(request)
        version = _text(body, "version")
        if not version:
            raise UsageError("missing version")
        name = request.path_params["name"]
        said = await operations.pin_tool(
            self.redis, self.settings, name, version, tenant=self.options.tenant
        )
        log.info("console decision", extra={"operator": operator, "pin": f"{name}@{version}"})
        return JSONResponse({"name": name, "version": version, "message": said})

    async def unpin(self, request: Request) -> Response:
        """Drop a tool's pin."""
        operator = self._decider(request)
        await _body(request)
        name = request.path_params["name"]
        unpinned = await operations.unpin_tool(
            self.redis, self.settings, name, tenant=self.options.tenant
        )
        log.info("console decision", extra={"operator": operator, "unpin": name})
        return JSONResponse({"name": name, "unpinned": unpinned})

    def _decider(self, request: Request) -> str:
        self.access.check_decision(request)
        return self.access.operator_of(request)


def _sse(event: FeedEvent) -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps(event.data), event=event.kind, id=str(event.seq))


def _int(raw: str | None, default: int, *, high: int | None = None) -> int:
    try:
        value = int(raw) if raw else default
    except ValueError:
        value = default
    value = max(0, value)
    return min(value, high) if high is not None else value


def _text(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise UsageError(f"{key} must be a string")
    return value


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > _BODY_MAX_BYTES:
        raise UsageError(f"a decision is at most {_BODY_MAX_BYTES} bytes")
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        raise UsageError("the body is not JSON") from None
    if not isinstance(body, dict):
        raise UsageError("the body must be a JSON object")
    return body


Handler = Callable[[Request], Awaitable[Response]]


def _guarded(handler: Handler) -> Handler:
    """Errors as JSON with the status that says what they are; Redis or Kafka away: 503."""

    async def guarded(request: Request) -> Response:
        try:
            return await handler(request)
        except ToolfleetError as exc:
            return JSONResponse({"error": str(exc)}, status_code=_status_of(exc))
        except TRANSIENT_ERRORS as exc:
            return JSONResponse({"error": f"unavailable, retry: {exc!r}"}, status_code=503)

    guarded.__doc__ = handler.__doc__
    return guarded


def create_app(settings: Settings, options: ConsoleOptions | None = None) -> Starlette:
    """The console as an ASGI application (serve it with uvicorn; ``toolfleet console``
    does)."""
    console = Console(settings, options or ConsoleOptions())
    g = _guarded
    routes = [
        *(Route(path, console.page) for path in PAGES),
        Route("/calls/{tenant}/{call_id:path}", console.page),
        Route("/healthz", console.healthz),
        Route("/events", g(console.events)),
        Route("/api/config", console.config),
        Route("/api/recent", g(console.recent)),
        Route("/api/calls/{tenant}/{call_id:path}", g(console.call)),
        Route("/api/tasks", g(console.tasks)),
        Route("/api/tasks/{task_id}/resolve", g(console.resolve), methods=["POST"]),
        Route("/api/approvals", g(console.approvals)),
        Route("/api/approvals/decide", g(console.decide), methods=["POST"]),
        Route("/api/circuits", g(console.circuits)),
        Route("/api/circuits/{ref}/resume", g(console.resume), methods=["POST"]),
        Route("/api/tools/{name}/rollback", g(console.rollback), methods=["POST"]),
        Route("/api/tools/{name}/unpin", g(console.unpin), methods=["POST"]),
        Mount("/static", StaticFiles(packages=[(__package__ or "", "static")]), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=console.lifespan, middleware=[Middleware(_Headers)])
    app.state.console = console
    return app
