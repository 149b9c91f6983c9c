"""``examples/basic/tools.py``: a function tool returning a pydantic model, on FleetRunner as
in-process."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest
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


def script() -> ScriptedModel:
    """The model asks for Tokyo's weather, then answers with it."""
    return ScriptedModel(
        [
            [function_call("get_weather", {"city": "Tokyo"}, call_id="call-weather")],
            [assistant_message("The weather in Tokyo is sunny with wind, 14-20C.")],
        ]
    )


async def test_tools_example_runs_on_fleet_runner_as_in_process(
    *,
    example: Callable[[str], ModuleType],
    fleet: InProcessFleet,
    worker_calls: list[tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tools = example("basic/tools.py")

    async def run(runner: InProcess | OnFleet) -> Observed:
        model = tools.agent.model = script()
        return await observe(
            tools, runner, [model], tools.main, monkeypatch=monkeypatch, capsys=capsys
        )

    in_process = await run(InProcess())
    assert worker_calls == []  # the SDK's runner ran every tool body itself
    on_fleet = await run(OnFleet(fleet))

    assert in_process.stdout == (
        "[debug] get_weather called\nThe weather in Tokyo is sunny with wind, 14-20C.\n"
    )
    assert in_process.model_calls[1]["input"][-1] == {
        "call_id": "call-weather",
        "output": "city='Tokyo' temperature_range='14-20C' conditions='Sunny with wind.'",
        "type": "function_call_output",
    }
    assert_same_run(on_fleet, in_process)
    assert worker_calls == [("get_weather", "call-weather")]
