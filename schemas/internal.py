"""Messages between toolfleet's own services: plans, commands, outcomes, tasks, dead letters."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from schemas._base import Message, WireModel
from schemas.inbound import RunContextCopy, TurnConfig

CallStatus = Literal[
    "succeeded", "failed", "rejected", "timed_out", "cancelled", "pending_approval", "skipped"
]
"""What happened at the transport level."""

Effect = Literal["not_executed", "applied", "unknown", "wrong_effect", "compensated"]
"""What happened at the business level. A timeout or a lost worker never proves not_executed."""

EffectClass = Literal["read_only", "idempotent", "non_idempotent", "irreversible"]
"""What a tool's side effect allows: replay-safe (read_only, idempotent) or not."""

RetryHint = Literal["transient", "permanent"]
"""Whether trying a not-executed call again can help (see kernel.rules.effects)."""

ErrorSeverity = Literal["cancellation", "error", "base_exception"]
"""Rank of a failure for the deterministic failure choice: base_exception > error > cancellation."""

Disposition = Literal["dispatch", "reuse", "reject", "interrupt", "not_found", "attach"]
"""What the planner decided for one call of a turn."""


ERROR_MESSAGE_MAX_BYTES = 4_096
"""Longest error message a message carries: a validation error of a hostile argument object can
be megabytes, and must not make the outcome too big to publish."""


def cut_text(text: str, limit_bytes: int) -> str:
    """``text`` if it fits in ``limit_bytes`` of UTF-8, else a prefix and how much was cut."""
    raw = text.encode()
    if len(raw) <= limit_bytes:
        return text
    head = raw[: max(0, limit_bytes - 48)].decode(errors="ignore")
    return f"{head}… [{len(raw) - len(head.encode())} more bytes cut]"


def _cut(text: str) -> str:
    return cut_text(text, ERROR_MESSAGE_MAX_BYTES)


class CallError(WireModel):
    """The error behind a failed call, for operators; the model sees ``output`` instead."""

    type: str = Field(min_length=1, description="Exception class name, e.g. ValueError.")
    message: str = Field(description=f"Cut to {ERROR_MESSAGE_MAX_BYTES} bytes.")
    severity: ErrorSeverity = "error"

    @field_validator("message")
    @classmethod
    def _bounded(cls, value: str) -> str:
        return _cut(value)


class PlannedCall(WireModel):
    """The planner's decision for one call, at its position in model order."""

    call_id: str
    tool_name: str
    index: int = Field(ge=0, description="Position among the response's function calls.")
    arguments: str
    disposition: Disposition
    pool: str | None = Field(default=None, description="Worker pool of a dispatched call.")
    tool_version: str | None = Field(
        default=None,
        min_length=1,
        description="The version a dispatched call was routed to (an operator's pin or an "
        "automatic rollback); None: the newest version the worker serves.",
    )
    output: str | None = Field(
        default=None, description="Output already decided (reuse, reject, not_found)."
    )
    status: CallStatus | None = Field(default=None, description="Set when already decided.")
    effect: Effect | None = Field(default=None, description="Set when already decided.")
    effect_class: EffectClass = "non_idempotent"
    on_unknown: Literal["report_now", "reconcile_then_report"] = "reconcile_then_report"
    reason: str | None = Field(
        default=None, description="Why an interrupted call waits (a held run, say)."
    )


class GuardrailVerdict(WireModel):
    """What one of a tool's input or output guardrails said about a call, as the worker ran it.

    An agent runtime reports these as the guardrail results of its run, as the SDK reports the
    guardrails it runs in-process.
    """

    kind: Literal["input", "output"]
    index: int = Field(ge=0, description="The guardrail's position in the tool's list of kind.")
    name: str = Field(description="The guardrail's name.")
    behavior: Literal["allow", "reject_content", "raise_exception", "wrong_effect"]
    message: str | None = Field(default=None, description="A rejection's text for the model.")
    output_info: Any = Field(
        default=None, description="What the guardrail reported beside its verdict, as JSON."
    )


class TurnError(WireModel):
    """Why a turn failed, in the SDK's words."""

    type: str = Field(min_length=1, description="e.g. ModelBehaviorError, UserError.")
    message: str = Field(description=f"Cut to {ERROR_MESSAGE_MAX_BYTES} bytes.")
    call_id: str | None = None
    guardrails: list[GuardrailVerdict] = Field(
        default_factory=list,
        description="The failing call's guardrail verdicts, a tripwire's last.",
    )

    @field_validator("message")
    @classmethod
    def _bounded(cls, value: str) -> str:
        return _cut(value)


