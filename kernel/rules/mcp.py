"""The MCP front door's mapping of the fleet onto the Model Context Protocol (pure).

What ``toolfleet mcp`` tells an MCP client, decided in one place: a published tool as an MCP
tool (its annotations come from its effect class), a settled call as a ``CallToolResult``
(its ``_meta`` carries the fleet's status and effect), and the run a ``tools/call`` becomes.
The door (``toolfleet.app.mcp``) does the I/O; nothing here does.

Pure: no I/O and no clock. ``run_id_for`` draws a random id for a call without an
idempotency key (the only randomness here).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from kernel.rules.effects import attendance
from kernel.rules.limits import json_depth_exceeds
from kernel.rules.texts import TOOL_NOT_FOUND
from schemas import CallStatus, Effect, EffectClass, ToolSpec, TurnResult


def call_id_of(run_id: str) -> str:
    """The call id of the one call a ``tools/call`` becomes (turn 0 of its own run): the run
    id itself, unique per door call, so two calls never share a ledger entry whatever the
    fleet's identity scope (with ``identity_scope="tenant"`` the ledger keys a call by tenant
    and call id alone)."""
    return run_id


META_CALL = "io.toolfleet/call"
"""The ``_meta`` key of a result that says what the fleet recorded for the call."""

META_EFFECT_CLASS = "io.toolfleet/effect-class"
"""The ``_meta`` key of a listed tool's declared effect class."""

META_VERSION = "io.toolfleet/version"
"""The ``_meta`` key of a listed tool's version (the newest live one)."""

META_GATED = "io.toolfleet/gated"
"""The ``_meta`` key saying whether a listed tool's calls may wait for a person's approval
(every call, or as its approval policy decides per call)."""

META_IDEMPOTENCY_KEY = "io.toolfleet/idempotency-key"
"""The request ``_meta`` key a client names its call's idempotency key with."""

IDEMPOTENCY_KEY_MAX = 256
"""Longest idempotency key a client may send (characters)."""

_RUN_PREFIX = "mcp-"
_KEYED_PREFIX = "mcp-k-"
_KEY_DIGEST_HEX = 32  # 128 bits of sha256: a collision is as likely as a random run id's


def annotations_of(spec: ToolSpec) -> dict[str, Any]:
    """The MCP tool annotations (wire names) a tool's declared effect class stands for.

    ``read_only`` is readOnlyHint; ``idempotent`` is idempotentHint, not destructive;
    ``non_idempotent`` and ``irreversible`` are destructiveHint, not idempotent. Every hint
    that applies is said outright, true or false, because the specification's defaults
    (destructiveHint and openWorldHint true, the others false) would otherwise speak for the
    tool. ``openWorldHint`` is left out: the fleet does not know what a tool reaches.

    The round trip through ``kernel.rules.effects.mcp_effect_class`` (how a worker reads an
    upstream MCP server's annotations) gives back the declared class, except that
    ``irreversible`` comes back ``non_idempotent``: MCP has no hint for "cannot be undone",
    and the cautious reading of destructive is the strongest class a hint can seed.
    ``title`` is the tool's lookup key.
    """
    hints: dict[str, Any] = {"title": spec.lookup_key}
    effect_class: EffectClass = spec.effect_class
    if effect_class == "read_only":
        hints |= {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True}
    elif effect_class == "idempotent":
        hints |= {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True}
    else:
        hints |= {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False}
    return hints


def tool_of(spec: ToolSpec) -> dict[str, Any]:
    """A published tool as ``tools/list`` shows it (an MCP ``Tool``, wire names).

    ``name`` is its lookup key (``namespace.name``: MCP allows dots), ``inputSchema`` its
    JSON Schema, ``annotations`` from its effect class (``annotations_of``). Every tool may
    run as a task (``execution.taskSupport`` optional). ``_meta`` carries the effect class,
    the version and whether its calls wait for a person (the release gate).
    """
    gated = not attendance(spec)[0]
    return {
        "name": spec.lookup_key,
        "description": spec.description,
        "inputSchema": _object_schema(spec.parameters),
        "annotations": annotations_of(spec),
        "execution": {"taskSupport": "optional"},
        "_meta": {
            META_EFFECT_CLASS: spec.effect_class,
            META_VERSION: spec.version,
            META_GATED: gated,
        },
    }


