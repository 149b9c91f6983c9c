"""The figures of a differential run and the page that records them (docs/sdk-suite.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.sdk_suite._causes import INTERMITTENT, UNKNOWN, Cause, Expectations

Record = Mapping[str, Mapping[str, Any]]


@dataclass
class Figures:
    """What the in-process and fleet runs of the selected tests came to."""

    selected: list[str]
    baseline: list[str] = field(default_factory=list)
    """Selected tests that called the runner and passed in-process in this run."""
    drift: dict[str, str] = field(default_factory=dict)
    """Selected tests that did not (node id: what happened instead)."""
    passed: list[str] = field(default_factory=list)
    """Baseline tests that passed on FleetRunner."""
    failed: dict[str, Cause] = field(default_factory=dict)
    """Baseline tests that did not, with their cause."""
    failures: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    """Their fleet record lines."""
    with_tools: list[str] = field(default_factory=list)
    """Baseline tests whose in-process run invoked at least one function tool (an agent used
    as a tool aside): the ones where the fleet runs something."""
    unchecked: list[str] = field(default_factory=list)
    """Passed on FleetRunner though the in-process run invoked function tools and no worker
    started one: worth a look (a tool body may have run outside the fleet)."""

    @property
    def passed_with_tools(self) -> int:
        """How many of ``with_tools`` passed on FleetRunner."""
        return len(set(self.with_tools) & set(self.passed))

    @property
    def rate(self) -> float:
        """The share of the in-process passes that pass on FleetRunner."""
        return len(self.passed) / len(self.baseline) if self.baseline else 0.0

    def by_cause(self) -> list[tuple[Cause, list[str]]]:
        """Failures grouped by cause, largest group first (unknown causes last)."""
        groups: dict[str, tuple[Cause, list[str]]] = {}
        for nodeid, cause in self.failed.items():
            groups.setdefault(cause.id, (cause, []))[1].append(nodeid)
        last = (INTERMITTENT.id, UNKNOWN.id)
        return sorted(groups.values(), key=lambda g: (g[0].id in last, -len(g[1]), g[0].id))

    def count(self, *, documented: bool | None = None, inexpressible: bool = False) -> int:
        """How many failures have a documented cause (True), an undocumented one (False), or
        any (None); with ``inexpressible``, only those the fleet could not run at all."""
        return sum(
            1
            for cause in self.failed.values()
            if (documented is None or bool(cause.documented) == documented)
            and (not inexpressible or cause.inexpressible)
        )


def compare(
    selected: Sequence[str],
    in_process: Record,
    fleet: Record,
    expectations: Expectations,
    rerun: Record | None = None,
) -> Figures:
    """The figures of one differential run: ``in_process`` and ``fleet`` are the two record
    files' lines by node id; ``rerun``, the fleet failures run again on a fresh fleet (a
    failure that passed there is ``INTERMITTENT``, and still a failure)."""
    figures = Figures(selected=list(selected))
    for nodeid in selected:
        mine = in_process.get(nodeid)
        if mine is None:
            figures.drift[nodeid] = "not collected"
            continue
        if mine["outcome"] != "passed":
            figures.drift[nodeid] = f"{mine['outcome']} in-process"
            continue
        if not mine.get("runner"):
            figures.drift[nodeid] = "no longer calls the runner"
            continue
        figures.baseline.append(nodeid)
        if mine.get("tool_invocations"):
            figures.with_tools.append(nodeid)
        theirs = fleet.get(nodeid)
        if theirs is None:
            theirs = {"nodeid": nodeid, "outcome": "not run", "exc_type": "NotRun"}
        if theirs["outcome"] == "passed":
            figures.passed.append(nodeid)
            if mine.get("tool_invocations") and theirs.get("worker_starts", 0) == 0:
                figures.unchecked.append(nodeid)
        else:
            again = (rerun or {}).get(nodeid)
            passed_again = again is not None and again["outcome"] == "passed"
            cause = expectations.classify(theirs)
            intermittent = passed_again and not (cause.race and cause.documented)
            figures.failed[nodeid] = INTERMITTENT if intermittent else cause
            figures.failures[nodeid] = theirs
    return figures


def _percent(share: float) -> str:
    return f"{100 * share:.1f}%"


def _code(text: str) -> str:
    return "`" + text.replace("`", "'") + "`"


def _why(entry: Mapping[str, Any]) -> str:
    """A failure in one line: its exception and the first line of its message."""
    kind = entry.get("exc_type") or entry.get("outcome", "")
    message = str(entry.get("exc_message") or entry.get("crash") or "").strip()
    message = message.splitlines()[0] if message else ""
    if len(message) > 160:
        message = message[:157] + "..."
    return f"{kind}: {message}" if message else str(kind)


def _examples(record: Record, meta: Mapping[str, str]) -> list[str]:
    """The page's section on the SDK's examples (tests/sdk_suite/examples/)."""
    lines = [
        "",
        "## The SDK's examples",
        "",
        "`tests/sdk_suite/examples/` runs examples of the same sdist as written",
        "(`customer_service/main.py`, `agent_patterns/human_in_the_loop.py`,",
        "`agent_patterns/forcing_tool_use.py` with each tool-use behaviour, `basic/tools.py`,",
        "`basic/tool_guardrails.py`), only the model replaced by a scripted one and `input()`",
        "answered, with the SDK's runner and with a FleetRunner on the same fleet, and compares",
        "the two runs: every model call's input, each `Runner.run`'s items, final output,",
        "interruptions, tool guardrail results and run context, what the example printed and",
        "asked, and which tool bodies the fleet's workers ran (`python -m tests.sdk_suite",
        "examples` runs only them).",
        "",
    ]
    if not record:
        return [*lines, "Not run with the last run of the suite."]
    same = [n for n, entry in record.items() if entry["outcome"] == "passed"]
    lines += [
        f"Last run ({meta.get('examples_s', '?')} s): {len(same)} of {len(record)} runs the same"
        " on FleetRunner as in-process.",
        "",
        "| example run | on FleetRunner |",
        "|---|---|",
    ]
    for nodeid, entry in sorted(record.items()):
        name = nodeid.removeprefix("tests/sdk_suite/examples/")
        verdict = "the same" if entry["outcome"] == "passed" else _code(_why(entry))
        lines.append(f"| {_code(name)} | {verdict} |")
    return lines


def render(
    figures: Figures,
    expectations: Expectations,
    meta: Mapping[str, str],
    *,
    examples: Record | None = None,
) -> str:
    """docs/sdk-suite.md: how the harness works, the last run's figures, every failure, and
    the SDK's examples (their last record, when given)."""
    baseline = len(figures.baseline)
    failed = len(figures.failed)
    lines = [
        "# The Agents SDK's own tests on FleetRunner",
        "",
        "<!-- Written by `make sdk-suite` (tests/sdk_suite/); edit the harness, not this page. -->",
        "",
        "toolfleet's promise to an Agents SDK application is that `FleetRunner` is the SDK's",
        "runner. This page measures it with a suite nobody on this project wrote: the tests of",
        f"openai-agents {meta['sdk_version']} (its PyPI sdist, sha256 `{meta['sdk_sha256']}`)",
        "that call `agents.Runner.run`, `run_streamed` or `run_sync` and pass in-process. Each",
        "runs twice: with the SDK's runner, then with those three calls routed to a",
        "`FleetRunner` (a new one per test, as an application makes one) on a",
        "`toolfleet.testing.InProcessFleet` that serves the tools each test defines, against the",
        "real Kafka broker and Redis. Only the runner differs between the two runs.",
        "",
        "```sh",
        "make sdk-suite   # both runs, this page, and a failure if the share drops below the floor",
        "```",
        "",
        "`tests/sdk_suite/selected.txt` lists the tests (`python -m tests.sdk_suite select`",
        "rebuilds it from a whole run of the suite); `tests/sdk_suite/causes.toml` maps a",
        "failure to its cause and, where it is a deliberate difference, to the page that",
        "documents it ([Moving an Agents SDK agent](agents-sdk.md#where-it-differs-deliberately)).",
        "",
        "## Where the harness itself differs",
        "",
        "- Both runs put every async test on one event loop (pytest-asyncio's",
        "  `asyncio_default_test_loop_scope=session`; the SDK's own setting is a loop per test):",
        "  the fleet's services live on it, as",
        "  [Testing your agents](agents-sdk.md#testing-your-agents) describes. The selection is",
        "  made under that setting.",
        "- The fleet runs in the test's process and on its loop, so a test that patches `asyncio`",
        "  itself (`asyncio.wait_for`, to fire a deadline at once) patches the fleet's Kafka and",
        "  Redis I/O too, for as long as the test runs. The services' own background loops",
        "  (capacity registration, lease renewal, the ticks) wait through asyncio's functions as",
        "  imported, so they come out of such a test as they went in; after each test the harness",
        "  asks the fleet (`InProcessFleet.check()`) whether a service or one of those loops",
        "  ended, and fails that test's teardown with the reason if one did.",
        "- Only `agents.Runner`'s three entry points are routed. A test that drives the SDK's",
        "  `AgentRunner` directly is not selected, and a test that installs its own default agent",
        "  runner to watch what `Runner` calls sees FleetRunner instead.",
        "- A test that invokes no function tool exercises FleetRunner only as the SDK's runner;",
        "  the table counts the others apart.",
        "- Selected: every test during which `Runner.run`, `run_streamed` or `run_sync` was",
        "  called (by the test or by the SDK's own helpers: agents as tools, the REPL, the voice",
        "  workflow), recorded by a plugin over a whole run of the suite, and which passed",
        "  in-process. Files that import a package the `sdk-suite` extra leaves out (other",
        "  model providers, sandbox services) are not collected; `selected.txt` lists them.",
        "- The SDK's sources live under `.artifacts/sdk-suite/` (its sdist, unpacked; git",
        "  ignores the folder). Some of its own tests name parent-folder paths (`../NAME`) as",
        "  sandbox paths that must not escape a workspace: they are the SDK's test data, not",
        "  files of this project, which points at nothing outside its repository.",
        "",
        "## Last run",
        "",
        f"Run {meta['date']} on toolfleet {meta['commit']}: in-process"
        f" {meta['in_process_s']} s, on FleetRunner {meta['fleet_s']} s, the failures again on"
        f" a fresh fleet {meta.get('rerun_s', '0')} s.",
        "",
        "| | tests |",
        "|---|---:|",
        f"| selected (call the runner; passed in-process when selected) | "
        f"{len(figures.selected)} |",
        f"| pass in-process in this run | {baseline} |",
        f"| ... of which invoke a function tool in-process | {len(figures.with_tools)} |",
        f"| **pass on FleetRunner** | **{len(figures.passed)}** ({_percent(figures.rate)}) |",
        f"| ... of those that invoke a function tool | {figures.passed_with_tools}"
        f" ({_percent(figures.passed_with_tools / max(len(figures.with_tools), 1))}) |",
        f"| fail on a documented deviation | {figures.count(documented=True)} |",
        f"| fail on a cause not documented (a defect, or unexplained) | "
        f"{figures.count(documented=False)} |",
        f"| cannot be expressed on the fleet | {figures.count(inexpressible=True)} |",
        f"| intermittent (failed, then passed on a fresh fleet; counted as failed) | "
        f"{sum(1 for c in figures.failed.values() if c is INTERMITTENT)} |",
        "",
        f"The floor `make sdk-suite` holds is {_percent(expectations.floor)} of the in-process",
        f"passes (issue 35 asks for {_percent(expectations.target)}).",
    ]
    if figures.drift:
        lines += [
            "",
            f"Selected tests that did not call the runner and pass in-process in this run"
            f" ({len(figures.drift)}; the selection drifted, `python -m tests.sdk_suite select`"
            " rebuilds it):",
            "",
            *(f"- {_code(n)}: {why}" for n, why in sorted(figures.drift.items())),
        ]
    if figures.unchecked:
        lines += [
            "",
            f"Passed on FleetRunner although no worker started a tool body while the in-process"
            f" run invoked function tools ({len(figures.unchecked)}; a call refused before its"
            " body, by a guardrail or a failed argument check, starts none):",
            "",
            *(f"- {_code(n)}" for n in figures.unchecked),
        ]
    if examples is not None:
        lines += _examples(examples, meta)
    lines += ["", "## Failures by cause", ""]
    if not figures.failed:
        lines.append("None: every test that passes in-process passes on FleetRunner.")
    else:
        lines += ["| cause | documented | tests |", "|---|---|---:|"]
        for cause, nodeids in figures.by_cause():
            where = f"[yes]({cause.documented})" if cause.documented else "no"
            lines.append(f"| {cause.title} (`{cause.id}`) | {where} | {len(nodeids)} |")
        for cause, nodeids in figures.by_cause():
            lines += ["", f"### {cause.title}", ""]
            if cause.reason:
                lines += [cause.reason, ""]
            lines += [f"`{cause.id}`, {len(nodeids)} of {failed} failures:", ""]
            lines += [f"- {_code(n)}: {_code(_why(figures.failures[n]))}" for n in sorted(nodeids)]
    return "\n".join(lines) + "\n"
