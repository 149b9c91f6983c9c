"""Deferred completion without a broker: the completion handle (signed, tamper-evident), the
``Deferred`` return value, what the runner does with it, and the outcome a completion makes."""

from __future__ import annotations

import pytest

from executors import (
    CallHooks,
    Deferred,
    GuardrailResult,
    Tool,
    ToolContext,
    ToolRegistry,
    accept_completion,
    run_call,
)
from kernel.errors import InvalidMessageError, ToolfleetError
from kernel.rules.auth import CompletionHandle, DecisionAuth
from kernel.rules.outcomes import completed
from tests.unit.test_runner import command

HANDLE = CompletionHandle("acme", "run-1", "call-1", attempt=2, fencing_token=5, pool="render")


def test_a_handle_names_its_attempt_and_only_its_tenants_key_signs_it() -> None:
    handle = HANDLE.encode(b"acme-key")
    assert CompletionHandle.verify(handle, b"acme-key") == HANDLE
    assert CompletionHandle.read(handle) == HANDLE  # unverified: to find the tenant's key
    with pytest.raises(InvalidMessageError, match="forged"):
        CompletionHandle.verify(handle, b"another-key")
    _text, _, mac = handle.partition(".")
    other = CompletionHandle("acme", "run-1", "call-1", 2, 6, "render").encode(b"x")
    with pytest.raises(InvalidMessageError, match="forged"):  # a newer token, same signature
        CompletionHandle.verify(f"{other.partition('.')[0]}.{mac}", b"acme-key")
    with pytest.raises(InvalidMessageError, match="not a completion handle"):
        CompletionHandle.read("not-a-handle")


def test_the_handle_key_is_the_tenants_decision_key() -> None:
    auth = DecisionAuth({"acme": "secret"})
    assert auth.handle_key("acme") == b"secret"
    with pytest.raises(ToolfleetError, match="no decision key for tenant 'other'"):
        auth.handle_key("other")
    assert DecisionAuth({}, enabled=False).handle_key("other")  # local development


def test_deferred_needs_a_positive_time() -> None:
    assert Deferred(complete_within_s=60).complete_within_s == 60
    for bad in (0, -1, float("inf"), True):
        with pytest.raises(ToolfleetError, match="complete_within_s"):
            Deferred(complete_within_s=bad)


async def _hands_over(ctx: ToolContext) -> Deferred:
    ctx.completion_handle()
    return Deferred(complete_within_s=60)


async def test_the_runner_hands_a_deferral_to_the_worker() -> None:
    tool = ToolRegistry().tool(name="tool", unattended="a unit test")(_hands_over)
    handed: list[Deferred] = []
    await run_call(
        tool,
        command(),
        worker_id="w",
        completion_handle=lambda: "the-handle",
        on_deferred=handed.append,
    )
    assert handed == [Deferred(complete_within_s=60)]


async def test_a_deferral_nobody_can_complete_is_an_unknown_effect() -> None:
    async def no_handle() -> Deferred:
        return Deferred(complete_within_s=60)

    tool = ToolRegistry().tool(name="tool", unattended="a unit test")(no_handle)
    outcome = await run_call(tool, command(), worker_id="w")
    assert (outcome.status, outcome.effect, outcome.resolved) == ("failed", "unknown", False)
    assert outcome.error is not None and outcome.error.type == "DeferredNotSupported"
    refused = ToolRegistry().tool(name="tool", unattended="a unit test")(_hands_over)
    outcome = await run_call(refused, command(), worker_id="w")  # no handle: the body raised
    assert outcome.status == "failed" and outcome.effect == "unknown"


def test_a_completion_is_the_calls_outcome() -> None:
    ran = command(attempt=2, fencing_token=5)
    done = completed(ran, "w2", "applied", "rendered")
    assert (done.status, done.effect, done.output, done.resolved) == (
        "succeeded", "applied", "rendered", True,
    )  # fmt: skip
    assert (done.attempt, done.fencing_token) == (2, 5)
    assert completed(ran, "w2", "not_executed", "refused").status == "failed"
    unknown = completed(ran, "w2", "unknown", None)
    assert (unknown.status, unknown.resolved) == ("failed", False)  # the reconciler's now


async def test_an_applied_completion_passes_the_tools_output_guardrails_and_hooks() -> None:
    ended: list[str] = []

    class Hooks(CallHooks):
        async def on_tool_end(self, ctx: ToolContext, tool: Tool, output: str) -> None:
            ended.append(f"{ctx.args['title']}: {output}")

    def screen(ctx: ToolContext, args: dict[str, object], output: object) -> GuardrailResult:
        if "secret" in str(output):
            return GuardrailResult.reject_content("withheld")
        return GuardrailResult.allow()

    async def render(ctx: ToolContext, title: str) -> Deferred:
        return Deferred(complete_within_s=60)

    tool = ToolRegistry().tool(name="tool", unattended="a unit test", output_guardrails=[screen])(
        render
    )
    deferred = command('{"title": "launch"}', attempt=2, fencing_token=5)
    fine = await accept_completion(
        tool, deferred, "rendered launch.mp4", worker_id="w2", hooks=Hooks()
    )
    assert (fine.status, fine.effect, fine.output, fine.attempt) == (
        "succeeded", "applied", "rendered launch.mp4", 2,
    )  # fmt: skip
    assert ended == ["launch: rendered launch.mp4"]
    withheld = await accept_completion(tool, deferred, "the secret cut", worker_id="w2")
    assert (withheld.status, withheld.effect, withheld.output) == (
        "rejected",
        "applied",
        "withheld",
    )
    assert [v.behavior for v in withheld.guardrails] == ["reject_content"]
