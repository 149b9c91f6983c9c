"""Probe and compensate commands: the reconciler's two ways of acting on an unknown effect.

Neither goes through guardrails, approvals or the ledger's ``started`` gate: a probe only reads
upstream state, and a compensation is approved by the reconciler before it is sent.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from kernel.errors import ConfigurationError, InvalidMessageError, ModelBehaviorError
from kernel.tools._context import ProbeResult, ToolContext
from kernel.tools._errors import ToolTimeoutError
from kernel.tools._failures import TOOL_FAILURES, FailureRecording, ToolFailure
from kernel.tools._tool import Tool
from schemas import ExecutionCommand


async def run_probe(
    tool: Tool,
    command: ExecutionCommand,
    *,
    worker_id: str | None = None,
    recording: FailureRecording | None = None,
) -> ProbeResult:
    """Ask the tool's probe whether the call's effect reached upstream.

    Never raises for the probe's own failures: no probe, a probe error, a timeout (the tool's
    timeout, async probes only) or a wrong return type all answer ``unknown`` with a detail,
    so the reconciler can ask again within its budget or escalate. A CancelledError (the
    caller's, or one the probe raises) propagates. A probe's exception is logged as the
    runner logs a tool's (``recording``: its secrets and link).
    """
    probe = tool.probe_function
    if probe is None:
        return ProbeResult.unknown(f"tool {tool.lookup_key} declares no probe")
    ctx = _context(tool, command, worker_id)
    try:
        result = await _call(probe, tool, ctx)
    except ToolTimeoutError:
        return ProbeResult.unknown(f"probe timed out after {tool.timeout or 0:g} seconds")
    except Exception as exc:
        failure = _reported(exc, ctx, command, recording, part="probe of")
        return ProbeResult.unknown(f"probe raised {failure.type}: {failure.message}")
    if not isinstance(result, ProbeResult):
        return ProbeResult.unknown(
            f"probe returned {type(result).__name__}; it must return a ProbeResult"
        )
    return result


async def run_compensate(
    tool: Tool,
    command: ExecutionCommand,
    *,
    worker_id: str | None = None,
    recording: FailureRecording | None = None,
    on_failure: Callable[[ToolFailure], None] | None = None,
) -> str:
    """Run the tool's compensate action on ``command.original_output``; returns its output.

    Raises ConfigurationError if the tool declares no compensate action, InvalidMessageError
    if the command carries no original output, ToolTimeoutError if an async compensate
    exceeds the tool's timeout, and whatever the action itself raises (logged as the runner
    logs a tool's exception, and handed to ``on_failure``: the worker keeps it with the
    compensation's attempt).
    """
    compensate = tool.compensate_function
    if compensate is None:
        raise ConfigurationError(f"tool {tool.lookup_key} declares no compensate action")
    if command.original_output is None:
        reason = "compensate command without original_output"
        raise InvalidMessageError(f"{reason} for call {command.call_id}", reason=reason)
    ctx = _context(tool, command, worker_id)
    try:
        result = await _call(compensate, tool, ctx, command.original_output)
    except Exception as exc:
        failure = _reported(exc, ctx, command, recording, part="compensate action of")
        if on_failure is not None:
            on_failure(failure)
        raise
    return result if isinstance(result, str) else str(result)


def _reported(
    exc: Exception,
    ctx: ToolContext,
    command: ExecutionCommand,
    recording: FailureRecording | None,
    *,
    part: str,
) -> ToolFailure:
    """Log what the probe or compensate action raised (with the call's full identity)."""
    recording = recording or FailureRecording()
    failure = recording.failure(exc, ctx.args)
    link = recording.link(command, attempt=part != "probe of")
    TOOL_FAILURES.report(command.tool_name, failure, exc, part=part, command=command, link=link)
    return failure


def _context(tool: Tool, command: ExecutionCommand, worker_id: str | None) -> ToolContext:
    # Probes and compensations key on the idempotency key; arguments are a convenience.
    try:
        args = tool.parse_arguments(command.arguments)
    except ModelBehaviorError:
        args = {}
    return ToolContext.from_command(command, worker_id=worker_id, args=args)


async def _call(func: Callable[..., Any], tool: Tool, *args: Any) -> Any:
    """Await an async function under the tool's timeout; run a sync one in a thread, unbounded."""
    if not inspect.iscoroutinefunction(func) and not inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004
    ):
        result = await asyncio.to_thread(func, *args)
        return await result if inspect.isawaitable(result) else result
    scope = asyncio.timeout(tool.timeout)
    try:
        async with scope:
            return await func(*args)
    except TimeoutError:
        if scope.expired():  # ours, not a TimeoutError the function raised itself
            raise ToolTimeoutError(tool.name, tool.timeout or 0.0) from None
        raise