class TurnPlan(Message):
    """Every call of one turn and what the planner decided for it; the aggregator's input."""

    topic = "plans"

    run_id: str = Field(min_length=1)
    turn_id: int = Field(ge=0)
    response_id: str = Field(min_length=1)
    agent_name: str = Field(min_length=1)
    epoch: int = Field(default=0, ge=0, description="0 for the first plan, +1 per resumption.")
    calls: list[PlannedCall] = Field(default_factory=list, description="In model order.")
    config: TurnConfig = Field(default_factory=TurnConfig)
    error: TurnError | None = Field(
        default=None, description="Set when planning failed the turn before any side effect."
    )
    planned_at: float = Field(description="Unix time the plan was made.")
    traceparent: str | None = Field(
        default=None,
        description="W3C trace context of the planner's span for the turn: the aggregation "
        "span, made when the turn settles, is its child.",
    )


class ExecutionCommand(Message):
    """Run, probe or compensate one call; keyed by call_id on commands.<pool>."""

    run_id: str = Field(min_length=1)
    turn_id: int = Field(ge=0)
    call_id: str = Field(min_length=1)
    kind: Literal["execute", "probe", "compensate"] = "execute"
    tool_name: str = Field(min_length=1)
    tool_version: str | None = Field(
        default=None,
        min_length=1,
        description="Run this version of the tool (a worker that does not serve it answers "
        "not_executed); None: the newest version the worker serves.",
    )
    arguments: str
    index: int = Field(ge=0)
    pool: str = Field(min_length=1)
    attempt: int = Field(ge=1, description="1 for the first run; retries count up.")
    fencing_token: int = Field(ge=1, description="Outcomes with an older token are ignored.")
    idempotency_key: str = Field(min_length=1, description="Stable per call, never per attempt.")
    fingerprint: str = Field(min_length=1)
    approved: bool = Field(
        default=False, description="Approval already granted: never evaluate needs_approval."
    )
    failure_policy: Literal["error_as_output", "fail_turn"] = "error_as_output"
    pre_approval_guardrails: bool = False
    deadline_at: float | None = Field(default=None, description="Unix time the turn ends.")
    original_output: str | None = Field(
        default=None, description="For compensate: the output of the call being compensated."
    )
    capped: bool = Field(
        default=False,
        description="The turn has max_concurrency: its outcome frees a slot at the planner.",
    )
    admitted: bool = Field(
        default=False,
        description="Counted by admission: the worker that ends the call frees its slots.",
    )
    upstream_ref: str | None = Field(
        default=None,
        description="For probe and compensate: the upstream's own id the call recorded.",
    )
    run_context: RunContextCopy | None = Field(
        default=None,
        description="The agent run's context as the response carried it (the first dispatch "
        "of a call; a command built later from the ledger carries none).",
    )
    tool_call: dict[str, Any] | None = Field(
        default=None,
        description="The call item's other fields as the response carried them (its id, "
        "status, a hosted agent's attribution), for the tool's view of its call; as "
        "run_context, payload of the first dispatch only.",
    )
    heartbeat_details: str | None = Field(
        default=None,
        max_length=65_536,
        description="For a later attempt of a call: the details (JSON text) an earlier "
        "attempt sent last with ctx.heartbeat, from the ledger (state version 3).",
    )
    issued_at: float


