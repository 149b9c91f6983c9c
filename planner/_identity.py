"""Invocation identity: fingerprints, idempotency keys and the SDK texts for identity errors.

The fingerprint decides whether two calls with one call_id are the same invocation, so it must
not depend on how the model happened to format its arguments: whitespace and key order never
matter, only the tool and the parsed values do.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from schemas import FunctionCallItem

EMPTY_CALL_ID = "Tool invocations require a non-empty string call ID before execution."
"""Turn error text for a function call without a call_id."""

REUSED_IN_RESPONSE = (
    "Model reused a tool call ID for a different invocation in one response. "
    "Use a unique call ID for each tool invocation."
)
"""Turn error text: one call_id, two different invocations in the same response."""

REUSED_COMPLETED = (
    "Model reused a completed tool call ID for a different invocation. "
    "Use a unique call ID for each tool invocation."
)
"""Turn error text: a committed call_id reused for a different invocation."""

REUSED_IN_FLIGHT = (
    "Model reused a tool call ID for a different invocation. "
    "Use a unique call ID for each tool invocation."
)
"""Turn error text: a known but uncommitted call_id reused for a different invocation.

The SDK 0.24 raises this exact text when a registered invocation record (not yet completed)
meets a different fingerprint (run_context._tool_invocation_status).
"""


EXECUTED_NOT_COMMITTED = (
    "A tool call already executed, but its output was not committed. "
    "Start a new run instead of retrying the invocation."
)
"""Turn error text: a call_id whose invocation ran but has no committed output (it failed the
turn, or its run was cancelled while it ran), met again with the same identity (lifecycle
item 4)."""


_IDEMPOTENCY_PREFIX = "tf-"
_IDEMPOTENCY_HEX_CHARS = 40  # 160 bits: collision-free in practice, short enough for headers.


# The SDK's own canonical form (agents/_tool_invocation.py): sorted keys, no spaces, UTF-8.
# One encoder for every call (json.dumps with options builds a new one each time).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _canonical_json(value: Any) -> str:
    return _CANONICAL.encode(value)


def lookup_key(item: FunctionCallItem) -> str:
    """The registry key the call names: ``namespace.name`` or ``name`` (as ToolSpec.lookup_key)."""
    return f"{item.namespace}.{item.name}" if item.namespace else item.name


def parse_arguments(arguments: str) -> dict[str, Any] | None:
    """The call's arguments as a dict, or None when they are not a JSON object."""
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):  # nested too deep for any parser: not usable JSON
        return None
    return parsed if isinstance(parsed, dict) else None


def fingerprint(tool_lookup_key: str, arguments: str) -> str:
    """sha256 hex of the canonical JSON of the tool lookup key and the parsed arguments.

    Arguments that are not JSON at all are fingerprinted as their raw string under a distinct
    key, so they never collide with a parsed value that happens to look the same.
    """
    try:
        payload: dict[str, Any] = {"tool": tool_lookup_key, "arguments": json.loads(arguments)}
    except (ValueError, RecursionError):
        payload = {"tool": tool_lookup_key, "raw_arguments": arguments}
    return hashlib.sha256(_canonical_json(payload).encode("utf-8")).hexdigest()


def idempotency_key(tenant_id: str, run_scope: str, call_id: str, fingerprint: str) -> str:
    """The key upstream systems dedupe on: stable per call, never per attempt.

    Derived only from the invocation identity (tenant, the run it is scoped to, call_id,
    fingerprint), so every retry, probe and compensation of one call carries the same key.
    ``run_scope`` is the run id when identity is scoped to the run (two runs may both send
    call_0 with the same arguments, and both must take effect), "" when it is scoped to the
    tenant (the key is then the one earlier releases derived).
    """
    parts = [tenant_id, run_scope, call_id, fingerprint] if run_scope else [
        tenant_id, call_id, fingerprint
    ]  # fmt: skip
    # A JSON list keeps the parts unambiguous whatever characters the call_id contains.
    digest = hashlib.sha256(_canonical_json(parts).encode("utf-8"))
    return _IDEMPOTENCY_PREFIX + digest.hexdigest()[:_IDEMPOTENCY_HEX_CHARS]
