"""Run one tool through a worker's lifecycle in-process: no broker, no Redis, no fleet.

Like temporalio's ``ActivityEnvironment``: a tool author's unit test builds a
``ToolEnvironment``, runs a tool with some arguments and asserts on the ``CallOutcome`` the
fleet would have published: approval, input guardrails, the timeout, the body, output
guardrails, the effect classification of whatever the body raised, and the hooks, in exactly
the order and with exactly the code a worker uses (``kernel.tools.run_call``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kernel.tools import CallHooks, ProbeResult, Tool, run_call, run_compensate, run_probe
from schemas import CallOutcome, ExecutionCommand, ProgressEvent


@dataclass
class ToolEnvironment:
    """One tenant's run, in which calls of tools are made in-process, one at a time.

    ``run`` returns the outcome a worker would publish; ``probe`` and ``compensate`` run the
    tool's recovery actions as the reconciler would have them run. ``upstream_refs`` collects
    what tools passed to ``ctx.record_upstream_ref`` (the worker writes it to the ledger),
    ``progress`` the progress events of ``ctx.report_progress`` (a worker publishes them).
    """

    tenant_id: str = "test-tenant"
    run_id: str = "test-run"
    hooks: CallHooks | None = None
    """Lifecycle hooks, as a registry's ``hooks`` would be."""
    max_output_bytes: int | None = None
    """As the worker's ``TOOLFLEET_MAX_OUTPUT_BYTES``; None: unbounded."""
    upstream_refs: dict[str, str] = field(default_factory=dict)
    """call_id -> the upstream reference the tool recorded during that call."""
    progress_interval_s: float = 0.0
    """As the worker's ``TOOLFLEET_PROGRESS_MIN_INTERVAL_S``; 0: every report is an event."""
    progress: list[ProgressEvent] = field(default_factory=list)
    """The progress events of every call run, in the order a worker would publish them."""
    _calls: int = 0
    _running: dict[str, asyncio.Future[None]] = field(default_factory=dict)

    async def run(
        self,
        tool: Tool,
        arguments: str | Mapping[str, Any] = "{}",
        *,
        call_id: str | None = None,
        approved: bool = False,
        attempt: int = 1,
        failure_policy: Literal["error_as_output", "fail_turn"] = "error_as_output",
        pre_approval_guardrails: bool = False,
    ) -> CallOutcome:
        """Run one call of ``tool`` and return its outcome.

        ``arguments``: the model's JSON string, or a mapping (dumped to JSON). A tool that needs
        approval ends ``pending_approval`` unless ``approved``. ``attempt`` > 1 runs the call as
        the fleet's retry of a not-executed call (same idempotency key). ``failure_policy``
        "fail_turn" makes failures fail the turn, as the turn's config would.
        """
        command = self.command(
            tool,
            arguments,
            call_id=call_id,
            approved=approved,
            attempt=attempt,
            failure_policy=failure_policy,
            pre_approval_guardrails=pre_approval_guardrails,
        )
        cancel = asyncio.get_running_loop().create_future()
        self._running[command.call_id] = cancel

        async def record(ref: str) -> None:
            self.upstream_refs[command.call_id] = ref

        try:
            return await run_call(
                tool,
                command,
                worker_id="tool-environment",
                hooks=self.hooks,
                cancel_call=cancel,
                record_upstream=record,
                max_output_bytes=self.max_output_bytes,
                progress=self.progress.append,
                progress_interval_s=self.progress_interval_s,
            )
        finally:
            self._running.pop(command.call_id, None)

    def cancel(self, call_id: str) -> None:
        """Cancel one running call (a tool-local cancellation: it follows the failure policy)."""
        future = self._running.get(call_id)
        if future is not None and not future.done():
            future.set_result(None)

    async def probe(
        self, tool: Tool, arguments: str | Mapping[str, Any] = "{}", *, call_id: str
    ) -> ProbeResult:
        """Ask ``tool``'s probe about the call ``call_id`` made (never raises for the probe's own
        failures: they answer ``unknown``)."""
        command = self.command(tool, arguments, call_id=call_id, kind="probe")
        return await run_probe(tool, command, worker_id="tool-environment")

    async def compensate(
        self,
        tool: Tool,
        original_output: str,
        arguments: str | Mapping[str, Any] = "{}",
        *,
        call_id: str,
    ) -> str:
        """Run ``tool``'s compensate action for the call ``call_id`` that output
        ``original_output``; returns the compensation's output."""
        command = self.command(
            tool, arguments, call_id=call_id, kind="compensate", original_output=original_output
        )
        return await run_compensate(tool, command, worker_id="tool-environment")

    def command(
        self,
        tool: Tool,
        arguments: str | Mapping[str, Any] = "{}",
        *,
        call_id: str | None = None,
        **fields: Any,
    ) -> ExecutionCommand:
        """The command a worker would receive for this call (also for custom ``run_call``s).

        The idempotency key is stable per (tenant, run, call_id), as on the fleet; the
        fingerprint is a digest of the tool and the arguments.
        """
        if call_id is None:
            self._calls += 1
            call_id = f"call_{self._calls}"
        text = arguments if isinstance(arguments, str) else json.dumps(dict(arguments))
        identity = f"{self.tenant_id}\0{self.run_id}\0{call_id}"
        values: dict[str, Any] = {
            "tenant_id": self.tenant_id,
            "run_id": self.run_id,
            "turn_id": 1,
            "call_id": call_id,
            "tool_name": tool.lookup_key,
            "tool_version": tool.version,
            "arguments": text,
            "index": 0,
            "pool": tool.pool or "default",
            "attempt": 1,
            "fencing_token": 1,
            "idempotency_key": hashlib.sha256(identity.encode()).hexdigest(),
            "fingerprint": hashlib.sha256(f"{tool.lookup_key}\0{text}".encode()).hexdigest(),
            "upstream_ref": self.upstream_refs.get(call_id),
            "issued_at": time.time(),
        }
        return ExecutionCommand(**(values | fields))
