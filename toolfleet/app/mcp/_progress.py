"""A call's progress as MCP ``notifications/progress``, while the door waits for the call.

The door follows the run's progress events (``FleetClient.progress``: each ``(attempt,
sequence)`` at most once) from before it submits (a plain call) or from when a
``tasks/result`` starts waiting (a task), and turns each into a notification for the
request's progress token (``kernel.rules.progress.mcp_notice``: ``progress`` only grows, a
retried attempt is quiet until it passes what was sent and names its attempt). Progress is
best-effort, as on the fleet: an event that arrives after the call's result was answered is
not sent, and a notification the client can no longer take is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from kernel.errors import ToolfleetError
from kernel.rules.mcp import call_id_of
from kernel.rules.progress import Notice, mcp_notice
from toolfleet.client import FleetClient, RunProgress

log = logging.getLogger(__name__)

NoticeSink = Callable[[Notice], Awaitable[None]]
"""Sends one notification (the request's token and stream are the sink's)."""


@contextlib.asynccontextmanager
async def relayed(
    client: FleetClient,
    tenant_id: str,
    run_id: str,
    send: NoticeSink,
    *,
    sent: float | None = None,
) -> AsyncIterator[None]:
    """Send the progress of ``run_id``'s call through ``send`` while the block runs, from
    the events reported after it began. ``sent`` is the last progress already sent under
    the token (a task's earlier ``tasks/result`` stream): nothing at or below it is sent.

    A fleet whose progress cannot be read (no ``progress`` topic) sends none: the call is
    served all the same, and the door logs why."""
    stream = client.progress(run_id, tenant_id=tenant_id)
    try:
        await stream.open()
    except ToolfleetError as exc:
        log.warning(
            "MCP door sends no progress: %s", exc, extra={"run_id": run_id, "error": str(exc)}
        )
        yield
        return
    log.debug("MCP door follows a call's progress", extra={"run_id": run_id})
    relay = asyncio.create_task(_relay(stream, call_id_of(run_id), send, sent))
    try:
        yield
    finally:
        stream.close()
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await relay


async def _relay(stream: RunProgress, call_id: str, send: NoticeSink, sent: float | None) -> None:
    async for event in stream:
        if event.call_id != call_id:
            continue
        notice = mcp_notice(
            sent, attempt=event.attempt, done=event.done, total=event.total, message=event.message
        )
        if notice is None:
            continue
        sent = notice.progress
        try:
            await send(notice)
        except Exception:  # a client gone meanwhile: progress is best-effort
            log.debug("progress not sent", exc_info=True)
