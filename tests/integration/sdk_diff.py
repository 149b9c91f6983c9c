"""What the differential suites share: scripted conversations, what a run showed the model,
and how a run is driven through its approvals (``test_sdk_differential``, ``test_sdk_agents``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents.items import ToolApprovalItem
from agents.testing import ScriptedModel, assistant_message, function_call
from redis.asyncio import Redis

from tests.integration import sdk_tools as t
from toolfleet.agents import FleetTurnError


class Script:
    """A scripted model conversation with call ids unique to one scenario."""

    def __init__(self) -> None:
        self.prefix = uuid.uuid4().hex[:12]
        self.turns: list[list[Any]] = []

    def id(self, name: str) -> str:
        """The full call id of the call named ``name`` in this scenario ("" stays empty)."""
        return f"{self.prefix}-{name}" if name else ""

    def call(self, name: str, tool: str, arguments: str | dict[str, Any]) -> Any:
        return function_call(tool, arguments, call_id=self.id(name))

    def turn(self, *items: Any) -> Script:
        self.turns.append(list(items))
        return self

    def answer(self, text: str = "done") -> Script:
        return self.turn(assistant_message(text))

    def model(self) -> ScriptedModel:
        return ScriptedModel(self.turns)


Decide = Callable[[Any, Sequence[ToolApprovalItem]], None]
"""Approves or rejects the interruptions on a RunState (the SDK's, in-process and on the fleet)."""


@dataclass
class Seen:
    """Everything model-visible about one run."""

    model_inputs: list[Any] = field(default_factory=list)
    """The input of every model call: the conversation, every tool output included."""
    interruptions: list[tuple[str, str, str]] = field(default_factory=list)
    error: tuple[str, str] | None = None
    final_output: Any = None
    items: list[Any] = field(default_factory=list)
    """The run's new items as input items (approval items as (tool, call_id))."""

    def outputs(self) -> list[tuple[str, str]]:
        """(call_id, output) of every function_call_output the model was last given."""
        last = self.model_inputs[-1] if self.model_inputs else []
        return [
            (i["call_id"], i["output"])
            for i in last
            if isinstance(i, dict) and i.get("type") == "function_call_output"
        ]


def normalised(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def items_of(items: Sequence[Any]) -> list[Any]:
    return [
        ("approval", i.tool_name, i.raw_item.call_id)
        if isinstance(i, ToolApprovalItem)
        else normalised(i.to_input_item())
        for i in items
    ]


async def drive(
    start: Callable[[Any], Awaitable[Any]], model: ScriptedModel, decisions: Sequence[Decide]
) -> Seen:
    seen = Seen()
    try:
        result = await start(None)
        for decide in decisions:
            if not result.interruptions:
                break
            state = result.to_state()
            decide(state, result.interruptions)
            result = await start(state)
    except FleetTurnError as exc:  # a remote failure without an SDK class: its class name
        seen.error = (exc.type, str(exc))
    except Exception as exc:  # the run error is part of what is compared
        seen.error = (type(exc).__name__, str(exc))
    else:
        seen.interruptions = [
            (i.tool_name or "", i.raw_item.call_id, i.arguments or "") for i in result.interruptions
        ]
        seen.final_output = result.final_output
        seen.items = items_of(result.new_items)
    seen.model_inputs = [normalised(call.input) for call in model.calls]
    return seen


def assert_same(sdk: Seen, on_fleet: Seen) -> None:
    assert on_fleet.error == sdk.error
    assert on_fleet.interruptions == sdk.interruptions
    assert on_fleet.model_inputs == sdk.model_inputs
    assert on_fleet.final_output == sdk.final_output


def approve_all(always: bool = False) -> Decide:
    def decide(state: Any, items: Sequence[ToolApprovalItem]) -> None:
        for item in items:
            state.approve(item, always_approve=always)

    return decide


def reject_all(message: str | None = None, always: bool = False) -> Decide:
    def decide(state: Any, items: Sequence[ToolApprovalItem]) -> None:
        for item in items:
            state.reject(item, always_reject=always, rejection_message=message)

    return decide


async def runs(redis: Redis, where: str, call_id: str) -> int:
    return int(await redis.get(t.runs_key(where, call_id)) or 0)
