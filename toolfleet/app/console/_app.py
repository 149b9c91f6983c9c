"""The console's web application: HTML pages, a JSON API under ``/api``, the live feed as
server-sent events on ``/events``, sign-in under ``/auth``, and ``/healthz``.

Every route but ``/healthz``, ``/auth/*`` and ``/static/*`` (the page's script and style) needs
an identity (``_auth``) with a minimum role (``create_app`` names it route by route), and every
read and decision is limited to the tenants that identity may see (``_access``):

==========================================================  ========  =====================
route                                                       role      tenants
==========================================================  ========  =====================
pages, ``/api/config``                                      viewer    (the API's)
``/events``, ``/api/recent``                                viewer    the filter's, in scope
``/api/calls/T/ID``, ``/api/tasks``, ``/api/approvals``     viewer    in scope only
``/api/history``, ``/api/runs/T/RUN``                       viewer    in scope only
``/api/circuits``, ``/api/pools``                           viewer    fleet-wide facts
``/api/overview``                                           viewer    every tenant ("*")
``/api/tenants``                                            viewer    in scope only
``POST /api/tasks/ID/*``, ``/api/approvals/decide``      operator  the task's or call's
``POST /api/circuits/REF/resume``, ``/api/tools/NAME/*``    admin     every tenant ("*")
``POST /api/limits/tenants|tools/NAME``                     admin     every tenant ("*")
``POST /api/bulk/plan``, ``/api/bulk/apply``                operator  each target's
==========================================================  ========  =====================
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import urlencode

from pydantic import ValidationError
from redis.asyncio import Redis
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kernel.adapters.backoff import RECONNECT
from kernel.adapters.bus import TRANSIENT_ERRORS, KafkaBus
from kernel.adapters.lag import GroupLag
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
from kernel.stores.door import Stores
from kernel.stores.history import MAX_LIMIT
from toolfleet.app import bulk, operations
from toolfleet.app.console._access import Access, NotAuthenticatedError
from toolfleet.app.console._auth import SESSION_COOKIE, Authenticator
from toolfleet.app.console._feed import Dropped, FeedEvent, Filter, LiveFeed, StatusChange
from toolfleet.app.console._fleet_views import (
    limits_json,
    plan_json,
    pool_json,
    results_json,
    share_json,
)
from toolfleet.app.console._history import HistoryRecorder
from toolfleet.app.console._history_views import HistoryApi
from toolfleet.app.console._login import (
    CALLBACK_PATH,
    LOGIN_PATH,
    LOGOUT_PATH,
    SIGNED_OUT_PATH,
    Login,
    page,
)
from toolfleet.app.console._overview import OverviewJob, overview_json
from toolfleet.app.console._views import (
    approval_json,
    call_json,
    circuits_json,
    task_json,
    tool_json,
)
from toolfleet.app.identity import Identity, Role

log = logging.getLogger(__name__)

PAGES = ("/", "/overview", "/history", "/tasks", "/circuits", "/fleet", "/bulk")
"""The console's pages (and every call's, under /calls/TENANT/CALL_ID)."""

_BODY_MAX_BYTES = 65_536
_PING_S = 15.0


@dataclass(frozen=True)
class ConsoleOptions:
    """How one console runs: whom it shows, who may sign in, how much it keeps."""

    tenant: str | None = None
    """Show and act for this tenant only (None: every tenant), whatever a user's scope."""
    local_token: str | None = None
    """This process's local login token (``toolfleet console`` on 127.0.0.1 with no sign-in
    configured): it signs a browser in as an admin of every tenant (``/?token=...``), or a
    script (``Authorization: Bearer``). None: no local login."""
    ring_size: int = 500
    """Recent turns (and outcomes) kept for a page that has just opened."""
    queue_size: int = 1_000
    """Events one browser may fall behind by before it loses some (and is told)."""
    max_subscribers: int = 100
    """Live connections served at once."""
    refresh_s: float = 2.0
    """How often the task and circuit pages refresh."""
    record_history: bool = True
    """Record the fleet's topics into the history (``_history``: the console replicas share
    the work); the history is read either way."""


class _Unavailable(UnavailableError):
    """Kafka is not connected yet: decisions cannot be published now."""


