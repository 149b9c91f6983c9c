"""What an approval policy may judge: the call's arguments, only when they are certain.

A tool's ``needs_approval`` callable decides on the call's arguments. Arguments it cannot read
for certain (empty text, not JSON, a JSON value that is not an object, the non-standard
constants ``NaN`` and ``Infinity``) make the call wait for a person instead: the policy fails
closed, as the Agents SDK's does (lifecycle item 5). The planner asks this before it sends a
call (a call whose arguments fail it is interrupted at once) and the worker asks it again,
with the tool's own schema on top (``Tool.parse_arguments_for_approval``).
"""

from __future__ import annotations

import json
from typing import Any


def approval_arguments(arguments: str) -> dict[str, Any] | None:
    """The arguments as a JSON object an approval policy may judge, or None: approval needed.

    The same reading as the SDK's ``parse_function_tool_arguments`` (0.24); JSON nested
    deeper than the parser goes is not certain either.
    """
    if not arguments.strip():
        return None
    try:
        parsed = json.loads(arguments, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None


def _refuse_constant(value: str) -> Any:
    raise ValueError(f"non-standard JSON constant {value}")
