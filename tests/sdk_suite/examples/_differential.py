"""One example, run as written: what its runs showed, with the SDK's runner or FleetRunner.

An example calls ``Runner.run`` through the module-level name ``Runner`` it imported from
``agents``. The tests replace that name with a ``RunnerSwap`` (the SDK's runner, or a new
``FleetRunner`` for each call, as an application that serves requests makes one) that
records what each call returned or raised, so the two runs of an example differ only in the
runner. What a run ``showed`` is everything the application and the model could see: the
input of every model call (tool outputs included, in order), each run's items, final output,
interruptions, tool guardrail results and run context, what the example printed, and what it
asked the user.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from agents import Agent, Runner, RunResult
from agents.exceptions import ToolOutputGuardrailTripwireTriggered
from agents.items import RunItem, ToolApprovalItem
from agents.testing import ScriptedModel
from pydantic import BaseModel

from toolfleet import FleetClient
from toolfleet.agents import FleetRunner
from toolfleet.testing import InProcessFleet

TENANT = "sdk-examples"


def plain(value: Any) -> Any:
    """``value`` as JSON-like data, for comparing two runs (pydantic models and dataclasses
    as their fields, mappings and sequences element by element, anything else as itself)."""
    if isinstance(value, BaseModel):
        return {"<model>": type(value).__qualname__, **plain(value.model_dump(mode="json"))}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"<dataclass>": type(value).__qualname__, **fields}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def item_view(item: RunItem) -> dict[str, Any]:
    """One run item as the application sees it: its kind, its agent, what it adds to the
    conversation, and a tool output's object."""
    view: dict[str, Any] = {"kind": type(item).__name__, "agent": item.agent.name}
    if isinstance(item, ToolApprovalItem):
        view.update(tool=item.name, arguments=item.arguments, call_id=item.call_id)
        return view
    view["input_item"] = plain(item.to_input_item())
    if item.type == "tool_call_output_item":
        view["output"] = plain(item.output)
        view["output_type"] = type(item.output).__qualname__
    if item.type == "handoff_output_item":
        view["handoff"] = (item.source_agent.name, item.target_agent.name)
    return view


def outcome(result: RunResult, context: Any) -> dict[str, Any]:
    """What one ``Runner.run`` gave the application."""
    return {
        "final_output": plain(result.final_output),
        "final_output_type": type(result.final_output).__qualname__,
        "items": [item_view(i) for i in result.new_items],
        "interruptions": [
            (i.agent.name, i.name, i.arguments, i.call_id) for i in result.interruptions
        ],
        "last_agent": result.last_agent.name,
        "tool_input_guardrails": [
            (r.guardrail.get_name(), plain(r.output.behavior), plain(r.output.output_info))
            for r in result.tool_input_guardrail_results
        ],
        "tool_output_guardrails": [
            (r.guardrail.get_name(), plain(r.output.behavior), plain(r.output.output_info))
            for r in result.tool_output_guardrail_results
        ],
        "context": plain(context),
    }


def raised(exc: Exception, context: Any) -> dict[str, Any]:
    """What one ``Runner.run`` that raised gave the application."""
    seen: dict[str, Any] = {"raised": type(exc).__qualname__, "message": str(exc)}
    if isinstance(exc, ToolOutputGuardrailTripwireTriggered):
        seen["guardrail"] = exc.guardrail.get_name()
        seen["output_info"] = plain(exc.output.output_info)
    seen["context"] = plain(context)
    return seen


class RunnerSwap:
    """What an example's ``Runner`` name becomes: ``run`` as ``Runner.run`` takes it,
    recording each call's outcome (and the last agent each returned, for identity checks)."""

    def __init__(self) -> None:
        self.outcomes: list[dict[str, Any]] = []
        self.last_agents: list[Agent[Any]] = []

    async def run(self, *args: Any, **kwargs: Any) -> RunResult:
        """``Runner.run(starting_agent, input, **options)``, recorded."""
        context = kwargs.get("context")
        try:
            result = await self._run(*args, **kwargs)
        except Exception as exc:
            self.outcomes.append(raised(exc, context))
            raise
        self.outcomes.append(outcome(result, context))
        self.last_agents.append(result.last_agent)
        return result

    async def _run(self, *args: Any, **kwargs: Any) -> RunResult:
        raise NotImplementedError


class InProcess(RunnerSwap):
    """The SDK's own runner (what the example runs unchanged)."""

    async def _run(self, *args: Any, **kwargs: Any) -> RunResult:
        return await Runner.run(*args, **kwargs)


class OnFleet(RunnerSwap):
    """A new ``FleetRunner`` for every call, on ``fleet``; with ``fresh_client`` each also on
    a ``FleetClient`` of its own (a resume then shares nothing with the run it resumes but
    what the example passes it, as in another process)."""

    def __init__(self, fleet: InProcessFleet, *, fresh_client: bool = False) -> None:
        super().__init__()
        self.fleet = fleet
        self.fresh_client = fresh_client
        self.run_ids: list[str] = []

    async def _run(self, *args: Any, **kwargs: Any) -> RunResult:
        if not self.fresh_client:
            return await self._on(self.fleet.client, *args, **kwargs)
        async with FleetClient(self.fleet.settings) as client:
            return await self._on(client, *args, **kwargs)

    async def _on(self, client: FleetClient, *args: Any, **kwargs: Any) -> RunResult:
        runner = FleetRunner(client, tenant_id=TENANT)
        result = await runner.run(*args, **kwargs)
        self.run_ids.append(runner.run_id_of(result))
        return result