def _status_of(exc: ToolfleetError) -> int:
    if isinstance(exc, NotAuthenticatedError):
        return 401
    if isinstance(exc, operations.NotAllowedError):
        return 403
    if isinstance(exc, operations.NotFoundError):
        return 404
    if isinstance(exc, operations.AlreadyDecidedError | bulk.SelectionChangedError):
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
        self.access = Access(options.tenant)
        self.auth = Authenticator(settings, local_token=options.local_token)
        self.login = Login(settings, self.auth)
        self.feed = LiveFeed(
            settings,
            tenant=options.tenant,
            ring_size=options.ring_size,
            queue_size=options.queue_size,
            max_subscribers=options.max_subscribers,
        )
        self.history = HistoryApi(self.access, settings.trace_url_template)
        """The history's routes; its store and recorder come with the Redis connection."""
        self.bus = KafkaBus(settings, service="console")
        self.bus_ready = False
        self._redis: Redis | None = None
        self._group_lag: GroupLag | None = None
        self.overview: OverviewJob | None = None
        """The overview's job (a console for every tenant that records the history)."""
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
        self.history.store = Stores(self._redis, self.settings).history()
        if self.options.record_history:
            recorder = HistoryRecorder(self.settings, self._redis, tenant=self.options.tenant)
            self.history.recorder = recorder
            await recorder.start()
        if self.options.record_history and self.options.tenant is None:
            # The overview counts every tenant's calls: a console for every tenant runs it.
            self.overview = OverviewJob(self.settings, self._redis)
            await self.overview.start()
        await self.feed.start()
        self._connecting = asyncio.create_task(self._start_bus())
        try:
            yield
        finally:
            self._connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connecting
            if self.history.recorder is not None:
                await self.history.recorder.stop()
            if self.overview is not None:
                await self.overview.stop()
            await self.feed.stop()
            with contextlib.suppress(*TRANSIENT_ERRORS):
                await self.bus.stop()
            if self._group_lag is not None:
                with contextlib.suppress(*TRANSIENT_ERRORS):
                    await self._group_lag.__aexit__(None, None, None)
            await self._redis.aclose()

    async def _start_bus(self) -> None:
        failures = 0
        while True:
            try:
                await self.bus.start()
            except TRANSIENT_ERRORS as exc:
                log.warning("console: Kafka unavailable", extra={"error": repr(exc)})
                with contextlib.suppress(*TRANSIENT_ERRORS):
                    await self.bus.stop()
                failures += 1
                await asyncio.sleep(RECONNECT.delay(failures))  # wait-ok: reconnect backoff
            else:
                self.bus_ready = True
                return

    def _started_bus(self) -> KafkaBus:
        if not self.bus_ready:
            raise _Unavailable("Kafka is not connected yet: the decision was not sent; retry")
        return self.bus

    # --- pages and probes ---------------------------------------------------------------------
    async def page(self, request: Request) -> Response:
        """Every page is the same document; its script renders what the path names. Nobody
        signed in: to the identity provider's login (or a page saying how to sign in)."""
        signed_in = self.login.local(request)
        if signed_in is not None:
            return signed_in
        try:
            self.auth.identify(request)
        except NotAuthenticatedError as exc:
            if self.auth.oidc:
                here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"{LOGIN_PATH}?{urlencode({'next': here})}", 302)
            message = str(exc)
            return page("Not signed in", f"{message[:1].upper()}{message[1:]}.", status=401)
        except operations.NotAllowedError as exc:
            return page("Not allowed", f"{exc}.", status=403)
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
        recorder = self.history.recorder
        body = {
            "ok": not problems,
            "feed": self.feed.state,
            "history": "off" if recorder is None else recorder.state,
            "problems": problems,
        }
        return JSONResponse(body, status_code=200 if not problems else 503)

    async def config(self, request: Request, who: Identity) -> Response:
        """What the page needs to know: who is signed in (role, tenants, the session's CSRF
        token), the console's tenant, the refresh."""
        tenants = self.access.tenants(who)
        return JSONResponse(
            {
                "tenant": self.options.tenant,
                "operator": who.name,
                "role": who.role,
                "tenants": None if tenants is None else sorted(tenants),
                "can_decide": who.may("operator"),
                "fleet_wide": self.access.may_act_fleet_wide(who),
                "csrf": who.csrf,
                "session": self.auth.session_identity(request) == who,  # it may sign out
                "decision_auth": self.settings.decision_auth,
                "refresh_s": self.options.refresh_s,
                "feed": {"state": self.feed.state, "error": self.feed.error},
            }
        )

    # --- the live feed ------------------------------------------------------------------------
    def _filter(self, request: Request, who: Identity) -> Filter:
        q = request.query_params
        tenants = self.access.scope(who, q.get("tenant"))
        return Filter(tenants=tenants, run=q.get("run") or None, tool=q.get("tool") or None)

    async def recent(self, request: Request, who: Identity) -> Response:
        """The newest turns that pass the filter, from the history (at most 500 a page;
        ``cursor`` pages back, and takes the history's filters too), and the live feed's
        recent outcomes and progress unless outcomes=0 (the feed keeps the last 500), oldest
        first."""
        flt = self._filter(request, who)  # the tenant filter in scope, or 403
        params = request.query_params
        limit = _int(params.get("limit"), 200, high=MAX_LIMIT)
        events: list[dict[str, Any]] = []
        cursor = None
        if limit:
            events, cursor = await self.history.recent_turns(who, params, limit)
        if limit and params.get("outcomes", "1") != "0" and not params.get("cursor"):
            live = self.feed.recent(flt, limit=limit)
            events += [e.data for e in live if e.kind != "turn"]
            events.sort(key=lambda e: float(e.get("received_at") or 0))
        body = {"events": events, "cursor": cursor, "limit": limit, "feed": self.feed.state}
        return JSONResponse(body)

    async def events(self, request: Request, who: Identity) -> Response:
        """The live feed as server-sent events: ``status``, then the recent events that pass
        the filter, then each new one as it is read (``turn``, ``outcome``), and ``dropped``
        when this browser fell too far behind."""
        flt = self._filter(request, who)
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
    async def call(self, request: Request, who: Identity) -> Response:
        """A call's ledger entry (arguments as their digest), audit chain, upstream reference
        and trace link."""
        tenant = request.path_params["tenant"]
        self.access.check_tenant(who, tenant)
        view = await operations.read_call(
            self.redis,
            self.settings,
            tenant,
            request.query_params.get("run", ""),
            request.path_params["call_id"],
            tenant=self.access.tenants(who),
        )
        return JSONResponse(call_json(view, self.settings.trace_url_template))

    async def tasks(self, request: Request, who: Identity) -> Response:
        """Open human tasks (all=1: resolved ones too), oldest first."""
        found = await operations.list_tasks(
            self.redis,
            self.settings,
            include_resolved=request.query_params.get("all") == "1",
            tenant=self.access.tenants(who),
        )
        return JSONResponse({"tasks": [task_json(t) for t in found]})

    async def resolve(self, request: Request, who: Identity) -> Response:
        """Answer a human task (signed for ``who``, published; the reconciler carries it
        out)."""
        self.access.check_decision(request, who)
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
            decided_by=who.name,
            output=_text(body, "output"),
            note=_text(body, "note"),
            tenant=self.access.tenants(who),
            fleet_wide=self.access.may_act_fleet_wide(who),
        )
        log.info(
            "console decision",
            extra={"operator": who.name, "task": task_id, "resolution": resolution},
        )
        return JSONResponse({"sent": sent.model_dump(mode="json", exclude={"signature"})}, 202)

    async def assign(self, request: Request, who: Identity) -> Response:
        """Assign an open human task to someone (``to``; empty: nobody)."""
        self.access.check_decision(request, who)
        body = await _body(request)
        to = body.get("to")
        if not isinstance(to, str) or len(to) > 200:
            raise UsageError("to must be who the task is assigned to (empty: nobody)")
        task_id = request.path_params["task_id"]
        stored = await operations.assign_task(
            self.redis,
            self.settings,
            task_id,
            to.strip(),
            decided_by=who.name,
            tenant=self.access.tenants(who),
            fleet_wide=self.access.may_act_fleet_wide(who),
        )
        log.info("console decision", extra={"operator": who.name, "task": task_id, "to": to})
        return JSONResponse({"task": task_json(stored)})

    async def approvals(self, _request: Request, who: Identity) -> Response:
        """Calls waiting for approval: the ledger's index, and interruptions seen live."""
        tenants = self.access.tenants(who)
        seen = [
            (e.tenant_id, e.run_id, i["call_id"])
            for e in self.feed.recent(Filter(tenants=tenants), outcomes=False)
            for i in e.data["interruptions"]
        ]
        found = await operations.pending_approvals(
            self.redis, self.settings, tenant=tenants, also=seen
        )
        return JSONResponse({"approvals": [approval_json(p) for p in found]})

    async def decide(self, request: Request, who: Identity) -> Response:
        """Approve or reject a call waiting for approval (signed for ``who``, published; the
        planner records it, and the agent runtime's resumed turn acts on it)."""
        self.access.check_decision(request, who)
        body = await _body(request)
        approve = body.get("approve")
        if not isinstance(approve, bool):
            raise UsageError("approve must be true or false")
        ids = {k: _text(body, k) for k in ("tenant_id", "run_id", "call_id")}
        missing = [k for k, v in ids.items() if not v]
        if missing:
            raise UsageError(f"missing {', '.join(missing)}")
        self.access.check_tenant(who, str(ids["tenant_id"]))
        sent = await operations.decide_approval(
            self.redis,
            self._started_bus(),
            self.settings,
            tenant_id=str(ids["tenant_id"]),
            run_id=str(ids["run_id"]),
            call_id=str(ids["call_id"]),
            approve=approve,
            decided_by=who.name,
            message=_text(body, "message"),
            tenant=self.access.tenants(who),
        )
        log.info(
            "console decision",
            extra={"operator": who.name, "tenant_id": sent.tenant_id, "run_id": sent.run_id,
                   "call_id": sent.call_id, "approve": approve},
        )  # fmt: skip
        return JSONResponse({"sent": sent.model_dump(mode="json", exclude={"signature"})}, 202)

    # --- circuits and versions ----------------------------------------------------------------
    async def circuits(self, _request: Request, who: Identity) -> Response:
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
                "actions": self.access.may_act_fleet_wide(who),
            }
        )

    async def resume(self, request: Request, who: Identity) -> Response:
        """Close an open circuit."""
        ref = request.path_params["ref"]
        self._fleet_wide(request, who, f"resuming {ref}")
        await _body(request)
        closed = await operations.resume_circuit(
            self.redis, self.settings, ref, tenant=self.access.tenants(who)
        )
        log.info("console decision", extra={"operator": who.name, "resume": ref})
        return JSONResponse({"ref": ref, "closed": closed})

    async def rollback(self, request: Request, who: Identity) -> Response:
        """Pin new calls of a tool to one of its live versions."""
        name = request.path_params["name"]
        self._fleet_wide(request, who, f"pinning {name}")
        body = await _body(request)
        version = _text(body, "version")
        if not version:
            raise UsageError("missing version")
        said = await operations.pin_tool(
            self.redis, self.settings, name, version, tenant=self.access.tenants(who)
        )
        log.info("console decision", extra={"operator": who.name, "pin": f"{name}@{version}"})
        return JSONResponse({"name": name, "version": version, "message": said})

    async def unpin(self, request: Request, who: Identity) -> Response:
        """Drop a tool's pin."""
        name = request.path_params["name"]
        self._fleet_wide(request, who, f"unpinning {name}")
        await _body(request)
        unpinned = await operations.unpin_tool(
            self.redis, self.settings, name, tenant=self.access.tenants(who)
        )
        log.info("console decision", extra={"operator": who.name, "unpin": name})
        return JSONResponse({"name": name, "unpinned": unpinned})

    # --- bulk actions ---------------------------------------------------------------------------
    async def bulk_plan(self, request: Request, who: Identity) -> Response:
        """What a bulk action would touch (its targets and their digest, to confirm)."""
        self.access.check_decision(request, who)
        wanted = _bulk_request(await _body(request))
        planned = await bulk.plan(
            self.redis,
            self.settings,
            wanted,
            tenant=self.access.tenants(who),
            fleet_wide=self.access.may_act_fleet_wide(who),
        )
        return JSONResponse(plan_json(planned))

    async def bulk_apply(self, request: Request, who: Identity) -> Response:
        """Carry out a bulk action the operator confirmed (409 if its targets changed)."""
        self.access.check_decision(request, who)
        wanted = _bulk_request(await _body(request))
        bulk_id, results = await bulk.carry_out(
            self.redis,
            self._started_bus(),
            self.settings,
            wanted,
            decided_by=who.name,
            tenant=self.access.tenants(who),
            fleet_wide=self.access.may_act_fleet_wide(who),
        )
        log.info(
            "console decision",
            extra={"operator": who.name, "bulk": bulk_id, "action": wanted.action,
                   "targets": len(results), "failed": sum(not r.ok for r in results)},
        )  # fmt: skip
        return JSONResponse(results_json(bulk_id, results), 202)

    # --- the overview ---------------------------------------------------------------------------
    async def overview_data(self, request: Request, who: Identity) -> Response:
        """The overview's charts for ``span`` (15m, 1h, 6h, 24h, 7d)."""
        if self.access.tenants(who) is not None:
            raise operations.NotAllowedError(
                "the overview counts every tenant's calls: it needs an identity of every tenant"
            )
        if self.overview is not None and self.overview.lag is None:
            self.overview.lag = await self._lag()  # the pools' lag, once Kafka answers
        found = await overview_json(
            Stores(self.redis, self.settings).overview(),
            request.query_params.get("span", "1h"),
            time.time(),
        )
        job = self.overview
        state = {"state": "off" if job is None else job.state, "error": job and job.error}
        return JSONResponse(found | {"job": state})

    # --- pools, workers, tenants and limits ---------------------------------------------------
    async def pools(self, _request: Request, who: Identity) -> Response:
        """Each pool's capacity, running calls, lag and workers (fleet-wide facts)."""
        views = await operations.pools(self.redis, self.settings, await self._lag(), time.time())
        return JSONResponse(
            {"pools": [pool_json(v) for v in views], "now": time.time()}
            | {"actions": self.access.may_act_fleet_wide(who)}
        )

    async def tenants(self, _request: Request, who: Identity) -> Response:
        """Tenants in scope: limits, running and waiting calls, share against weight."""
        defaults, shares = await operations.tenant_shares(
            self.redis, self.settings, tenant=self.access.tenants(who)
        )
        tools = await operations.tool_limits(self.redis, self.settings)
        return JSONResponse(
            {
                "defaults": limits_json(defaults),
                "tenants": [share_json(s) for s in shares],
                "tools": [{"name": n, "limits": limits_json(v)} for n, v in sorted(tools.items())],
                "actions": self.access.may_act_fleet_wide(who),
            }
        )

    async def limits(self, request: Request, who: Identity) -> Response:
        """Change a tenant's or a tool's limits (fields absent or null keep their value)."""
        kind, name = request.path_params["kind"], request.path_params["name"]
        if kind not in ("tenants", "tools"):
            raise operations.NotFoundError(f"no limits of {kind!r}: use tenants or tools")
        self._fleet_wide(request, who, f"changing the limits of {name}")
        body = await _body(request)
        clear = body.pop("clear", False) is True
        new = await operations.set_limits(
            self.redis,
            self.settings,
            kind,
            name,
            clear=clear,
            tenant=self.access.tenants(who),
            **body,
        )
        log.info(
            "console decision",
            extra={"operator": who.name, "limits": f"{kind}/{name}", "set": new.json()},
        )
        return JSONResponse({"name": name, "limits": limits_json(new)})

    async def _lag(self) -> GroupLag | None:
        """The broker's view of consumer lag, opened on first use (None while Kafka is away)."""
        if self._group_lag is None and self.bus_ready:
            lag = GroupLag(self.settings)
            try:
                self._group_lag = await lag.__aenter__()
            except TRANSIENT_ERRORS as exc:
                log.warning("console: no consumer lag", extra={"error": repr(exc)})
        return self._group_lag

    def _fleet_wide(self, request: Request, who: Identity, what: str) -> None:
        self.access.fleet_wide(who, what)
        self.access.check_decision(request, who)

    # --- signing out --------------------------------------------------------------------------
    async def logout(self, request: Request) -> Response:
        """Sign this browser out (the page's fetch, with the session's CSRF token): where to
        go next, the identity provider's logout when it has one."""
        return await self.login.logout(request)


