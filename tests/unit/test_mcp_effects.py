"""kernel.rules.effects: the effect class of a tool an MCP server lists (pure), and what follows
from it: the fleet's retries, the release gate and a client that retries by itself."""

from __future__ import annotations

from typing import Any

import pytest

from kernel.rules.effects import (
    fleet_retries,
    gated_by_default,
    mcp_effect_class,
    retries_blindly,
)


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({"readOnlyHint": True}, "read_only"),
        ({"readOnlyHint": True, "openWorldHint": True}, "read_only"),  # a web search
        ({"readOnlyHint": True, "destructiveHint": False}, "read_only"),
        ({"idempotentHint": True}, "idempotent"),
        ({"idempotentHint": True, "destructiveHint": False, "openWorldHint": False}, "idempotent"),
        ({"readOnlyHint": False, "idempotentHint": True}, "idempotent"),
        ({"destructiveHint": True}, "non_idempotent"),
        ({"openWorldHint": True}, "non_idempotent"),
        ({"idempotentHint": True, "destructiveHint": True}, "non_idempotent"),
        ({"idempotentHint": True, "openWorldHint": True}, "non_idempotent"),
        ({"readOnlyHint": True, "destructiveHint": True}, "non_idempotent"),  # contradiction
        ({"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False},
         "non_idempotent"),
        ({"title": "Book a trip"}, "non_idempotent"),  # annotations, but no effect hint
        ({}, "non_idempotent"),
        (None, "non_idempotent"),
    ],
)  # fmt: skip
def test_the_servers_annotations_seed_the_effect_class(
    annotations: dict[str, Any] | None, expected: str
) -> None:
    seeded = mcp_effect_class(annotations)
    assert seeded.effect_class == expected
    assert seeded.reason.endswith(expected)


def test_only_a_hint_that_is_exactly_true_counts() -> None:
    # A sloppy server's strings or numbers are not hints: nothing safe is read into them.
    assert mcp_effect_class({"readOnlyHint": "true"}).effect_class == "non_idempotent"
    assert mcp_effect_class({"idempotentHint": 1}).effect_class == "non_idempotent"
    assert mcp_effect_class({"readOnlyHint": "true"}).source == "unannotated"


def test_where_the_class_came_from_is_told() -> None:
    assert mcp_effect_class(None).source == "unannotated"
    assert mcp_effect_class({"destructiveHint": True}).source == "annotations"
    assert mcp_effect_class({"readOnlyHint": False}).source == "annotations"
    contradiction = mcp_effect_class({"readOnlyHint": True, "destructiveHint": True})
    assert "contradict" in contradiction.reason


def test_an_explicit_declaration_wins_over_the_annotations() -> None:
    read_only = {"readOnlyHint": True}
    declared = mcp_effect_class(read_only, declared="irreversible", default="read_only")
    assert (declared.effect_class, declared.source) == ("irreversible", "declared")
    # The operator's default covers every tool it did not name, annotated or not.
    default = mcp_effect_class({"destructiveHint": True}, default="idempotent")
    assert (default.effect_class, default.source) == ("idempotent", "default")
    assert mcp_effect_class(None, default="read_only").effect_class == "read_only"


@pytest.mark.parametrize(
    "annotations",
    [None, {"destructiveHint": True}, {"openWorldHint": True},
     {"idempotentHint": True, "destructiveHint": True}],
)  # fmt: skip
def test_a_tool_that_may_have_applied_something_is_never_retried_blind(
    annotations: dict[str, Any] | None,
) -> None:
    effect_class = mcp_effect_class(annotations).effect_class
    # The fleet retries nothing of it, not even a transient failure that never left...
    assert not fleet_retries("not_executed", "transient", effect_class, attempt=1, max_attempts=5)
    assert not fleet_retries("unknown", None, effect_class, attempt=1, max_attempts=5)
    # ...without a probe a person approves every call (the server declared nothing to probe)...
    assert gated_by_default(effect_class, False, unattended_reason=None, effect_declared=True)
    # ...and a client that retries any failure by itself may not serve it.
    assert retries_blindly(effect_class, client_retries=1)
    assert retries_blindly(effect_class, client_retries=-1)
    assert not retries_blindly(effect_class, client_retries=0)


@pytest.mark.parametrize("annotations", [{"readOnlyHint": True}, {"idempotentHint": True}])
def test_a_replay_safe_tool_is_retried_by_the_fleet_and_may_be_by_its_client(
    annotations: dict[str, Any],
) -> None:
    effect_class = mcp_effect_class(annotations).effect_class
    assert fleet_retries("not_executed", "transient", effect_class, attempt=1, max_attempts=5)
    assert not fleet_retries("not_executed", "transient", effect_class, attempt=5, max_attempts=5)
    assert not gated_by_default(effect_class, False, unattended_reason=None, effect_declared=True)
    assert not retries_blindly(effect_class, client_retries=3)