def _object_schema(parameters: dict[str, Any]) -> dict[str, Any]:
    """MCP requires an input schema of type object; a tool without parameters has one with
    no properties."""
    if parameters.get("type") == "object":
        return parameters
    return {"type": "object", "properties": {}, **parameters}


def listed(specs: dict[str, ToolSpec]) -> list[dict[str, Any]]:
    """The tools ``tools/list`` shows, by lookup key: the enabled ones (a disabled tool's
    calls are refused by the planner, so it is not offered)."""
    return [tool_of(specs[key]) for key in sorted(specs) if specs[key].enabled]


class SettledCall(Protocol):
    """What ``call_tool_result`` reads of a settled call (a ``CallOutcome`` is one)."""

    @property
    def run_id(self) -> str: ...
    @property
    def status(self) -> CallStatus: ...
    @property
    def effect(self) -> Effect: ...
    @property
    def output(self) -> str | None: ...
    @property
    def attempt(self) -> int: ...
    @property
    def resolved(self) -> bool: ...


@dataclass(frozen=True)
class CallEnd:
    """How a call ended when the door learned it from its turn's result rather than from the
    call's outcome (a ``SettledCall``)."""

    run_id: str
    status: CallStatus
    effect: Effect
    output: str | None
    attempt: int
    resolved: bool


APPROVAL_WAIT = (
    "{tool} waits for approval: an operator approves or rejects call {call_id} of run "
    "{run_id} (the console, or `toolfleet approvals`). A plain call answers now: to get the "
    "result after the decision, call the tool as a task, or with an idempotency key "
    "(io.toolfleet/idempotency-key) and the same key again once it was decided."
)
"""What a plain call of a tool that waits for a person's approval answers."""


def call_end_of_turn(result: TurnResult, tool: str) -> CallEnd:
    """The end of a one-call turn's call, from the turn's result.

    A call waiting for approval is ``pending_approval`` (not executed, not resolved: the door
    tells the client who may approve it). A turn that failed before its call reported
    anything says ``unknown``: the turn's failure is no proof that the call never ran. A
    turn's record does not say whether the reconciler is done with an unknown or wrong
    effect, so those count as unresolved.
    """
    if result.status == "interrupted":
        return CallEnd(
            result.run_id,
            "pending_approval",
            "not_executed",
            APPROVAL_WAIT.format(
                tool=tool, run_id=result.run_id, call_id=call_id_of(result.run_id)
            ),
            0,
            False,
        )
    call_id = call_id_of(result.run_id)
    record = next((c for c in result.calls if c.call_id == call_id), None)
    output = next((o.output for o in result.outputs if o.call_id == call_id), None)
    if record is None:
        why = result.error.message if result.error else f"the turn ended {result.status}"
        return CallEnd(result.run_id, "failed", "unknown", why, 0, False)
    resolved = record.effect not in ("unknown", "wrong_effect")
    if output is None and record.error is not None:
        output = record.error.message
    return CallEnd(result.run_id, record.status, record.effect, output, record.attempts, resolved)


def call_tool_result(call: SettledCall) -> dict[str, Any]:
    """A settled call as a ``CallToolResult`` (wire names).

    ``content`` is the output the model would see (one text block); ``isError`` is set for
    anything but ``succeeded``. ``_meta["io.toolfleet/call"]`` tells what the fleet recorded:
    the run, the transport status, the business effect (an error may well have ``applied``),
    the attempts and whether the effect is resolved.
    """
    return {
        "content": [{"type": "text", "text": call.output or ""}],
        "isError": call.status != "succeeded",
        "_meta": {
            META_CALL: {
                "run_id": call.run_id,
                "status": call.status,
                "effect": call.effect,
                "attempts": call.attempt,
                "resolved": call.resolved,
            }
        },
    }


def unknown_tool_result(name: str) -> dict[str, Any]:
    """The answer to a call of a tool the fleet does not serve: an error result in the
    Agents SDK's words, nothing submitted."""
    return {"content": [{"type": "text", "text": TOOL_NOT_FOUND.format(name=name)}],
            "isError": True}  # fmt: skip