def _bulk_request(body: dict[str, Any]) -> bulk.BulkRequest:
    try:
        return bulk.BulkRequest.model_validate(body)
    except ValidationError as exc:
        said = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        raise UsageError(f"not a bulk action: {said}") from None


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
Authorised = Callable[[Request, Identity], Awaitable[Response]]

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="toolfleet console"'}


def _guarded(console: Console, role: Role, handler: Authorised) -> Handler:
    """``handler`` for the identity of the request, when it has ``role`` at least; errors as
    JSON with the status that says what they are (401 nobody, 403 not allowed); Redis or
    Kafka away: 503."""

    async def guarded(request: Request) -> Response:
        try:
            who = console.auth.identify(request)
            console.access.require(who, role, f"{request.method} {request.url.path}")
            return await handler(request, who)
        except ToolfleetError as exc:
            status = _status_of(exc)
            headers = _CHALLENGE if status == 401 else None
            return JSONResponse({"error": str(exc)}, status_code=status, headers=headers)
        except TRANSIENT_ERRORS as exc:
            return JSONResponse({"error": f"unavailable, retry: {exc!r}"}, status_code=503)

    guarded.__doc__ = handler.__doc__
    return guarded


def create_app(settings: Settings, options: ConsoleOptions | None = None) -> Starlette:
    """The console as an ASGI application (serve it with uvicorn; ``toolfleet console``
    does)."""
    console = Console(settings, options or ConsoleOptions())

    def viewer(handler: Authorised) -> Handler:
        return _guarded(console, "viewer", handler)

    def operator(handler: Authorised) -> Handler:
        return _guarded(console, "operator", handler)

    def admin(handler: Authorised) -> Handler:  # and every tenant: the handlers check it
        return _guarded(console, "admin", handler)

    routes = [
        *(Route(path, console.page) for path in PAGES),
        Route("/calls/{tenant}/{call_id:path}", console.page),
        Route("/runs/{tenant}/{run_id:path}", console.page),
        Route("/healthz", console.healthz),
        Route(LOGIN_PATH, console.login.login),
        Route(CALLBACK_PATH, console.login.callback),
        Route(LOGOUT_PATH, console.logout, methods=["POST"]),
        Route(SIGNED_OUT_PATH, console.login.signed_out),
        Route("/events", viewer(console.events)),
        Route("/api/config", viewer(console.config)),
        Route("/api/recent", viewer(console.recent)),
        Route("/api/history", viewer(console.history.search)),
        Route("/api/runs/{tenant}/{run_id:path}", viewer(console.history.run)),
        Route("/api/calls/{tenant}/{call_id:path}", viewer(console.call)),
        Route("/api/tasks", viewer(console.tasks)),
        Route("/api/tasks/{task_id}/resolve", operator(console.resolve), methods=["POST"]),
        Route("/api/tasks/{task_id}/assign", operator(console.assign), methods=["POST"]),
        Route("/api/approvals", viewer(console.approvals)),
        Route("/api/approvals/decide", operator(console.decide), methods=["POST"]),
        Route("/api/circuits", viewer(console.circuits)),
        Route("/api/circuits/{ref}/resume", admin(console.resume), methods=["POST"]),
        Route("/api/tools/{name}/rollback", admin(console.rollback), methods=["POST"]),
        Route("/api/tools/{name}/unpin", admin(console.unpin), methods=["POST"]),
        Route("/api/bulk/plan", operator(console.bulk_plan), methods=["POST"]),
        Route("/api/bulk/apply", operator(console.bulk_apply), methods=["POST"]),
        Route("/api/overview", viewer(console.overview_data)),
        Route("/api/pools", viewer(console.pools)),
        Route("/api/tenants", viewer(console.tenants)),
        Route(
            "/api/limits/{kind:str}/{name:path}",
            admin(console.limits),
            methods=["POST"],
        ),
        Mount("/static", StaticFiles(packages=[(__package__ or "", "static")]), name="static"),
    ]
    session = Middleware(
        SessionMiddleware,
        secret_key=console.auth.session_secret,
        session_cookie=SESSION_COOKIE,
        max_age=settings.console_session_max_age_s,
        same_site="lax",
        https_only=console.auth.secure_cookie,
    )
    app = Starlette(
        routes=routes, lifespan=console.lifespan, middleware=[Middleware(_Headers), session]
    )
    app.state.console = console
    return app
