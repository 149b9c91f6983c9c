"""Runs one call of one tool, in the OpenAI Agents SDK's order, and says what happened.

Order (docs/sdk-lifecycle.md, item 6), for a command not yet approved:

1. ``needs_approval``: True, or a callable given the validated arguments (arguments that do not
   parse strictly fail closed: approval required). If approval is required the outcome is
   ``pending_approval`` and nothing else runs — except, with ``pre_approval_guardrails``, the
   input guardrails, whose rejection or tripwire then decides the call instead.
2. The arguments are parsed and validated; failing that is a tool error (nothing has started).
3. ``on_started()`` — the worker writes ``started`` to the ledger — before any user code of the
   execution proper, input guardrails included. Its exceptions propagate: nothing ran.
4. Input guardrails, then ``hooks.on_tool_start``, then the tool body (the timeout covers the
   body only), then output guardrails (they see failure and timeout texts too, as in the SDK),
   then ``hooks.on_tool_end`` with the accepted output.

Effects (business level) are judged by ``kernel.rules.effects``, the one home of those rules:

- ``applied``: the body returned.
- ``not_executed``: nothing of the tool ran (approval pending, guardrail rejection, invalid
  arguments), or what the body raised proves the request took no effect (``NotExecuted``, a
  declared definite error, the tool's ``classify``, connection refused, HTTP 4xx, ...); the
  outcome says whether trying again can help (``retry``).
- ``unknown``: every other exception the body raised (a read timeout, a reset connection, an
  HTTP 5xx: the response was lost, not the effect), a timeout or a tool-local cancellation,
  and BaseExceptions. Such outcomes carry ``resolved=False``: the reconciler takes over.
- A read_only tool cannot have applied anything: its unknown effect is ``not_executed``.
- An output guardrail's rejection keeps the body's effect and sets status ``rejected``.

A failure that fails the turn (no failure handler, ``failure_policy="fail_turn"``, tripwires,
``timeout_behavior="raise_exception"``, BaseExceptions, errors in guardrails, hooks, approval
policies or formatters) gives ``fails_turn=True`` and ``output=None``.

Parent cancellation — the task running ``run_call`` being cancelled — propagates as
CancelledError and never becomes an outcome; the tool body runs in a child task, so a
CancelledError the tool raises itself (tool-local cancellation) is told apart from it. As in the
SDK, run_call does not wait for the tool's cleanup after a parent cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal

from pydantic_core import PydanticSerializationError, to_json, to_jsonable_python

from kernel.errors import ModelBehaviorError
from kernel.rules.effects import TimeoutKind, effect_for_class, timeout_verdict
from kernel.rules.texts import OUTPUT_TOO_LARGE, RUN_ERROR, TOOL_DISABLED_ON_WORKER
from kernel.tools._capture import Captured, abandon, capture, error_of, text_of
from kernel.tools._context import _CURRENT, HandleSigner, ToolContext, UpstreamRecorder
from kernel.tools._deferred import Deferred
from kernel.tools._errors import (
    HeartbeatTimeoutError,
    ToolCancelledError,
    ToolInputGuardrailTripwireTriggered,
    ToolOutputGuardrailTripwireTriggered,
    ToolTimeoutError,
)
from kernel.tools._failures import TOOL_FAILURES, FailureRecording, ToolFailure
from kernel.tools._guardrails import GuardrailResult, check_guardrail_result, guardrail_name
from kernel.tools._heartbeat import HEARTBEAT_WRITE_S, Heartbeats, HeartbeatWriter, overdue_in
from kernel.tools._progress import PROGRESS_MIN_INTERVAL_S, ProgressReporter, ProgressSink
from kernel.tools._tool import Tool
from schemas import (
    CallError,
    CallOutcome,
    CallStatus,
    Effect,
    ExecutionCommand,
    GuardrailVerdict,
    RetryHint,
)


class CallHooks:
    """Lifecycle hooks of a call; subclass and override. Each runs at most once per call.

    ``on_tool_start`` runs after the input guardrails passed, right before the body;
    ``on_tool_end`` after the output guardrails accepted an output (also a handled failure's
    text), never for pending, rejected-before-start or turn-failing calls. An exception in a
    hook fails the turn.
    """

    async def on_tool_start(self, ctx: ToolContext, tool: Tool) -> None:
        """Called once when the tool body is about to run."""

    async def on_tool_end(self, ctx: ToolContext, tool: Tool, output: str) -> None:
        """Called once with the output the model will see."""


def _run_error_message(tool: Tool, exc: Exception) -> str:
    """How a failure that fails the turn is worded, as the SDK words it.

    The SDK re-raises its own exceptions (``AgentsException`` and subclasses: a tool's invalid
    JSON under ``failure_error_function=None`` is a ModelBehaviorError "Invalid JSON input for
    tool ...") unchanged, and wraps every other one in "Error running tool {name}: {error}".
    Matched by class name, so toolfleet does not need the SDK installed.
    """
    if any(cls.__name__ == "AgentsException" for cls in type(exc).__mro__):
        return text_of(exc)
    return RUN_ERROR.format(name=tool.name, error=text_of(exc))


Phase = Callable[[str], AbstractContextManager[None]]
"""Wraps one named phase of a call (the worker makes each a span)."""


def _no_phase(_name: str) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


class _TurnFailed(Exception):
    """Internal: this call fails the whole turn; carries what the outcome must say."""

    def __init__(self, status: CallStatus, effect: Effect, error: CallError) -> None:
        super().__init__(error.message)
        self.status: CallStatus = status
        self.effect: Effect = effect
        self.error = error


@dataclass(frozen=True)
class _Body:
    """The body's result before output guardrails: what the model would see, and why."""

    status: CallStatus
    effect: Effect
    output: Any
    error: CallError | None = None
    retry: RetryHint | None = None
    retry_after_s: float | None = None
    throttled: bool = False


async def run_call(
    tool: Tool,
    command: ExecutionCommand,
    *,
    worker_id: str,
    hooks: CallHooks | None = None,
    on_started: Callable[[], Awaitable[None]] | None = None,
    cancel_call: asyncio.Future[None] | None = None,
    record_upstream: UpstreamRecorder | None = None,
    max_output_bytes: int | None = None,
    phase: Phase | None = None,
    on_failure: Callable[[ToolFailure], None] | None = None,
    recording: FailureRecording | None = None,
    progress: ProgressSink | None = None,
    progress_interval_s: float = PROGRESS_MIN_INTERVAL_S,
    heartbeat: HeartbeatWriter | None = None,
    heartbeat_interval_s: float = HEARTBEAT_WRITE_S,
    completion_handle: HandleSigner | None = None,
    on_deferred: Callable[[Deferred], None] | None = None,
) -> CallOutcome:
    """Run one call of ``tool`` as ``command`` describes and return its outcome.

    Raises CancelledError on parent cancellation and whatever ``on_started`` raises; every
    other failure is an outcome. Resolving ``cancel_call`` (``set_result(None)``) cancels only
    the tool body: a tool-local cancellation, which follows the failure policy like any tool
    failure. ``record_upstream`` writes what the tool passes to ``ctx.record_upstream_ref``.
    An output longer than ``max_output_bytes`` is not kept: the call ends ``failed`` with a
    text that says so (its effect is what the body did). ``phase(name)`` wraps each phase
    of the call (``guardrails.input``, ``body``, ``guardrails.output``): the worker's spans.
    Whatever user code raises is logged with its traceback (``kernel.tools._failures``: once
    per call, rate-limited per tool, argument values redacted) and handed to ``on_failure``
    (the worker keeps it with the attempt in the call's ledger entry); ``recording`` says which
    secrets are taken out of it and where its log line links (the defaults without it).
    ``progress`` takes the attempt's
    progress events (``ctx.report_progress``), at most one per ``progress_interval_s``, the
    newest report held back in between and sent at the latest when the call ends; it must
    not wait (the worker queues them for its producer). Progress never enters the outcome.
    ``heartbeat`` writes the newest details the tool sent with ``ctx.heartbeat`` (at most one
    write per ``heartbeat_interval_s``, the newest pending one when the call ends); a tool
    with a heartbeat timeout is watched whether or not they are written.
    ``completion_handle`` makes the handle of ``ctx.completion_handle()``; a body that returns
    ``Deferred`` is handed to ``on_deferred`` (its outcome, which says nothing yet, is not to
    be published), and without ``on_deferred`` it is a failure whose effect is unknown (the
    work was handed over, and nobody will complete it).
    """
    loop = asyncio.get_running_loop()
    run = _CallRun(
        tool,
        command,
        worker_id,
        hooks,
        on_started,
        cancel_call=cancel_call or loop.create_future(),
        record_upstream=record_upstream,
        max_output_bytes=max_output_bytes,
        phase=phase or _no_phase,
        on_failure=on_failure,
        recording=recording,
        progress=(
            None
            if progress is None
            else ProgressReporter(command, progress, min_interval_s=progress_interval_s)
        ),
        heartbeats=Heartbeats(heartbeat, min_interval_s=heartbeat_interval_s),
        completion_handle=completion_handle,
        on_deferred=on_deferred,
    )
    return await run.run()


async def accept_completion(
    tool: Tool,
    command: ExecutionCommand,
    output: str,
    *,
    worker_id: str,
    hooks: CallHooks | None = None,
) -> CallOutcome:
    """A deferred call's completion that says the work was applied, accepted as the body's
    return value would have been: the tool's output guardrails (their rejection or tripwire
    decides the call, as for a returned body), then ``hooks.on_tool_end``, then the outcome.
    ``command`` is the call's attempt that deferred it (rebuilt from the ledger)."""
    loop = asyncio.get_running_loop()
    run = _CallRun(
        tool, command, worker_id, hooks, None, cancel_call=loop.create_future(), phase=_no_phase
    )
    with contextlib.suppress(ModelBehaviorError):  # the guardrails see what parses
        run.ctx = dataclasses.replace(run.ctx, args=tool.parse_arguments(command.arguments))
    current = _CURRENT.set(run.ctx)
    try:
        return await run._accept(_Body("succeeded", "applied", output))
    except _TurnFailed as failed:
        return run._outcome(failed.status, failed.effect, None, failed.error, True)
    finally:
        _CURRENT.reset(current)


class _CallRun:
    """The state of one run_call: the context, when it started, and who may cancel it."""

    def __init__(
        self,
        tool: Tool,
        command: ExecutionCommand,
        worker_id: str,
        hooks: CallHooks | None,
        on_started: Callable[[], Awaitable[None]] | None,
        *,
        cancel_call: asyncio.Future[None],
        record_upstream: UpstreamRecorder | None = None,
        max_output_bytes: int | None = None,
        phase: Phase,
        on_failure: Callable[[ToolFailure], None] | None = None,
        recording: FailureRecording | None = None,
        progress: ProgressReporter | None = None,
        heartbeats: Heartbeats | None = None,
        completion_handle: HandleSigner | None = None,
        on_deferred: Callable[[Deferred], None] | None = None,
    ) -> None:
        self.on_deferred = on_deferred
        self.phase = phase
        self.progress = progress
        self.heartbeats = heartbeats or Heartbeats(None)
        self.on_failure = on_failure
        self.recording = recording or FailureRecording()
        self.tool = tool
        self.cancel_call = cancel_call
        self.command = command
        self.worker_id = worker_id
        self.hooks = hooks
        self.on_started = on_started
        self.ctx = ToolContext.from_command(
            command,
            worker_id=worker_id,
            record_upstream=record_upstream,
            progress=progress,
            heartbeats=self.heartbeats,
            completion_handle=completion_handle,
        )
        self.started_at: float | None = None
        self.max_output_bytes = max_output_bytes
        self.verdicts: list[GuardrailVerdict] = []
        # A turn-level "fail_turn" policy is the SDK's failure_error_function=None for every tool.
        self.failure_fn = (
            None if command.failure_policy == "fail_turn" else tool.failure_error_function
        )
        self.task = asyncio.current_task()
        # Cancel requests already pending when we were called are not ours to interpret.
        self.baseline = self.task.cancelling() if self.task is not None else 0

    def parent_cancelled(self) -> bool:
        """Whether someone asked to cancel the task running this call since it began."""
        return self.task is not None and self.task.cancelling() > self.baseline

    async def run(self) -> CallOutcome:
        """The whole call; turn failures become outcomes, parent cancellation propagates."""
        current = _CURRENT.set(self.ctx)  # for current_tool_context(), in all the call's code
        try:
            outcome = await self._run()
        except _TurnFailed as failed:
            outcome = self._outcome(failed.status, failed.effect, None, failed.error, True)
        finally:
            _CURRENT.reset(current)
            if self.progress is not None:
                self.progress.close()  # the newest report held back goes out now
            # The newest details go to the ledger before the call's end does (a retry
            # resumes from them); not while the whole call is being cancelled.
            await self.heartbeats.close(flush=not self.parent_cancelled())
        if self.parent_cancelled():
            # User code swallowed a cancellation meant for the whole call: honour it anyway.
            raise asyncio.CancelledError
        return outcome

    async def _run(self) -> CallOutcome:
        tool, command = self.tool, self.command
        if not tool.is_enabled:
            message = TOOL_DISABLED_ON_WORKER.format(name=tool.name)
            error = CallError(type="ModelBehaviorError", message=message)
            raise _TurnFailed("failed", "not_executed", error)
        args: dict[str, Any] | None = None
        parse_error: ModelBehaviorError | None = None
        try:
            args = tool.parse_arguments(command.arguments)
        except ModelBehaviorError as exc:
            parse_error = exc
        else:
            self.ctx = dataclasses.replace(self.ctx, args=args)
            _CURRENT.set(self.ctx)
        if not command.approved and await self._approval_required():
            if command.pre_approval_guardrails:
                rejection = await self._input_guardrails()
                if rejection is not None:
                    return self._outcome("rejected", "not_executed", rejection)
            return self._outcome("pending_approval", "not_executed", None)
        if parse_error is not None or args is None:
            return await self._invalid_arguments(parse_error)
        self.started_at = time.time()
        if self.on_started is not None:
            await self.on_started()
        if tool.input_guardrails:
            with self.phase("guardrails.input"):
                rejection = await self._input_guardrails()
            if rejection is not None:
                return self._outcome("rejected", "not_executed", rejection)
        if self.hooks is not None:
            await self._user(self.hooks.on_tool_start, self.ctx, tool, effect="not_executed")
        with self.phase("body"):
            body = await self._invoke(args)
        if body.status == "succeeded" and isinstance(body.output, Deferred):
            return self._deferral(body.output)
        if not tool.output_guardrails:
            return await self._accept(body)
        with self.phase("guardrails.output"):
            return await self._accept(body)

    def _deferral(self, deferred: Deferred) -> CallOutcome:
        """The body handed its work over: to the worker, or a failure nobody completes."""
        if self.on_deferred is not None:
            self.on_deferred(deferred)
            # Not published: the completion's outcome is the call's.
            return self._outcome("succeeded", "unknown", None)
        error = CallError(
            type="DeferredNotSupported",
            message="the tool returned Deferred where no completion can arrive (outside a "
            "worker, or before state version 3 is in force): its work was handed over",
        )
        return self._outcome("failed", "unknown", None, error)

    async def _approval_required(self) -> bool:
        policy = self.tool.needs_approval
        if isinstance(policy, bool):
            return policy
        args = self.tool.parse_arguments_for_approval(self.command.arguments)
        if args is None:
            return True  # fail closed: a policy cannot approve what it cannot read
        ctx = dataclasses.replace(self.ctx, args=args)
        return bool(await self._user(policy, ctx, dict(args), effect="not_executed"))

    async def _invalid_arguments(self, exc: ModelBehaviorError | None) -> CallOutcome:
        exc = exc or ModelBehaviorError(f"Invalid JSON input for tool {self.tool.name}")
        error = CallError(type="ModelBehaviorError", message=str(exc))
        if self.failure_fn is None:
            raise _TurnFailed("failed", "not_executed", error)
        text = await self._user(self.failure_fn, self.ctx, exc, effect="not_executed")
        return self._outcome("failed", "not_executed", str(text), error)

    async def _input_guardrails(self) -> str | None:
        """Run input guardrails in order; the first rejection's message, or None."""
        for index, guardrail in enumerate(self.tool.input_guardrails):
            result = await self._user(guardrail, self.ctx, self.ctx.args, effect="not_executed")
            verdict = self._verdict("input", guardrail, result, "not_executed")
            self._report("input", index, guardrail, verdict)
            if verdict.behavior == "raise_exception":
                tripwire = ToolInputGuardrailTripwireTriggered(guardrail_name(guardrail))
                raise _TurnFailed("rejected", "not_executed", error_of(tripwire, str(tripwire)))
            if verdict.behavior == "reject_content":
                return verdict.message or ""
        return None

    async def _invoke(self, args: dict[str, Any]) -> _Body:
        """Run the body in a child task, so that its own cancellation is not ours.

        One future wakes us when the body ends, the timeout passes or a tool-local
        cancellation arrives (callbacks, not helper tasks: this is on every call's path).
        """
        if self.parent_cancelled():  # a cancellation someone swallowed: never start the body
            raise asyncio.CancelledError
        loop = asyncio.get_running_loop()
        child = loop.create_task(
            capture(self.tool.invoke(self.ctx, args)), name=f"tool:{self.command.call_id}"
        )
        woken: asyncio.Future[None] = loop.create_future()

        def wake(_: object = None) -> None:
            if not woken.done():
                woken.set_result(None)

        child.add_done_callback(wake)
        self.cancel_call.add_done_callback(wake)
        timer = loop.call_later(self.tool.timeout, wake) if self.tool.timeout else None
        watchdog = _Watchdog(self.heartbeats, self.tool.heartbeat_timeout, wake)
        try:
            await woken
        except asyncio.CancelledError:
            abandon(child)
            raise
        finally:
            self.cancel_call.remove_done_callback(wake)
            if timer is not None:
                timer.cancel()
            watchdog.cancel()
        timed_out: TimeoutKind | None = None
        if not child.done():
            # Tool-local cancellation: the body is cancelled as if it had cancelled itself.
            # A timeout: let the tool unwind, as the SDK's wait_for does, so it is not still
            # running when the slot it holds is given to the next call.
            if not self.cancel_call.done():
                timed_out = "heartbeat" if watchdog.lapsed else "start_to_close"
            child.cancel()
            try:
                await asyncio.wait({child})
            except asyncio.CancelledError:
                abandon(child)
                raise
        # A child cancelled before its first step never ran the body: still a cancellation.
        cancelled = Captured(error=asyncio.CancelledError())
        captured = cancelled if child.cancelled() else child.result()
        return await self._body(captured, timed_out)

    async def _body(self, captured: Captured, timed_out: TimeoutKind | None) -> _Body:
        exc = captured.error
        if exc is None:
            return _Body("succeeded", "applied", captured.value)
        if isinstance(exc, asyncio.CancelledError):
            if timed_out is not None:
                return await self._timed_out(timed_out)
            return await self._cancelled(exc)
        self._failed(exc)
        if isinstance(exc, Exception):
            error = error_of(exc, text_of(exc))
            verdict = self.tool.classify_failure(exc, now=time.time())
            effect = effect_for_class(self.tool.effect, verdict.effect)
            if self.failure_fn is None:
                message = _run_error_message(self.tool, exc)
                raise _TurnFailed("failed", effect, error_of(exc, message))
            text = await self._user(self.failure_fn, self.ctx, exc, effect=effect)
            retry = verdict.retry if effect == "not_executed" else None
            return _Body(
                "failed", effect, text, error, retry, verdict.retry_after_s, verdict.throttled
            )
        # KeyboardInterrupt, SystemExit, custom BaseExceptions: never formatted for the model,
        # as the SDK's failure handlers only take Exceptions; the turn fails.
        raise _TurnFailed("failed", "unknown", error_of(exc, text_of(exc) or type(exc).__name__))

    async def _timed_out(self, kind: TimeoutKind) -> _Body:
        timeout_error: ToolTimeoutError
        if kind == "heartbeat":
            seconds = self.tool.heartbeat_timeout or 0.0
            timeout_error = HeartbeatTimeoutError(self.tool.name, seconds)
        else:
            timeout_error = ToolTimeoutError(self.tool.name, self.tool.timeout or 0.0)
        effect = timeout_verdict(kind).effect  # the body was running: unknown
        error = error_of(timeout_error, str(timeout_error))
        if self.tool.timeout_behavior == "raise_exception":
            raise _TurnFailed("timed_out", effect, error)
        if self.tool.timeout_error_function is None:
            return _Body("timed_out", effect, str(timeout_error), error)
        text = await self._user(
            self.tool.timeout_error_function, self.ctx, timeout_error, effect=effect
        )
        return _Body("timed_out", effect, text, error)

    async def _cancelled(self, exc: asyncio.CancelledError) -> _Body:
        """The tool cancelled itself (or something it awaited): a failure like any other."""
        adapted = ToolCancelledError(str(exc))
        error = error_of(exc, str(adapted))
        if self.failure_fn is None:
            raise _TurnFailed("cancelled", "unknown", error)
        text = await self._user(self.failure_fn, self.ctx, adapted, effect="unknown")
        return _Body("cancelled", "unknown", text, error)

    async def _accept(self, body: _Body) -> CallOutcome:
        """Output guardrails, then on_tool_end, then the outcome."""
        status, output, effect = body.status, body.output, body.effect
        for index, guardrail in enumerate(self.tool.output_guardrails):
            result = await self._user(
                guardrail, self.ctx, self.ctx.args, body.output, effect=body.effect
            )
            verdict = self._verdict("output", guardrail, result, body.effect)
            self._report("output", index, guardrail, verdict)
            if verdict.behavior == "raise_exception":
                tripwire = ToolOutputGuardrailTripwireTriggered(guardrail_name(guardrail))
                raise _TurnFailed("rejected", body.effect, error_of(tripwire, str(tripwire)))
            if verdict.behavior == "wrong_effect":
                effect, status, output = "wrong_effect", "rejected", verdict.message or ""
                break
            if verdict.behavior == "reject_content":
                status, output = "rejected", verdict.message or ""
                break
        text = output_text(output)
        error = body.error
        if self.max_output_bytes is not None and len(text.encode()) > self.max_output_bytes:
            size = len(text.encode())
            status, text = (
                "failed",
                OUTPUT_TOO_LARGE.format(
                    name=self.tool.name, size=size, limit=self.max_output_bytes
                ),
            )
            error = CallError(type="OutputTooLarge", message=f"{size} bytes of output")
        if self.hooks is not None:
            await self._user(self.hooks.on_tool_end, self.ctx, self.tool, text, effect=effect)
        outcome = self._outcome(status, effect, text, error)
        if status == "succeeded" and output is body.output and not isinstance(output, str):
            outcome = outcome.model_copy(update={"value": _json_value(output)})
        if effect == "wrong_effect":
            return outcome.model_copy(update={"resolved": False})  # the reconciler's now
        if body.retry is None:
            return outcome
        return outcome.model_copy(
            update={
                "retry": body.retry,
                "retry_after_s": body.retry_after_s,
                "throttled": body.throttled,
            }
        )

    def _report(
        self,
        kind: Literal["input", "output"],
        index: int,
        guardrail: object,
        verdict: GuardrailResult,
    ) -> None:
        """Keep a guardrail's verdict for the outcome: the agent runtime reports it."""
        self.verdicts.append(
            GuardrailVerdict(
                kind=kind,
                index=index,
                name=guardrail_name(guardrail),
                behavior=verdict.behavior,
                message=verdict.message,
                # The wire is JSON: what is not becomes its str(), never a lost outcome.
                output_info=to_jsonable_python(verdict.output_info, fallback=str),
            )
        )

    def _verdict(
        self, kind: str, guardrail: object, result: object, effect: Effect
    ) -> GuardrailResult:
        try:
            return check_guardrail_result(kind, guardrail, result)
        except TypeError as exc:
            raise self._turn_failure(exc, effect) from None

    async def _user(self, func: Callable[..., Any], *args: Any, effect: Effect) -> Any:
        """Call user code other than the body (guardrail, hook, policy, formatter).

        Its failures fail the turn, worded as the SDK words them; ``effect`` is what the call
        has done by then.
        """
        try:
            result = func(*args)
            if inspect.isawaitable(result):
                result = await result
        except asyncio.CancelledError as exc:
            if self.parent_cancelled():
                raise
            raise self._turn_failure(exc, effect) from None
        except BaseException as exc:
            # Everything user code raises, KeyboardInterrupt included, is this call's failure;
            # the worker around it must keep serving other calls.
            self._failed(exc)
            raise self._turn_failure(exc, effect) from None
        if self.parent_cancelled():
            # It swallowed a cancellation meant for the whole call: stop here, run nothing more.
            raise asyncio.CancelledError
        return result

    def _failed(self, exc: BaseException) -> None:
        """User code raised ``exc``: log it (rate-limited) and hand it to ``on_failure``."""
        arguments = self.ctx.args or _loose_arguments(self.command.arguments)
        failure = self.recording.failure(exc, arguments)
        link = self.recording.link(self.command)
        TOOL_FAILURES.report(self.command.tool_name, failure, exc, command=self.command, link=link)
        if self.on_failure is not None:
            self.on_failure(failure)

    def _turn_failure(self, exc: BaseException, effect: Effect) -> _TurnFailed:
        if isinstance(exc, asyncio.CancelledError):
            message = str(ToolCancelledError(str(exc)))
            return _TurnFailed("cancelled", effect, error_of(exc, message))
        if isinstance(exc, Exception):
            message = _run_error_message(self.tool, exc)
            return _TurnFailed("failed", effect, error_of(exc, message))
        return _TurnFailed("failed", effect, error_of(exc, text_of(exc) or type(exc).__name__))

    def _outcome(
        self,
        status: CallStatus,
        effect: Effect,
        output: str | None,
        error: CallError | None = None,
        fails_turn: bool = False,
    ) -> CallOutcome:
        command = self.command
        effect = effect_for_class(self.tool.effect, effect)
        return CallOutcome(
            tenant_id=command.tenant_id,
            run_id=command.run_id,
            turn_id=command.turn_id,
            call_id=command.call_id,
            tool_name=command.tool_name,
            index=command.index,
            attempt=command.attempt,
            fencing_token=command.fencing_token,
            capped=command.capped,
            admitted=command.admitted,
            status=status,
            effect=effect,
            output=output,
            error=error,
            guardrails=list(self.verdicts),
            # What the tool changed in its copy of the agent run's context, applied by the
            # runtime to its own (a failed call's changes too, as in-process).
            run_context=self.ctx._run_context.changes(),
            fails_turn=fails_turn,
            resolved=effect != "unknown",
            source="executor",
            worker_id=self.worker_id,
            started_at=self.started_at,
            finished_at=time.time(),
        )


class _Watchdog:
    """Wakes the call when its body has sent no heartbeat for ``timeout_s`` (None: never).

    One timer at a time, set for the moment the body would be overdue if it sent nothing
    more; when it fires early (a heartbeat came meanwhile) it is set again from the last one.
    """

    def __init__(
        self, heartbeats: Heartbeats, timeout_s: float | None, wake: Callable[[], None]
    ) -> None:
        self.lapsed = False
        self._heartbeats = heartbeats
        self._timeout_s = timeout_s
        self._wake = wake
        self._timer: asyncio.TimerHandle | None = None
        if timeout_s is not None:
            heartbeats.restart()
            self._timer = asyncio.get_running_loop().call_later(timeout_s, self._check)

    def _check(self) -> None:
        assert self._timeout_s is not None
        beats = self._heartbeats
        left = overdue_in(beats.last_beat, self._timeout_s, beats.clock())
        if left <= 0:
            self._timer = None
            self.lapsed = True
            self._wake()
            return
        self._timer = asyncio.get_running_loop().call_later(left, self._check)

    def cancel(self) -> None:
        """The body ended (or the call was woken otherwise): stop watching."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _loose_arguments(raw: str) -> dict[str, Any]:
    """The arguments as far as they parse (their values are redacted from a failure even
    when the tool's schema refused them)."""
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return parsed if isinstance(parsed, dict) else {"arguments": raw}


def _json_value(output: Any) -> str | None:
    """A returned object as JSON, or None when JSON cannot hold it."""
    try:
        return to_json(output).decode()
    except (PydanticSerializationError, ValueError, TypeError, RecursionError):
        return None


def output_text(output: Any) -> str:
    """What the model is shown of a tool's result, on toolfleet's string-only wire.

    The SDK stringifies results too, except its structured outputs, which it gives the model
    as content items: text content (``ToolOutputText``, an MCP tool's text, as an object or a
    ``{"type": "text"}`` mapping, alone or in a list) becomes its text here, joined by newlines
    when there are several; other structured outputs (images, files) become their ``str()``.
    """
    if isinstance(output, str):
        return output
    parts = output if isinstance(output, list) and output else [output]
    texts = [_text_content(part) for part in parts]
    if all(t is not None for t in texts):
        return "\n".join(t for t in texts if t is not None)
    return str(output)


def _text_content(part: Any) -> str | None:
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
    return text if kind in ("text", "input_text") and isinstance(text, str) else None
