"""``examples/agent_patterns/human_in_the_loop.py``: the SDK's own approval flow on FleetRunner
as in-process.

main() runs the agent, and while the run is interrupted it serialises the state to a file,
reads it back with ``RunState.from_json(agent, ...)`` (the application's agent), asks the user
about each interruption, approves or rejects, and resumes with ``Runner.run(agent, state)``.
On the fleet each of those ``Runner.run`` calls is a new FleetRunner on a FleetClient of its
own: the resume shares nothing with the run it resumes but the state the file carried, as in
another process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from agents import RunState
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

PROMPT = "\nDo you approve this tool call? (y/n): "


def script(rounds: int) -> ScriptedModel:
    """The model asks for Oakland's weather and temperature (the temperature needs approval),
    asks for the temperature again in each further round, then answers."""
    steps: list[Any] = [
        [
            function_call("get_weather", {"city": "Oakland"}, call_id="call-weather"),
            function_call("get_temperature", {"city": "Oakland"}, call_id="call-temp-1"),
        ]
    ]
    for number in range(2, rounds + 1):
        steps.append(
            [function_call("get_temperature", {"city": "Oakland"}, call_id=f"call-temp-{number}")]
        )
    steps.append([assistant_message("Oakland is sunny; the temperature is as the tool said.")])
    return ScriptedModel(steps)


@pytest.mark.parametrize(
    "replies", [["y"], ["n"], ["y", "n"]], ids=["approve", "reject", "approve-then-reject"]
)
async def test_human_in_the_loop_example_runs_on_fleet_runner_as_in_process(
    *,
    replies: list[str],
    example: Callable[[str], ModuleType],
    fleet: InProcessFleet,
    worker_calls: list[tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    hitl = example("agent_patterns/human_in_the_loop.py")

    async def run(runner: InProcess | OnFleet, where: str) -> Observed:
        # main() writes its state file under the working directory.
        (tmp_path / where).mkdir()
        monkeypatch.chdir(tmp_path / where)
        model = hitl.agent.model = script(len(replies))
        return await observe(
            hitl, runner, [model], hitl.main,
            monkeypatch=monkeypatch, capsys=capsys, replies=replies,
        )  # fmt: skip

    in_process = await run(InProcess(), "in-process")
    assert worker_calls == []  # the SDK's runner ran every tool body itself
    on_fleet = await run(OnFleet(fleet, fresh_client=True), "fleet")

    assert in_process.prompts == [PROMPT] * len(replies)
    assert in_process.outcomes[0]["interruptions"] == [
        ("Weather Assistant", "get_temperature", '{"city":"Oakland"}', "call-temp-1")
    ]
    assert len(in_process.outcomes) == len(replies) + 1
    assert in_process.stdout.count("✓ Approved: get_temperature") == replies.count("y")
    assert in_process.stdout.count("✗ Rejected: get_temperature") == replies.count("n")
    outputs = [i["output"] for i in in_process.model_calls[-1]["input"] if "output" in i]
    assert outputs[1] == (
        "The temperature in Oakland is 20° Celsius"
        if replies[0] == "y"
        else "Tool execution was not approved."
    )
    assert_same_run(on_fleet, in_process)
    approved = [f"call-temp-{n}" for n, reply in enumerate(replies, start=1) if reply == "y"]
    assert worker_calls == [
        ("get_weather", "call-weather"),
        *(("get_temperature", call_id) for call_id in approved),
    ]


def state_script() -> ScriptedModel:
    """One approval round: the temperature call waits, then the model answers."""
    return script(1)


async def _from_string(runner: InProcess | OnFleet, agent: Any, decide: Sequence[bool]) -> None:
    """main()'s flow with the state carried as a string (``RunState.to_string`` /
    ``from_string``) instead of a JSON file."""
    result = await runner.run(agent, "What is the weather and temperature in Oakland?")
    for approve in decide:
        text = result.to_state().to_string()
        state = await RunState.from_string(agent, text)
        for interruption in result.interruptions:
            if approve:
                state.approve(interruption)
            else:
                state.reject(interruption)
        result = await runner.run(agent, state)
    assert not result.interruptions


@pytest.mark.parametrize("approve", [True, False], ids=["approve", "reject"])
async def test_a_state_restored_from_a_string_resumes_on_fleet_runner_as_in_process(
    *,
    approve: bool,
    example: Callable[[str], ModuleType],
    fleet: InProcessFleet,
    worker_calls: list[tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The example's agent driven as main() drives it, the state restored with
    ``RunState.from_string`` in a fresh FleetRunner on a client of its own."""
    hitl = example("agent_patterns/human_in_the_loop.py")

    async def run(runner: InProcess | OnFleet) -> Observed:
        model = hitl.agent.model = state_script()
        drive = lambda: _from_string(runner, hitl.agent, [approve])  # noqa: E731
        return await observe(hitl, runner, [model], drive, monkeypatch=monkeypatch, capsys=capsys)

    in_process = await run(InProcess())
    assert worker_calls == []  # the SDK's runner ran every tool body itself
    on_fleet = await run(OnFleet(fleet, fresh_client=True))

    assert in_process.error is None
    assert len(in_process.outcomes) == 2
    assert_same_run(on_fleet, in_process)
    assert worker_calls == [("get_weather", "call-weather")] + (
        [("get_temperature", "call-temp-1")] if approve else []
    )
