"""What a tool, its guardrails and its probe see of the call they serve."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kernel.errors import ToolfleetError
from kernel.rules.effects import ProbeAnswer
from kernel.tools._heartbeat import Heartbeats, details_json, parse_details
from kernel.tools._progress import ProgressReporter, Report, checked_report
from kernel.tools.run_context import CarriedRunContext
from schemas import ExecutionCommand

T = TypeVar("T")

UpstreamRecorder = Callable[[str], Awaitable[None]]
"""Writes a call's upstream reference durably (the worker's ledger write)."""

HandleSigner = Callable[[], str]
"""Gives the completion handle of the running attempt (the worker signs it)."""


class _UpstreamRef:
    """The upstream reference of one attempt, shared by every copy of its context."""

    def __init__(self, value: str | None, recorder: UpstreamRecorder | None) -> None:
        self.value = value
        self.recorder = recorder
        self.loop: asyncio.AbstractEventLoop | None = None


class _Progress:
    """Where one attempt's progress reports go, shared by every copy of its context."""

    def __init__(self, reporter: ProgressReporter | None) -> None:
        self.reporter = reporter
        self.loop: asyncio.AbstractEventLoop | None = None

    def hand(self, report: Report) -> None:
        """To the reporter, on the loop that runs the call (from whichever thread)."""
        if self.reporter is not None:  # None outside a worker: progress goes nowhere
            _on_loop(self.loop, self.reporter.report, report)


class _Beats:
    """Where one attempt's heartbeats go, shared by every copy of its context."""

    def __init__(self, heartbeats: Heartbeats | None, earlier: str | None) -> None:
        self.heartbeats = heartbeats
        self.loop: asyncio.AbstractEventLoop | None = None
        self.earlier = earlier
        """The details an earlier attempt of the call sent last (JSON), if any."""

    def hand(self, raw: str) -> None:
        """To the attempt's heartbeats, on the loop that runs the call (from any thread)."""
        if self.heartbeats is not None:  # None outside a worker: nobody watches
            _on_loop(self.loop, self.heartbeats.beat, raw)


def _on_loop(loop: asyncio.AbstractEventLoop | None, deliver: Callable[[T], None], item: T) -> None:
    """Call ``deliver(item)`` on ``loop``, the loop that runs the call: at once from that
    loop, through ``call_soon_threadsafe`` from a thread tool's thread, not at all before the
    call started (no loop yet) or after its loop closed."""
    if loop is None:
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        deliver(item)
        return
    with contextlib.suppress(RuntimeError):  # the loop closed: the call is long over
        loop.call_soon_threadsafe(deliver, item)


