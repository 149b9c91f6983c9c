"""``examples/agent_patterns/forcing_tool_use.py``: each of its three tool-use behaviours on
FleetRunner as in-process.

``main(behavior)`` makes its agent itself, so the example's ``Agent`` name is given the
scripted model as a default (the one change: which model the agent calls).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from agents import Agent
from agents.testing import ScriptedModel, assistant_message, function_call

from tests.sdk_suite.examples._differential import (
    InProcess,
    Observed,
    OnFleet,
    assert_same_run,
    observe,
)
from toolfleet.testing import InProcessFleet

pytestmark = [pytest.mark.integration, pytest.mark.agent_runtime]

PRINTED = {
    # run_llm_again: the model answers from the tool's output.
    "default": "Tokyo: sunny with wind, 14-20C.",
    # stop_on_first_tool: the tool's returned Weather is the final output, printed.
    "first_tool": "city='Tokyo' temperature_range='14-20C' conditions='Sunny with wind'",
    # custom_tool_use_behavior reads the returned Weather's fields.
    "custom": "Tokyo is Sunny with wind.",
}


def script(behavior: str) -> ScriptedModel:
    """The model calls get_weather (forced, but for ``default``); only ``default`` sends the
    tool's output back to it for an answer."""
    steps: list[Any] = [[function_call("get_weather", {"city": "Tokyo"}, call_id="call-tokyo")]]
    if behavior == "default":
        steps.append([assistant_message(PRINTED["default"])])
    return ScriptedModel(steps)


@pytest.mark.parametrize("behavior", ["default", "first_tool", "custom"])
async def test_each_tool_use_behavior_runs_on_fleet_runner_as_in_process(
    *,
    behavior: str,
    example: Callable[[str], ModuleType],
    fleet: InProcessFleet,
    worker_calls: list[tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    forcing = example("agent_patterns/forcing_tool_use.py")

    async def run(runner: InProcess | OnFleet) -> Observed:
        model = script(behavior)
        monkeypatch.setattr(forcing, "Agent", functools.partial(Agent, model=model))
        drive = lambda: forcing.main(behavior)  # noqa: E731
        return await observe(
            forcing, runner, [model], drive, monkeypatch=monkeypatch, capsys=capsys
        )

    in_process = await run(InProcess())
    assert worker_calls == []  # the SDK's runner ran every tool body itself
    on_fleet = await run(OnFleet(fleet))

    assert in_process.stdout == f"[debug] get_weather called\n{PRINTED[behavior]}\n"
    expected_choice = None if behavior == "default" else "required"
    assert [call["tool_choice"] for call in in_process.model_calls][:1] == [expected_choice]
    assert_same_run(on_fleet, in_process)
    assert worker_calls == [("get_weather", "call-tokyo")]