def run_id_for(tenant: str, idempotency_key: str | None) -> str:
    """The run a ``tools/call`` becomes.

    Without an idempotency key a fresh random run (``mcp-<32 hex>``): every call is new.
    With one, the same run every time that tenant sends that key (``mcp-k-<32 hex>``, a
    digest of both), so a call retried after a dropped connection finds its first run and
    the fleet's ledger dedupes it. Another tenant's same key is another run. A key is
    1 to ``IDEMPOTENCY_KEY_MAX`` characters (ValueError otherwise).
    """
    if idempotency_key is None:
        return f"{_RUN_PREFIX}{uuid.uuid4().hex}"
    if not 0 < len(idempotency_key) <= IDEMPOTENCY_KEY_MAX:
        raise ValueError(
            f"an idempotency key ({META_IDEMPOTENCY_KEY}) is 1 to {IDEMPOTENCY_KEY_MAX} "
            f"characters, not {len(idempotency_key)}"
        )
    digest = hashlib.sha256(f"{tenant}\x1f{idempotency_key}".encode()).hexdigest()
    return f"{_KEYED_PREFIX}{digest[:_KEY_DIGEST_HEX]}"


# --- idempotency keys and tasks ----------------------------------------------------------------

META_RELATED_TASK = "io.modelcontextprotocol/related-task"
"""The ``_meta`` key naming the task a message belongs to (MCP 2025-11-25)."""

META_IMMEDIATE = "io.modelcontextprotocol/model-immediate-response"
"""The ``_meta`` key of the text a host may show the model while a task runs."""

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
"""An MCP task's status (2025-11-25)."""

TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
"""The statuses a task never leaves."""

TASK_TTL_DEFAULT_MS = 24 * 3600 * 1000
"""A task's time to live when the client asks for none."""

TASK_TTL_MIN_MS = 60_000
"""The shortest time to live a task gets, whatever the client asks."""

POLL_INTERVAL_MS = 1_000
"""The interval the door suggests between a client's ``tasks/get``."""

REPUBLISH_AFTER_S = 5.0
"""How long a record may stay unsubmitted before a reader publishes its call again: the
replica that created it died before its publish was acknowledged."""

IDEMPOTENCY_CONFLICT = (
    "idempotency key {key!r} was used for another call (another tool or other arguments) of "
    "this tenant: use a new key for a new call"
)
"""The error of a call whose idempotency key names another call (JSON-RPC -32602)."""

TASK_NOT_FOUND = "Task not found: {task_id}"
"""The error of a task id the caller's tenant has no task of (another tenant's too)."""