@dataclass(frozen=True)
class ToolContext:
    """The identity of one call attempt, passed as the optional first parameter of a tool.

    ``idempotency_key`` is stable across attempts of the same call: hand it to the upstream
    system so a retried or reconciled attempt cannot apply the effect twice.
    """

    tenant_id: str
    run_id: str
    turn_id: int
    call_id: str
    tool_name: str
    arguments: str
    """The raw JSON arguments, exactly as the model wrote them."""
    idempotency_key: str
    attempt: int
    fencing_token: int
    args: dict[str, Any] = field(default_factory=dict)
    """The validated arguments (parameter name -> value); empty when they could not be parsed."""
    worker_id: str | None = None
    deadline_at: float | None = None
    """Unix time the turn ends, if the turn has a deadline."""
    _upstream: _UpstreamRef = field(
        default_factory=lambda: _UpstreamRef(None, None), repr=False, compare=False
    )
    _run_context: CarriedRunContext = field(
        default_factory=lambda: CarriedRunContext(None), repr=False, compare=False
    )
    """The agent run's context the command carried, and the tool's copy of it (an Agents SDK
    tool is given the copy as its run context)."""
    _progress: _Progress = field(default_factory=lambda: _Progress(None), repr=False, compare=False)
    _beats: _Beats = field(default_factory=lambda: _Beats(None, None), repr=False, compare=False)
    _handle: HandleSigner | None = field(default=None, repr=False, compare=False)

    @property
    def upstream_ref(self) -> str | None:
        """The upstream's own id for what this call did (ticket T-9, charge ch_123), once
        recorded; probes and compensations receive the one the call recorded."""
        return self._upstream.value

    async def record_upstream_ref(self, ref: str) -> None:
        """Record the upstream's id for what this call did, as soon as the tool knows it.

        Written to the ledger before this returns, so it survives a failure (or a crash) later
        in the body; probes, compensations, ``toolfleet inspect call`` and the audit chain see
        it. Outside a worker (a direct call, a test) it is only kept on the context.
        """
        if not isinstance(ref, str) or not ref:
            raise ToolfleetError("record_upstream_ref needs the upstream's id as a non-empty str")
        self._upstream.value = ref
        if self._upstream.recorder is not None:
            await self._upstream.recorder(ref)

    def record_upstream_ref_blocking(self, ref: str) -> None:
        """``record_upstream_ref`` for a sync tool, which runs in a worker thread."""
        loop = self._upstream.loop
        if loop is None or self._upstream.recorder is None:
            self._upstream.value = ref
            return
        asyncio.run_coroutine_threadsafe(self.record_upstream_ref(ref), loop).result()

    async def report_progress(
        self, done: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Say how far the call has got: ``done`` of ``total`` (if known), with a ``message``.

        Returns at once: the event goes to the ``progress`` topic in the background, at most
        one per ``progress_min_interval_s`` for the call (a sooner report is held back, and
        only the newest held one is sent). Each event carries the call, its attempt and a
        sequence number from 1, so a reader shows it once, and a retried attempt's progress
        apart. Best-effort: never in the ledger, and a crashed worker's last reports are lost.
        Outside a worker it goes nowhere (``ToolEnvironment`` collects it).
        """
        self._progress.hand(checked_report(done, total, message))

    def report_progress_blocking(
        self, done: float, total: float | None = None, message: str | None = None
    ) -> None:
        """``report_progress`` for a sync tool, which runs in a worker thread (it does not
        wait either)."""
        self._progress.hand(checked_report(done, total, message))

    async def heartbeat(self, details: Any = None) -> None:
        """Say the call is alive, and how far it got: ``details``, any JSON value (at most
        16 KiB as JSON: a cursor or a checkpoint's id, not the data).

        Resets the call's heartbeat watchdog: a tool declared with ``heartbeat=N`` whose body
        sends no heartbeat for N seconds is cancelled, and its effect is unknown (probed).
        Returns at once: the worker keeps the newest details in the call's ledger entry (at
        most one write per couple of seconds, and the newest when the call ends), and a later
        attempt of the call is given them as ``heartbeat_details``. Outside a worker it only
        checks the details.
        """
        self._beats.hand(details_json(details))

    def heartbeat_blocking(self, details: Any = None) -> None:
        """``heartbeat`` for a sync tool, which runs in a worker thread (it does not wait)."""
        self._beats.hand(details_json(details))

    def completion_handle(self) -> str:
        """The handle that completes this call later: give it to the external system the
        tool hands its work to, then return ``Deferred(complete_within_s=...)``.

        It names this attempt and is signed with the tenant's decision key: whoever holds it
        can complete the call (once), so pass it only to the system that does the work. Only
        on a worker whose deployment runs state version 3 (ToolfleetError otherwise).
        """
        if self._handle is None:
            raise ToolfleetError(
                "no completion handle here: a call is deferred only on a worker, once the "
                "deployment's state version 3 is in force (`toolfleet migrate --finish`)"
            )
        return self._handle()

    @property
    def heartbeat_details(self) -> Any:
        """The details the call's earlier attempt sent last with ``heartbeat`` (None: none):
        a retry resumes from them, as Temporal's ``activity.info().heartbeat_details``."""
        return parse_details(self._beats.earlier)

    @classmethod
    def from_command(
        cls,
        command: ExecutionCommand,
        *,
        worker_id: str | None = None,
        args: dict[str, Any] | None = None,
        record_upstream: UpstreamRecorder | None = None,
        progress: ProgressReporter | None = None,
        heartbeats: Heartbeats | None = None,
        completion_handle: HandleSigner | None = None,
    ) -> ToolContext:
        """Build the context of the attempt a command describes; ``record_upstream`` is how
        the worker writes an upstream reference durably, ``progress`` where the attempt's
        progress reports go, ``heartbeats`` where its heartbeats go, ``completion_handle``
        how a deferred call's handle is made."""
        upstream = _UpstreamRef(command.upstream_ref, record_upstream)
        if record_upstream is not None:
            upstream.loop = asyncio.get_running_loop()
        reporting = _Progress(progress)
        if progress is not None:
            reporting.loop = asyncio.get_running_loop()
        beats = _Beats(heartbeats, command.heartbeat_details)
        if heartbeats is not None:
            beats.loop = asyncio.get_running_loop()
        return cls(
            tenant_id=command.tenant_id,
            run_id=command.run_id,
            turn_id=command.turn_id,
            call_id=command.call_id,
            tool_name=command.tool_name,
            arguments=command.arguments,
            idempotency_key=command.idempotency_key,
            attempt=command.attempt,
            fencing_token=command.fencing_token,
            args=dict(args or {}),
            worker_id=worker_id,
            deadline_at=command.deadline_at,
            _upstream=upstream,
            _run_context=CarriedRunContext(command.run_context, command.tool_call),
            _progress=reporting,
            _beats=beats,
            _handle=completion_handle,
        )


_CURRENT: ContextVar[ToolContext | None] = ContextVar("toolfleet_tool_context", default=None)


def current_tool_context() -> ToolContext | None:
    """The call the running tool code serves, as the fleet knows it (tenant, run, call,
    ``idempotency_key``, ``record_upstream_ref``, ``report_progress``); None outside a call.

    A toolfleet tool is given it as its ``ctx``; an Agents SDK function tool is given the
    agent run's context instead (a copy of the application's), and reads the fleet's view of
    its call here: in its body, guardrails, hooks and failure formatter, on a worker or under
    ``toolfleet.testing.ToolEnvironment``.
    """
    return _CURRENT.get()


ProbeState = ProbeAnswer
"""What a probe found upstream for an idempotency key."""


@dataclass(frozen=True)
class ProbeResult:
    """The answer of a tool's probe: did the call's effect reach the upstream system?

    Build it with ``ProbeResult.applied(output)``, ``ProbeResult.not_applied()`` or
    ``ProbeResult.unknown()``.
    """

    state: ProbeState
    output: str | None = None
    """For ``applied``: the output the model should see, as if the call had returned it."""
    detail: str | None = None
    """Why the probe answered as it did, for the audit chain and operators."""

    @classmethod
    def applied(cls, output: str, *, detail: str | None = None) -> ProbeResult:
        """The effect is there upstream; ``output`` stands in for the call's lost output."""
        return cls(state="applied", output=str(output), detail=detail)

    @classmethod
    def not_applied(cls, *, detail: str | None = None) -> ProbeResult:
        """The upstream system has no trace of the idempotency key: nothing was applied."""
        return cls(state="not_applied", detail=detail)

    @classmethod
    def wrong_effect(cls, output: str, *, detail: str | None = None) -> ProbeResult:
        """Something was applied upstream, but not what the call asked for: compensate it."""
        return cls(state="wrong_effect", output=str(output), detail=detail)

    @classmethod
    def unknown(cls, detail: str | None = None) -> ProbeResult:
        """The probe could not tell (yet); the reconciler may ask again or escalate."""
        return cls(state="unknown", detail=detail)
