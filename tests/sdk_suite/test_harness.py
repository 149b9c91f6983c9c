"""Unit tests of the differential harness's own logic: selection, comparison, causes, page.

The harness itself (both runs of the SDK's suite) is ``make sdk-suite``; these check what it
concludes from its records, and that what is committed (causes.toml, selected.txt) is sound.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.sdk_suite import _causes, _report, _session
from tests.sdk_suite.__main__ import SELECTED, read_selection

DOCS = Path(__file__).resolve().parents[2] / "docs"

EXPECTATIONS = _causes.parse(
    {
        "floor": 0.5,
        "cause": [
            {
                "id": "context",
                "title": "The run's context stays with the runner",
                "documented": "agents-sdk.md#where-it-differs-deliberately",
                "tests": ["t.py::uses_context"],
            },
            {"id": "hang", "title": "Timed out", "patterns": [r"^Failed: Timeout"]},
            {
                "id": "first",
                "title": "Calls begin in the order workers take them",
                "documented": "agents-sdk.md#where-it-differs-deliberately",
                "race": True,
                "patterns": [r"^AssertionError: started"],
            },
            {
                "id": "results",
                "title": "Guardrail results stay on the worker",
                "at": ["tests/g.py:12"],
                "patterns": [r"^AssertionError: assert \[\] == "],
            },
        ],
    }
)


def line(nodeid: str, outcome: str = "passed", **fields: Any) -> dict[str, Any]:
    return {"nodeid": nodeid, "outcome": outcome, "runner": 1, **fields}


def records(*lines: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["nodeid"]: entry for entry in lines}


def test_a_failure_gets_the_cause_that_lists_it_then_the_first_pattern_that_matches() -> None:
    assert EXPECTATIONS.classify(line("t.py::uses_context", "failed")).id == "context"
    hung = line("t.py::other", "failed", exc_type="Failed", exc_message="Timeout (>60.0s)")
    assert EXPECTATIONS.classify(hung).id == "hang"
    odd = line("t.py::odd", "failed", exc_type="AssertionError", exc_message="1 != 2")
    assert EXPECTATIONS.classify(odd) is _causes.UNKNOWN


def test_a_cause_by_line_needs_the_line_and_its_pattern_and_names_cover_parameters() -> None:
    empty = {"exc_type": "AssertionError", "exc_message": "assert [] == ['x']"}
    assert EXPECTATIONS.classify(
        line("g.py::t", "failed", crash_at="tests/g.py:12", **empty)
    ).id == ("results")
    elsewhere = line("g.py::t", "failed", crash_at="tests/g.py:13", **empty)
    assert EXPECTATIONS.classify(elsewhere) is _causes.UNKNOWN
    other = line("g.py::t", "failed", crash_at="tests/g.py:12", exc_type="KeyError")
    assert EXPECTATIONS.classify(other) is _causes.UNKNOWN
    parametrized = line("t.py::uses_context[a-b]", "failed", exc_type="KeyError")
    assert EXPECTATIONS.classify(parametrized).id == "context"


def test_a_failure_that_passes_when_run_again_is_intermittent_and_still_a_failure() -> None:
    in_process = records(line("t.py::a"), line("t.py::b"))
    fleet = records(
        line("t.py::a", "failed", exc_type="Failed", exc_message="Timeout (>60.0s)"),
        line("t.py::b", "failed", exc_type="Failed", exc_message="Timeout (>60.0s)"),
    )
    rerun = records(line("t.py::a"), line("t.py::b", "failed", exc_type="Failed"))
    figures = _report.compare(list(in_process), in_process, fleet, EXPECTATIONS, rerun=rerun)
    assert figures.failed == {"t.py::a": _causes.INTERMITTENT, "t.py::b": EXPECTATIONS.causes[1]}
    assert figures.passed == []


def test_a_documented_race_that_passes_when_run_again_stays_under_its_cause() -> None:
    in_process = records(line("t.py::order"))
    fleet = records(line("t.py::order", "failed", exc_type="AssertionError", exc_message="started"))
    figures = _report.compare(
        list(in_process), in_process, fleet, EXPECTATIONS, rerun=records(line("t.py::order"))
    )
    assert figures.failed == {"t.py::order": EXPECTATIONS.causes[2]}


def test_the_share_counts_only_tests_that_called_the_runner_and_passed_in_process() -> None:
    selected = ["t.py::a", "t.py::b", "t.py::uses_context", "t.py::gone", "t.py::broke"]
    in_process = records(
        line("t.py::a", tool_invocations=1),
        line("t.py::b"),
        line("t.py::uses_context"),
        line("t.py::broke", "failed"),
    )
    fleet = records(
        line("t.py::a", worker_starts=1),
        line("t.py::b", "failed", exc_type="AssertionError", exc_message="x"),
        line("t.py::uses_context", "failed", exc_type="AttributeError", exc_message="seat"),
    )
    figures = _report.compare(selected, in_process, fleet, EXPECTATIONS)
    assert figures.baseline == ["t.py::a", "t.py::b", "t.py::uses_context"]
    assert figures.drift == {"t.py::gone": "not collected", "t.py::broke": "failed in-process"}
    assert figures.passed == ["t.py::a"]
    assert figures.rate == pytest.approx(1 / 3)
    assert {n: c.id for n, c in figures.failed.items()} == {
        "t.py::b": "unknown",
        "t.py::uses_context": "context",
    }
    assert figures.count(documented=True) == 1
    assert figures.count(documented=False) == 1
    assert figures.unchecked == []
    assert figures.with_tools == ["t.py::a"]
    assert figures.passed_with_tools == 1


def test_a_test_missing_from_the_fleet_record_failed_and_a_silent_pass_is_flagged() -> None:
    in_process = records(line("t.py::a", tool_invocations=2), line("t.py::b"))
    fleet = records(line("t.py::a", worker_starts=0))  # b: the fleet session died before it
    figures = _report.compare(["t.py::a", "t.py::b"], in_process, fleet, EXPECTATIONS)
    assert figures.unchecked == ["t.py::a"]
    assert list(figures.failed) == ["t.py::b"]
    assert figures.failures["t.py::b"]["outcome"] == "not run"


def test_the_page_states_the_figures_and_lists_every_failure_under_its_cause() -> None:
    in_process = records(line("t.py::a"), line("t.py::uses_context"), line("t.py::x[a|b]"))
    fleet = records(
        line("t.py::a"),
        line("t.py::uses_context", "failed", exc_type="KeyError", exc_message="'seat'"),
        line("t.py::x[a|b]", "failed", exc_type="AssertionError", exc_message="`1` != 2\nmore"),
    )
    figures = _report.compare(list(in_process), in_process, fleet, EXPECTATIONS)
    meta = {"sdk_version": "0.24.0", "sdk_sha256": "ab", "date": "d", "commit": "c",
            "in_process_s": "1", "fleet_s": "2", "rerun_s": "3"}  # fmt: skip
    page = _report.render(figures, EXPECTATIONS, meta)
    assert "| **pass on FleetRunner** | **1** (33.3%) |" in page
    assert "| fail on a documented deviation | 1 |" in page
    assert "- `t.py::uses_context`: `KeyError: 'seat'`" in page
    assert "- `t.py::x[a|b]`: `AssertionError: '1' != 2`" in page  # one line, no backtick
    assert page.index("### The run's context stays") < page.index("### Not explained yet")


def test_cause_ids_are_unique() -> None:
    data = {"floor": 0, "cause": [{"id": "a", "title": "A"}, {"id": "a", "title": "B"}]}
    with pytest.raises(ValueError, match="used twice"):
        _causes.parse(data)
    with pytest.raises(ValueError, match="reserved"):
        _causes.parse({"floor": 0, "cause": [{"id": "intermittent", "title": "I"}]})


def _anchors(page: Path) -> set[str]:
    """The anchors MkDocs' toc extension gives a page's headings."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\s-]", "", heading.lower()).strip()
        found.add(re.sub(r"[-\s]+", "-", slug))
    return found