def call_fingerprint(tool: str, arguments: Mapping[str, Any] | None) -> str:
    """What identifies a call beyond its run: the tool and its arguments (canonical JSON),
    hashed. The same idempotency key with another fingerprint is another call."""
    canonical = json.dumps(
        {"tool": tool, "arguments": dict(arguments or {})},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def idempotency_key_of(meta: Mapping[str, Any] | None) -> str | None:
    """The client's idempotency key in a request's ``_meta`` (None: none).
    ValueError when it is there but not a string of 1 to ``IDEMPOTENCY_KEY_MAX``."""
    if not meta or META_IDEMPOTENCY_KEY not in meta:
        return None
    key = meta[META_IDEMPOTENCY_KEY]
    if not isinstance(key, str) or not 0 < len(key) <= IDEMPOTENCY_KEY_MAX:
        raise ValueError(
            f"{META_IDEMPOTENCY_KEY} is a string of 1 to {IDEMPOTENCY_KEY_MAX} characters"
        )
    return key


def task_ttl_ms(requested: int | None, retention_s: int) -> int | None:
    """A task's time to live: what the client asked (``TASK_TTL_DEFAULT_MS`` when nothing),
    at least ``TASK_TTL_MIN_MS``, at most the ledger's retention (``retention_s``: a task
    cannot outlive what it reads). None (kept for ever) only when the ledger keeps runs for
    ever (``retention_s`` 0) and the client asked for no limit."""
    wanted = TASK_TTL_DEFAULT_MS if requested is None else max(requested, TASK_TTL_MIN_MS)
    if retention_s <= 0:
        return None if requested is None else wanted
    return min(wanted, retention_s * 1000)


def republish_due(*, submitted: bool, has_entry: bool, created_at: float, now: float) -> bool:
    """Whether a reader publishes a call's model response again: it was never acknowledged
    as submitted, the fleet's ledger has no entry of it, and its creator had
    ``REPUBLISH_AFTER_S`` to do it. Publishing twice is harmless (the same run and call id:
    the planner's ledger dedupes); never publishing is a lost call."""
    return not submitted and not has_entry and now - created_at >= REPUBLISH_AFTER_S


@dataclass(frozen=True)
class CallProgress:
    """Where a task's call stands, as the door read it (its ledger entry; no I/O here)."""

    state: str | None
    """The ledger entry's state (None: no entry yet)."""
    pending_approval: bool = False
    attempts: int = 0
    outcome: SettledCall | None = None
    settled: bool = False
    """The outcome gives the model its answer (``kernel.rules.effects.settles_call``)."""


def task_status(
    tool: str, call: CallProgress, *, cancelled_reason: str | None = None
) -> tuple[TaskStatus, str | None]:
    """A task's MCP status and status message.

    A cancelled task stays cancelled (the call's effect, in the result's ``_meta``, tells the
    truth: cancelling is not undoing). A settled call is completed when it succeeded, failed
    otherwise (an error result is a failed task on the 2025-11-25 wire). A call waiting for a
    person's approval is ``input_required``; one whose effect is unknown stays ``working``
    while the reconciler probes it, and says so.
    """
    if cancelled_reason is not None:
        return "cancelled", cancelled_reason
    outcome = call.outcome
    if outcome is not None and call.settled:
        if outcome.status == "succeeded":
            return "completed", None
        return "failed", outcome.output or f"the call ended {outcome.status}"
    if call.state is None:
        return "working", "queued"
    if call.pending_approval:
        return "input_required", (
            f"waiting for approval of {tool}: an operator decides (the console, "
            "`toolfleet approvals`)"
        )
    if outcome is not None and outcome.effect in ("unknown", "wrong_effect"):
        return "working", (
            f"effect unknown: the reconciler is probing it (attempt {outcome.attempt})"
        )
    if call.state == "started":
        return "working", f"running (attempt {max(call.attempts, 1)})"
    if call.state == "deferred":
        return "working", "handed over to another system: waiting for its completion"
    if outcome is not None and outcome.status != "succeeded":
        return "working", f"attempt {outcome.attempt} ended {outcome.status}; the fleet retries"
    return "working", "waiting for a slot"


def task_of(
    task_id: str,
    status: TaskStatus,
    message: str | None,
    *,
    created_at: str,
    updated_at: str,
    ttl_ms: int | None,
) -> dict[str, Any]:
    """A ``Task`` (wire names); the times are ISO 8601 (the caller formats them)."""
    task: dict[str, Any] = {
        "taskId": task_id,
        "status": status,
        "createdAt": created_at,
        "lastUpdatedAt": updated_at,
        "ttl": ttl_ms,
    }
    if status not in TERMINAL:
        task["pollInterval"] = POLL_INTERVAL_MS
    if message:
        task["statusMessage"] = message
    return task


def created_task_result(task: Mapping[str, Any], tool: str) -> dict[str, Any]:
    """The answer to a task-augmented ``tools/call``: the task, and, for a client that reads
    only a ``CallToolResult``, a text saying where its result is."""
    immediate = (
        f"{tool} runs as task {task['taskId']}: its result comes from tasks/result "
        "(any replica of the door answers)"
    )
    return {
        "task": dict(task),
        "content": [{"type": "text", "text": immediate}],
        "_meta": {META_IMMEDIATE: immediate},
    }


def cancelled_result(call: SettledCall | None, run_id: str, reason: str) -> dict[str, Any]:
    """The result of a cancelled task: an error result saying so, its ``_meta`` with what the
    fleet recorded of the call so far (its effect may well be ``applied``)."""
    end = call or CallEnd(run_id, "cancelled", "not_executed", None, 0, False)
    result = call_tool_result(end)
    result["isError"] = True
    result["content"] = [{"type": "text", "text": f"cancelled: {reason}"}]
    return result


def related(result: dict[str, Any], task_id: str) -> dict[str, Any]:
    """``result`` with ``_meta`` naming the task it belongs to."""
    meta = dict(result.get("_meta") or {})
    meta[META_RELATED_TASK] = {"taskId": task_id}
    return {**result, "_meta": meta}


def arguments_refusal(arguments: str, *, max_bytes: int, max_depth: int) -> str | None:
    """Why a call's arguments (JSON text) are over the fleet's limits, which the planner
    would refuse (a dead letter, no result ever); None when they are within them. The door
    answers the reason at once instead of waiting for a call that never comes."""
    size = len(arguments.encode())
    if size > max_bytes:
        return f"arguments of {size} bytes, more than TOOLFLEET_MAX_ARGUMENT_BYTES={max_bytes}"
    if json_depth_exceeds(arguments, max_depth):
        return f"arguments nested deeper than TOOLFLEET_MAX_JSON_DEPTH={max_depth}"
    return None
