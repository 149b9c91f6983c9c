"""What a fleet run of an SDK agent carries between turns, and what it hands back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from agents import Agent, RunContextWrapper
from agents.exceptions import UserError
from agents.items import ModelResponse, RunItem, ToolApprovalItem, TResponseInputItem
from openai.types.responses import ResponseFunctionToolCall

from schemas import ModelResponseEvent, TurnResult


@dataclass(frozen=True)
class Decision:
    """An approval decision taken on a FleetRunState, published when the run resumes."""

    call_id: str
    tool_name: str
    """The tool's lookup key (``namespace.name`` or ``name``), as the planner keys sticky ones."""
    approve: bool
    message: str | None = None
    sticky: Literal["always_approve", "always_reject"] | None = None


@dataclass
class PendingTurn:
    """A model response whose tool calls the fleet has not finished (it was interrupted)."""

    response: ModelResponse
    calls: list[ResponseFunctionToolCall]
    """The response's function calls, in model order (duplicates included)."""
    event: ModelResponseEvent | None
    """What was submitted; None when no call had to go to the fleet."""
    local_outputs: dict[str, str]
    """Outputs decided without the fleet (tools the agent does not have), by call_id."""


@dataclass
class FleetRunState:
    """A run interrupted for approvals: decide with ``approve`` / ``reject``, then resume it
    with ``FleetRunner.run(agent, state)`` — as ``RunState`` works with ``Runner.run``."""

    run_id: str
    agent: Agent[Any]
    context_wrapper: RunContextWrapper[Any]
    original_input: str | list[TResponseInputItem]
    new_items: list[RunItem] = field(default_factory=list)
    raw_responses: list[ModelResponse] = field(default_factory=list)
    turn_results: list[TurnResult] = field(default_factory=list)
    turn_id: int = 0
    """The fleet turn of the next (or pending) model response."""
    model_calls: int = 0
    used_tools: bool = False
    """The agent has used a tool in this run (for ``reset_tool_choice``)."""
    pending: PendingTurn | None = None
    interruptions: list[ToolApprovalItem] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    """Taken since the last submission; published before the pending turn is resumed."""
    output_call_ids: set[str] = field(default_factory=set)
    """Calls whose output is already among ``new_items`` (a resumed turn repeats them)."""
    decided_by: str = "toolfleet.agents"
    """Who the published ApprovalDecisions name as their author."""

    def approve(self, approval_item: ToolApprovalItem, always_approve: bool = False) -> None:
        """Approve a pending call; ``always_approve`` approves later calls of the same tool too."""
        self._decide(approval_item, True, None, "always_approve" if always_approve else None)

    def reject(
        self,
        approval_item: ToolApprovalItem,
        always_reject: bool = False,
        *,
        rejection_message: str | None = None,
    ) -> None:
        """Reject a pending call; the model sees ``rejection_message`` or the SDK's default."""
        sticky: Literal["always_reject"] | None = "always_reject" if always_reject else None
        self._decide(approval_item, False, rejection_message, sticky)

    def _decide(
        self,
        item: ToolApprovalItem,
        approve: bool,
        message: str | None,
        sticky: Literal["always_approve", "always_reject"] | None,
    ) -> None:
        call_id = getattr(item.raw_item, "call_id", None)
        if not isinstance(call_id, str) or item not in self.interruptions:
            raise UserError("This approval item is not one of this run's pending interruptions.")
        name = item.tool_name or ""
        key = f"{item.tool_namespace}.{name}" if item.tool_namespace else name
        self.decisions = [d for d in self.decisions if d.call_id != call_id]
        self.decisions.append(Decision(call_id, key, approve, message, sticky))

    def input_list(self) -> list[TResponseInputItem]:
        """What the model is given next: the original input and everything the run added."""
        from agents.items import ItemHelpers

        items = ItemHelpers.input_to_new_input_list(self.original_input)
        items.extend(item.to_input_item() for item in self.new_items if not _approval(item))
        return items


def _approval(item: RunItem) -> bool:
    return isinstance(item, ToolApprovalItem)


@dataclass
class FleetRunResult:
    """The outcome of ``FleetRunner.run``: the SDK's ``RunResult`` fields that apply."""

    input: str | list[TResponseInputItem]
    new_items: list[RunItem]
    raw_responses: list[ModelResponse]
    final_output: Any
    """The agent's final output; None while the run waits for approvals."""
    interruptions: list[ToolApprovalItem]
    """Calls waiting for approval (``to_state()``, decide, run again)."""
    last_agent: Agent[Any]
    context_wrapper: RunContextWrapper[Any]
    run_id: str
    turn_results: list[TurnResult]
    """Every TurnResult the fleet returned, with per-call status and effect records."""
    _state: FleetRunState

    def to_input_list(self) -> list[TResponseInputItem]:
        """The original input plus the generated items, as the next run's input."""
        return self._state.input_list()

    def to_state(self) -> FleetRunState:
        """The state to approve or reject ``interruptions`` on and to resume the run from."""
        return self._state

    def final_output_as(self, cls: type[Any], raise_if_incorrect_type: bool = False) -> Any:
        """The final output, checked against ``cls`` if asked (as ``RunResult.final_output_as``)."""
        if raise_if_incorrect_type and not isinstance(self.final_output, cls):
            raise TypeError(f"Final output is not of type {cls.__name__}")
        return self.final_output
