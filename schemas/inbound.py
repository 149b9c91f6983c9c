"""Messages that enter toolfleet: model responses, approval decisions, cancellations."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from schemas._base import Message, WireModel


class FunctionCallItem(WireModel):
    """A function call in the OpenAI Responses API item shape.

    ``call_id`` may be empty on the wire: the planner, not the decoder, turns that into the
    SDK's turn error, so the whole response is judged before any side effect.
    """

    model_config = WireModel.model_config | {"extra": "allow"}

    type: Literal["function_call"] = "function_call"
    call_id: str = Field(description="The model's id for this call; outputs refer to it.")
    name: str = Field(min_length=1, description="Tool name as the model wrote it.")
    arguments: str = Field(description="JSON-encoded arguments, exactly as the model wrote them.")
    namespace: str | None = Field(default=None, description="Tool namespace, if any.")


def _item_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "function_call" if kind == "function_call" else "other"


ResponseItem = Annotated[
    Annotated[FunctionCallItem, Tag("function_call")] | Annotated[dict[str, Any], Tag("other")],
    Discriminator(_item_kind),
]
"""A model output item: function calls are parsed, every other item type is carried as is."""


class TurnConfig(WireModel):
    """How one turn's tool calls are executed (the SDK's run and tool-execution config)."""

    max_concurrency: int | None = Field(
        default=None,
        ge=1,
        description="At most this many calls of the turn in flight; None runs all at once.",
    )
    failure_policy: Literal["error_as_output", "fail_turn"] = Field(
        default="error_as_output",
        description="error_as_output: a failed call's error text becomes its output; "
        "fail_turn: the first failure fails the turn and queued calls never start.",
    )
    tool_not_found: Literal["raise_error", "return_error_to_model"] = Field(
        default="raise_error",
        description="raise_error fails the turn; return_error_to_model outputs "
        "\"Tool '{name}' not found.\"",
    )
    pre_approval_guardrails: bool = Field(
        default=False,
        description="Also run input guardrails before asking for approval.",
    )
    deadline_s: float | None = Field(
        default=None, gt=0, description="Wall-clock budget for the whole turn, in seconds."
    )
    reset_tool_choice: bool = Field(
        default=True,
        description="After a turn that used a tool, tell the runtime to reset tool_choice.",
    )


class AgentRef(WireModel):
    """The agent that produced a model response."""

    name: str = Field(min_length=1)


class RunContextCopy(WireModel):
    """What an agent run's tools see of the run on a worker: a copy of its context.

    An agent runtime sends it with a response's calls (FleetRunner sends the Agents SDK's
    ``RunContextWrapper.context``); the planner hands it to each command it dispatches from
    that response, and the worker rebuilds the copy the tool is given. It is payload, never
    identity: no fingerprint, dedupe or ledger entry depends on it.
    """

    agent: str | None = Field(
        default=None, description="The name of the agent whose model made the calls."
    )
    value: str | None = Field(
        default=None,
        description="The context as JSON text; None: the runtime could not copy it (the tool "
        "then sees the worker's own ToolContext as the run's context).",
    )
    type: str | None = Field(
        default=None,
        description="`module:qualname` of the context's class (a dataclass or pydantic "
        "model): the worker rebuilds it as that class when it has its module imported and the "
        "tool declares no context type of its own.",
    )
    tool_input: str | None = Field(
        default=None,
        description="The run's tool input (an agent used as a tool: its structured input) as "
        "JSON text.",
    )


class ModelResponseEvent(Message):
    """One model response whose function calls toolfleet must execute.

    A Chat Completions ``tool_calls`` list is accepted in place of (or beside) ``items``
    and normalised into function_call items appended after them.
    """

    topic = "model-responses"

    run_id: str = Field(min_length=1)
    turn_id: int = Field(ge=0)
    agent: AgentRef
    response_id: str = Field(min_length=1)
    items: list[ResponseItem] = Field(default_factory=list, description="In model order.")
    config: TurnConfig = Field(default_factory=TurnConfig)
    resume: bool = Field(
        default=False,
        description="The turn is being resumed after approvals: its calls are not rediscovered.",
    )
    decisions: list[ApprovalDecision] | None = Field(
        default=None,
        description="Signed decisions on calls of this response, travelling with the calls "
        "they decide: applied before the response is planned, a person's as if it had "
        "arrived on `approvals` first. An agent runtime that asks its own approval questions "
        "(FleetRunner) sends one for every call it sends.",
    )
    run_context: RunContextCopy | None = Field(
        default=None,
        description="The agent run's context, copied for the tools of these calls (never part "
        "of a call's identity).",
    )

    @model_validator(mode="before")
    @classmethod
    def _normalise_chat_completions(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "tool_calls" not in data:
            return data
        data = dict(data)
        tool_calls = data.pop("tool_calls") or []
        if not isinstance(tool_calls, list):
            raise ValueError("tool_calls must be a list of Chat Completions tool calls")
        items = list(data.get("items") or [])
        for position, call in enumerate(tool_calls):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                raise ValueError(
                    f"tool_calls[{position}] must look like "
                    '{"id": ..., "type": "function", "function": {"name": ..., "arguments": ...}}'
                )
            items.append(
                {
                    "type": "function_call",
                    "call_id": call.get("id", ""),
                    "name": function.get("name", ""),
                    "arguments": function.get("arguments", ""),
                }
            )
        data["items"] = items
        return data

    @property
    def function_calls(self) -> list[FunctionCallItem]:
        """The function calls of the response, in model order."""
        return [item for item in self.items if isinstance(item, FunctionCallItem)]


SIGNATURE_DOC = (
    "hmac-sha256:<hex> over the canonical JSON of the message without this field, with the "
    "tenant's decision key (docs/architecture.md, Who may decide); required unless decision "
    "auth is off."
)


class ApprovalDecision(Message):
    """An operator's or UI's decision on a call that waits for approval."""

    topic = "approvals"

    run_id: str = Field(min_length=1)
    call_id: str = Field(min_length=1)
    tool_name: str = Field(min_length=1)
    approve: bool
    message: str | None = Field(default=None, description="Shown to the model on rejection.")
    sticky: Literal["always_approve", "always_reject"] | None = Field(
        default=None, description="Apply this decision to every later call of the same tool."
    )
    decided_by: str = Field(min_length=1)
    by_policy: bool | None = Field(
        default=None,
        description="True: no person decided. The agent runtime evaluated the tool's own "
        "approval policy (its needs_approval) for this call, and it asked for no approval. "
        "Valid only approving, inside a ModelResponseEvent's decisions: the call is "
        "dispatched without the worker evaluating the policy again, unless the fleet itself "
        "wants a person (the tool's approval is `always`, or the run is held).",
    )
    signature: str | None = Field(default=None, description=SIGNATURE_DOC)


ModelResponseEvent.model_rebuild()  # its decisions are ApprovalDecisions, defined after it


class CancelRequest(Message):
    """Cancel a whole run (no call_id: parent cancellation) or one call (tool-local)."""

    topic = "cancellations"

    run_id: str = Field(min_length=1)
    call_id: str | None = Field(default=None, min_length=1)
    reason: str = Field(min_length=1)
    decided_by: str | None = Field(default=None, description="Who cancels (kept in the logs).")
    signature: str | None = Field(default=None, description=SIGNATURE_DOC)