def test_every_documented_cause_points_at_a_heading_under_docs() -> None:
    for cause in _causes.load().causes:
        if not cause.documented:
            continue
        page, _, anchor = cause.documented.partition("#")
        assert (DOCS / page).is_file(), f"{cause.id}: no page docs/{page}"
        assert anchor in _anchors(DOCS / page), f"{cause.id}: no heading #{anchor} in {page}"


def test_the_committed_selection_names_each_test_once() -> None:
    selected = read_selection(SELECTED)
    assert selected, "selected.txt is empty: run python -m tests.sdk_suite select"
    assert len(selected) == len(set(selected))
    assert all(n.startswith("tests/") and "::" in n for n in selected)


FAKE_PYTEST = """\
import json, os, sys
wanted = open(os.environ["SDK_SUITE_SELECTION"]).read().split()
record = os.environ["SDK_SUITE_REPORT"]
if not os.environ.get("SDK_SUITE_APPEND"):
    open(record, "w").close()
with open(record, "a") as out:
    for nodeid in wanted:
        out.write(json.dumps({"nodeid": nodeid, "outcome": "crashed"}) + "\\n")
        out.flush()
        if nodeid.endswith("::dies"):
            sys.exit(3)
        out.write(json.dumps({"nodeid": nodeid, "outcome": "passed"}) + "\\n")
"""


def test_a_session_that_dies_goes_on_with_the_tests_it_did_not_run(tmp_path: Path) -> None:
    """The record plugin's contract, played by a stand-in for pytest: the test that was
    running stays "crashed", the tests after it run in a new session."""
    python = tmp_path / "python"
    python.write_text(f"#!{sys.executable}\n{FAKE_PYTEST}")
    python.chmod(0o755)
    selection = tmp_path / "selection.txt"
    selection.write_text("t.py::a\nt.py::dies\nt.py::c\n")
    session = _session.run(
        str(python), tmp_path, tmp_path / "record.jsonl", fleet=True, paths=["t.py"],
        selection=selection,
    )  # fmt: skip
    outcomes = {n: entry["outcome"] for n, entry in session.tests.items()}
    assert outcomes == {"t.py::a": "passed", "t.py::dies": "crashed", "t.py::c": "passed"}
    assert session.returncode == 0
    assert "the session died (exit 3); 1 tests go on" in session.log.read_text()