class CallOutcome(Message):
    """What happened to one call: transport status, business effect, model-visible output."""

    topic = "outcomes"

    run_id: str = Field(min_length=1)
    turn_id: int = Field(ge=0)
    call_id: str = Field(min_length=1)
    tool_name: str = Field(min_length=1)
    index: int = Field(ge=0)
    attempt: int = Field(ge=1)
    fencing_token: int = Field(ge=0)
    status: CallStatus
    effect: Effect
    output: str | None = Field(default=None, description="What the model sees for this call.")
    error: CallError | None = None
    guardrails: list[GuardrailVerdict] = Field(
        default_factory=list, description="The tool's guardrails that ran, in the order they ran."
    )
    value: str | None = Field(
        default=None,
        description="The body's return value as JSON when it is not text itself, so an agent "
        "runtime can give the application the object (None: the output is all there is).",
    )
    run_context: str | None = Field(
        default=None,
        description="The run context's copy as the call left it, as JSON text, when the call "
        "changed it (None: unchanged, or no copy travelled).",
    )
    fails_turn: bool = Field(
        default=False, description="No failure handler: this failure fails the whole turn."
    )
    resolved: bool = Field(
        default=True,
        description="False while the reconciler still has to resolve an unknown effect, or "
        "the fleet will retry a not-executed call.",
    )
    retry: RetryHint | None = Field(
        default=None,
        description="For not_executed: whether trying again can help (transient) or not.",
    )
    retry_after_s: float | None = Field(
        default=None, ge=0, description="The upstream's Retry-After, when it gave one."
    )
    source: Literal["executor", "reconciler", "human", "planner"] = "executor"
    capped: bool = Field(
        default=False, description="Copied from the command: the planner must see this one."
    )
    admitted: bool = Field(
        default=False,
        description="The call's admission slots are still held: the planner frees them "
        "(its worker did not).",
    )
    throttled: bool = Field(
        default=False, description="The upstream said HTTP 429: its rate limits slow down."
    )
    kind: Literal["execute", "probe", "compensate"] = Field(
        default="execute",
        description="The command this answers; probe and compensate outcomes are the "
        "reconciler's, never a turn's.",
    )
    worker_id: str | None = None
    started_at: float | None = None
    finished_at: float | None = None


class HumanTask(Message):
    """Something an operator has to decide: an effect automation could not establish, a
    compensation waiting for approval, or a tool version whose circuit opened."""

    topic = "human-tasks"

    task_id: str = Field(min_length=1)
    kind: Literal["unknown_effect", "compensation_approval", "circuit_open"] = "unknown_effect"
    tool_name: str = Field(min_length=1)
    tool_version: str | None = None
    run_id: str | None = Field(default=None, description="The call's run (not for circuits).")
    turn_id: int | None = Field(default=None, ge=0)
    call_id: str | None = Field(default=None, min_length=1)
    idempotency_key: str | None = None
    reason: str = Field(min_length=1, description="Why automation stopped, and what was tried.")
    calls: list[str] = Field(
        default_factory=list,
        description="For circuit_open: calls of the version that ran while it was failing, "
        "each RUN/CALL (a '%' or '/' in either written %25 or %2F); the task's tenant is theirs.",
    )
    created_at: float


class TaskResolution(Message):
    """An operator's answer to a HumanTask, read by the reconciler (topic task-resolutions)."""

    topic = "task-resolutions"

    task_id: str = Field(min_length=1)
    resolution: Literal[
        "applied", "not_applied", "wrong_effect", "approve_compensation", "reject_compensation"
    ]
    output: str | None = Field(
        default=None, description="For applied: the output the model should see."
    )
    note: str | None = None
    decided_by: str = Field(min_length=1)
    signature: str | None = Field(
        default=None, description="hmac-sha256 with the tenant's decision key, as for approvals."
    )


PROGRESS_MESSAGE_MAX_BYTES = 1_024
"""Longest message a progress event carries: progress is a gauge for people, not a log."""


class CompletionMessage(Message):
    """The end of a deferred call: the external system that took its work over (or an
    operator) says what became of it, hours later if need be.

    On topic ``completions``, keyed by run_id. ``handle`` is the completion handle the tool
    gave out (``ctx.completion_handle()``): it names the call's attempt and is signed with the
    tenant's decision key, so only a holder of the handle completes the call, and only once
    (the ledger's fencing: a second completion of the same call changes nothing).
    """

    topic = "completions"

    handle: str = Field(min_length=1, max_length=4096)
    effect: Literal["applied", "not_executed", "unknown"] = Field(
        default="applied",
        description="applied: the work was done (output is the result); not_executed: it "
        "provably was not; unknown: nobody can tell (the call is probed).",
    )
    output: str | None = Field(default=None, description="What the model is shown.")
    completed_by: str = Field(default="", max_length=256, description="Who completed it.")


