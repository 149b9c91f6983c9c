"""Deferred completion: a tool hands its work to an external system and frees its worker.

The tool asks for a completion handle (``ctx.completion_handle()``), gives it to the system
that does the work, and returns ``Deferred(complete_within_s=...)``. The worker records the
call as ``deferred`` in the ledger and frees the call's slot; no outcome is published yet.
Later the external system (or an operator) publishes a ``CompletionMessage`` with the handle
on the ``completions`` topic, and a worker of the tool's pool, any of them, ends the call with
it: the turn settles then. The handle names the attempt and is signed with the tenant's
decision key; the ledger takes one completion per call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kernel.errors import ToolfleetError


@dataclass(frozen=True)
class Deferred:
    """What a tool returns once it handed its work to an external system, which completes
    the call later with the handle from ``ctx.completion_handle()``."""

    complete_within_s: float
    """How long the external system has (the call's completion is due by then)."""

    def __post_init__(self) -> None:
        seconds = self.complete_within_s
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not math.isfinite(seconds)
            or seconds <= 0
        ):
            raise ToolfleetError(
                f"Deferred needs complete_within_s as a positive number of seconds, got {seconds!r}"
            )
