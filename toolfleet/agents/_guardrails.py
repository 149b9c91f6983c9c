"""A tool guardrail's verdict from the worker as the SDK's own guardrail result.

The worker runs a function tool's input and output guardrails around its body and reports each
verdict on the call's outcome (``GuardrailVerdict``); the runner reports them where the SDK
reports the guardrails it runs in-process (``RunResult.tool_input_guardrail_results`` and
``tool_output_guardrail_results``, the RunState, a tripwire's exception), naming the
application's own guardrail object. ``output_info`` arrives as its JSON form.
"""

from __future__ import annotations

from typing import Any

from agents import FunctionTool
from agents.tool_guardrails import (
    ToolGuardrailFunctionOutput,
    ToolInputGuardrail,
    ToolInputGuardrailResult,
    ToolOutputGuardrail,
    ToolOutputGuardrailResult,
)

from schemas import GuardrailVerdict


def sdk_output(verdict: GuardrailVerdict) -> ToolGuardrailFunctionOutput:
    """The SDK's guardrail output the verdict stands for."""
    if verdict.behavior == "raise_exception":
        return ToolGuardrailFunctionOutput.raise_exception(output_info=verdict.output_info)
    if verdict.behavior in ("reject_content", "wrong_effect"):
        return ToolGuardrailFunctionOutput.reject_content(
            verdict.message or "", output_info=verdict.output_info
        )
    return ToolGuardrailFunctionOutput.allow(output_info=verdict.output_info)


def _reported(data: Any) -> ToolGuardrailFunctionOutput:
    """Stands in for a guardrail that ran on the fleet and the tool here no longer lists."""
    return ToolGuardrailFunctionOutput.allow(output_info="ran on the fleet")


def input_guardrail(
    tool: FunctionTool | None, verdict: GuardrailVerdict
) -> ToolInputGuardrail[Any]:
    """The application's input guardrail that gave ``verdict`` (a stand-in named as it if the
    tool no longer lists it)."""
    found = tool.tool_input_guardrails if tool is not None else None
    if found and verdict.index < len(found):
        return found[verdict.index]
    return ToolInputGuardrail(guardrail_function=_reported, name=verdict.name)


def output_guardrail(
    tool: FunctionTool | None, verdict: GuardrailVerdict
) -> ToolOutputGuardrail[Any]:
    """The application's output guardrail that gave ``verdict`` (or a stand-in)."""
    found = tool.tool_output_guardrails if tool is not None else None
    if found and verdict.index < len(found):
        return found[verdict.index]
    return ToolOutputGuardrail(guardrail_function=_reported, name=verdict.name)


def input_results(
    tool: FunctionTool, verdicts: list[GuardrailVerdict]
) -> list[ToolInputGuardrailResult]:
    """The SDK results of the input guardrails among ``verdicts``, in the order they ran."""
    return [
        ToolInputGuardrailResult(guardrail=input_guardrail(tool, v), output=sdk_output(v))
        for v in verdicts
        if v.kind == "input"
    ]


def output_results(
    tool: FunctionTool, verdicts: list[GuardrailVerdict]
) -> list[ToolOutputGuardrailResult]:
    """The SDK results of the output guardrails among ``verdicts``, in the order they ran."""
    return [
        ToolOutputGuardrailResult(guardrail=output_guardrail(tool, v), output=sdk_output(v))
        for v in verdicts
        if v.kind == "output"
    ]