def model_calls(models: Iterable[ScriptedModel]) -> list[dict[str, Any]]:
    """Every call of the scripted models, in order: what the model was given."""
    return [
        {
            "instructions": call.system_instructions,
            "input": plain(call.input),
            "tools": [tool.name for tool in call.tools],
            "handoffs": [handoff.tool_name for handoff in call.handoffs],
            "tool_choice": call.model_settings.tool_choice,
        }
        for model in models
        for call in model.calls
    ]


@dataclass
class Observed:
    """What one run of an example showed."""

    model_calls: list[dict[str, Any]]
    """The input of every model call, with the tools and handoffs it was offered."""
    outcomes: list[dict[str, Any]]
    """What each ``Runner.run`` the example made returned or raised, in order."""
    stdout: str
    """What the example printed (a tool's prints included: the fleet's workers run in this
    process)."""
    prompts: list[str] = field(default_factory=list)
    """What the example asked the user (``input()``), in order."""
    error: tuple[str, str] | None = None
    """What the example's own code raised (type, message), if anything."""
    unconsumed_steps: int = 0
    """Scripted model steps left over (0: the run made every scripted model call)."""


def answers(monkeypatch: pytest.MonkeyPatch, replies: Sequence[str]) -> list[str]:
    """Answer the example's ``input()`` calls with ``replies`` in order; once they run out,
    ``input()`` raises EOFError, as it does when the user ends the input (Ctrl-D). Returns
    the list of prompts asked, which fills as they are asked."""
    prompts: list[str] = []
    left = iter(list(replies))

    def answer(prompt: Any = "") -> str:
        prompts.append(str(prompt))
        try:
            return next(left)
        except StopIteration:
            raise EOFError("no more scripted input") from None

    monkeypatch.setattr("builtins.input", answer)
    return prompts


async def observe(
    module: Any,
    runner: RunnerSwap,
    models: Sequence[ScriptedModel],
    drive: Callable[[], Awaitable[Any]],
    *,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    replies: Sequence[str] = (),
) -> Observed:
    """Run ``drive`` (the example's ``main``, or its agents driven as ``main`` drives them)
    with ``runner`` as the example's ``Runner`` and ``replies`` as the user's input."""
    with monkeypatch.context() as patch:
        patch.setattr(module, "Runner", runner)
        prompts = answers(patch, replies)
        capsys.readouterr()
        error = None
        try:
            await drive()
        except Exception as exc:
            error = (type(exc).__qualname__, str(exc))
        printed = capsys.readouterr().out
    return Observed(
        model_calls=model_calls(models),
        outcomes=runner.outcomes,
        stdout=printed,
        prompts=prompts,
        error=error,
        unconsumed_steps=sum(model.remaining_steps for model in models),
    )


def first_difference(fleet: Any, sdk: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """Where two runs' records first differ: (path, on FleetRunner, in-process), or None."""
    if isinstance(fleet, dict) and isinstance(sdk, dict):
        for key in [*sdk, *(k for k in fleet if k not in sdk)]:
            if key not in fleet or key not in sdk:
                return f"{path}.{key}", fleet.get(key, "<absent>"), sdk.get(key, "<absent>")
            found = first_difference(fleet[key], sdk[key], f"{path}.{key}")
            if found is not None:
                return found
        return None
    sequences = (list, tuple)
    if isinstance(fleet, sequences) and isinstance(sdk, sequences) and len(fleet) == len(sdk):
        for index, (theirs, ours) in enumerate(zip(fleet, sdk, strict=True)):
            found = first_difference(theirs, ours, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    return None if fleet == sdk else (path, fleet, sdk)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _same(fleet: Any, sdk: Any, where: str) -> None:
    found = first_difference(fleet, sdk)
    assert found is None, (
        f"{' '.join(filter(None, [where, found[0].lstrip('.')]))}: "
        f"on FleetRunner {_shown(found[1])}, in-process {_shown(found[2])}"
        if found is not None
        else ""
    )


def _ending(outcome: dict[str, Any]) -> str:
    if "raised" in outcome:
        return f"raised {outcome['raised']}: {outcome['message']}"
    return "returned"


def assert_same_run(on_fleet: Observed, in_process: Observed) -> None:
    """The fleet's run of an example is the SDK's, compared piece by piece so that a failure
    names the model call or ``Runner.run``, the field, and both values where they differ."""
    assert len(on_fleet.model_calls) == len(in_process.model_calls), "model calls"
    for number, (fleet_call, sdk_call) in enumerate(
        zip(on_fleet.model_calls, in_process.model_calls, strict=True), start=1
    ):
        _same(fleet_call, sdk_call, f"model call {number}")
    assert len(on_fleet.outcomes) == len(in_process.outcomes), "Runner.run calls"
    for number, (fleet_run, sdk_run) in enumerate(
        zip(on_fleet.outcomes, in_process.outcomes, strict=True), start=1
    ):
        _same(_ending(fleet_run), _ending(sdk_run), f"Runner.run {number} ended")
        _same(fleet_run, sdk_run, f"Runner.run {number}")
    assert on_fleet.stdout == in_process.stdout
    assert on_fleet.prompts == in_process.prompts
    assert on_fleet.error == in_process.error
    assert on_fleet.unconsumed_steps == in_process.unconsumed_steps == 0