class ProgressEvent(Message):
    """How far a running call has got, as its tool reported it (``ctx.report_progress``).

    On topic ``progress``, keyed by run_id; best-effort and never written to the ledger.
    ``(attempt, sequence)`` orders the events of one call: a reader shows an event only if it
    comes after the last one shown (``kernel.rules.progress``), so a duplicate is never shown
    twice and a retried attempt's events, which count from 1 again, are told apart.
    """

    topic = "progress"

    run_id: str = Field(min_length=1)
    turn_id: int = Field(ge=0)
    call_id: str = Field(min_length=1)
    tool_name: str = Field(min_length=1)
    attempt: int = Field(ge=1, description="The attempt of the call that reported it.")
    sequence: int = Field(ge=1, description="1 for an attempt's first event, then counting up.")
    done: float = Field(ge=0, allow_inf_nan=False, description="How much is done.")
    total: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="How much there is, if known."
    )
    message: str | None = Field(
        default=None,
        description=f"What the tool is doing; cut to {PROGRESS_MESSAGE_MAX_BYTES} bytes.",
    )
    kind: Literal["progress"] = "progress"
    at: float = Field(description="Unix time the tool reported it.")

    @field_validator("message")
    @classmethod
    def _bounded(cls, value: str | None) -> str | None:
        return None if value is None else cut_text(value, PROGRESS_MESSAGE_MAX_BYTES)


class DeadLetter(WireModel):
    """A message that could not be processed, with its original bytes and where it came from.

    Not a ``Message``: the bytes it carries may not even name a tenant.
    """

    schema_version: Literal[1] = 1
    tenant_id: str | None = None
    original_topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    reason: str = Field(min_length=1)
    service: str = Field(min_length=1)
    dead_lettered_at: float
    value_size: int | None = Field(
        default=None, ge=0, description="Size of the original value in bytes."
    )
    value_sha256: str | None = Field(default=None, description="sha256 of the original value.")
    value_cut: bool = Field(
        default=False,
        description="True when ``value`` holds only a prefix of the original (too big to "
        "carry whole; see value_size, value_sha256 and the overflow directory, if set).",
    )


LONG_RUNNING_SPEC_FIELDS: tuple[str, ...] = ("schedule_to_start_s", "heartbeat_timeout_s")
"""ToolSpec fields of state version 3, left out of the JSON when unset."""


class ToolSpec(WireModel):
    """A tool as a worker pool publishes it to the registry in Redis for the planner."""

    name: str = Field(min_length=1)
    namespace: str | None = None
    version: str = Field(default="1", min_length=1)
    pool: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any] = Field(description="JSON Schema of the arguments.")
    effect_class: EffectClass = "non_idempotent"
    needs_approval: Literal["never", "always", "callable"] = Field(
        default="never",
        description="callable: the worker evaluates it on the parsed arguments.",
    )
    on_unknown: Literal["report_now", "reconcile_then_report"] = "reconcile_then_report"
    timeout_s: float | None = None
    enabled: bool = True
    has_probe: bool = False
    has_compensate: bool = False
    effect_declared: bool = Field(
        default=True,
        description="False for an Agents SDK tool served unchanged whose effect class nobody "
        "declared (it keeps the SDK's behaviour: no release gate).",
    )
    sdk_tool: bool = Field(default=False, description="Served unchanged from the Agents SDK.")
    unattended_reason: str | None = Field(
        default=None, description="Why the tool runs without approval and without a probe."
    )
    definite_errors: list[str] = Field(
        default_factory=list,
        description="Exception types the tool declares definite failures (not executed).",
    )
    has_classify: bool = Field(default=False, description="The tool maps its own exceptions.")
    schedule_to_start_s: float | None = Field(
        default=None,
        gt=0,
        description="A call not started this long after its command was issued never starts "
        "(not executed). Published from state version 3; left out when None.",
    )
    heartbeat_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="A running body that sends no heartbeat for this long is cancelled (effect "
        "unknown). Published from state version 3; left out when None.",
    )

    @model_serializer(mode="wrap")
    def _leave_out_unset_long_running(self, handler: SerializerFunctionWrapHandler) -> Any:
        # A service of state version 2 refuses fields it does not know, even as null: a spec
        # without these timeouts is written exactly as version 2 wrote it.
        data = handler(self)
        if isinstance(data, dict):
            for name in LONG_RUNNING_SPEC_FIELDS:
                if data.get(name) is None:
                    data.pop(name, None)
        return data

    @property
    def lookup_key(self) -> str:
        """The name a model uses for this tool: ``namespace.name`` or ``name``."""
        return f"{self.namespace}.{self.name}" if self.namespace else self.name
