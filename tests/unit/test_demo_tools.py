"""The demo's tools, tested as a tool author tests theirs: in-process, with ToolEnvironment."""

from __future__ import annotations

from toolfleet.app.demo import create_ticket, get_weather
from toolfleet.testing import ToolEnvironment

DEFAULT_ERROR = "An error occurred while running the tool. Please try again."


async def test_get_weather_answers_for_the_city() -> None:
    outcome = await ToolEnvironment().run(get_weather, {"city": "Lisbon"})
    assert (outcome.status, outcome.effect) == ("succeeded", "applied")
    assert outcome.output == "Lisbon: 21°C, clear"


async def test_create_ticket_runs_unattended_because_it_has_a_probe() -> None:
    env = ToolEnvironment(run_id="ticket-run")
    outcome = await env.run(create_ticket, {"title": "Umbrella shortage", "priority": 1})
    assert (outcome.status, outcome.effect) == ("succeeded", "applied")
    assert outcome.output is not None
    assert outcome.output.startswith("opened T-")
    assert "'Umbrella shortage', priority 1" in outcome.output


async def test_the_probe_finds_the_ticket_a_call_opened_and_nothing_else() -> None:
    env = ToolEnvironment(run_id="probe-run")
    opened = await env.run(create_ticket, {"title": "Lost response"}, call_id="call_a")
    assert opened.output is not None
    ticket = opened.output.split()[1]

    found = await env.probe(create_ticket, {"title": "Lost response"}, call_id="call_a")
    assert (found.state, found.output) == ("applied", f"opened {ticket}")
    never = await env.probe(create_ticket, {"title": "Never sent"}, call_id="call_b")
    assert never.state == "not_applied"


async def test_a_retry_of_the_same_call_opens_no_second_ticket() -> None:
    env = ToolEnvironment(run_id="retry-run")
    first = await env.run(create_ticket, {"title": "Once"}, call_id="call_1")
    again = await env.run(create_ticket, {"title": "Once"}, call_id="call_1", attempt=2)
    assert first.output == again.output  # same idempotency key, same ticket


async def test_invalid_arguments_are_not_executed_and_get_the_sdk_text() -> None:
    outcome = await ToolEnvironment().run(create_ticket, {"title": "x", "priority": "high"})
    assert (outcome.status, outcome.effect) == ("failed", "not_executed")
    assert outcome.output == DEFAULT_ERROR
