"""The differential harness: ``python -m tests.sdk_suite run|select`` (``make sdk-suite``).

``run``: fetch and check the SDK's sdist, run the selected tests in-process and on
FleetRunner (and the failures once more, on a fresh fleet), write docs/sdk-suite.md, and exit
1 when the share that passes on FleetRunner is below the committed floor or the selection
drifted. ``run`` also runs the SDK's examples (tests/sdk_suite/examples/) in-process and on
FleetRunner, and exits 1 when one differs; ``examples`` runs only those. ``report``: the same
conclusions from the last run's records (after an edit of causes.toml). ``select``: run the
whole suite in-process and rewrite selected.txt (the tests that call the runner and pass).

Both run the SDK's tests in the virtualenv ``--python`` names (``make sdk-suite`` makes it
with toolfleet's ``sdk-suite`` extra), from ``.artifacts/sdk-suite/``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.sdk_suite import _causes, _report, _sdist, _session
from tests.sdk_suite.examples import _session as _examples

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
WORK = REPO / ".artifacts" / "sdk-suite"
SELECTED = HERE / "selected.txt"
PAGE = REPO / "docs" / "sdk-suite.md"
DEFAULT_PYTHON = WORK / "venv" / "bin" / "python"
EXAMPLES = WORK / "examples.jsonl"
"""The last record of the examples' tests."""


def read_selection(path: Path = SELECTED) -> list[str]:
    """The committed node ids, in order (``#`` lines are comments)."""
    return [
        line.strip()
        for line in path.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def _files(nodeids: list[str]) -> list[str]:
    return sorted({n.split("::", 1)[0] for n in nodeids})


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def _commit() -> str:
    """The commit measured, marked when toolfleet's code differs from it in the work tree."""
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    code = ("schemas", "kernel", "planner", "executors", "aggregator", "reconciler", "toolfleet")
    return f"{commit} + uncommitted changes" if _git("status", "--porcelain", *code) else commit


def _prepare(python: str) -> Path:
    WORK.mkdir(parents=True, exist_ok=True)
    return _sdist.extract(_sdist.fetch(python), WORK)


def run(args: argparse.Namespace) -> int:
    """Both runs of the selected tests, the page, and the floor."""
    python = os.path.abspath(args.python)  # not resolved: a venv's python is a symlink
    root = _prepare(python)
    selected = read_selection()
    if args.only:
        selected = [n for n in selected if any(part in n for part in args.only)]
    selection = WORK / "selection.txt"
    selection.write_text("\n".join(selected) + "\n")
    paths = _files(selected)
    sessions = {}
    for name, on_fleet in (("in-process", False), ("fleet", True)):
        print(f"sdk-suite: {len(selected)} tests, {name}...", flush=True)
        sessions[name] = _session.run(
            python, root, WORK / f"{name}.jsonl", fleet=on_fleet, paths=paths,
            selection=selection, timeout=args.timeout,
        )  # fmt: skip
        print(
            f"sdk-suite: {name} run took {sessions[name].seconds:.0f} s "
            f"(pytest exit {sessions[name].returncode}; log {sessions[name].log})",
            flush=True,
        )
    fleet = sessions["fleet"].tests
    failed = [n for n in selected if n in fleet and fleet[n]["outcome"] != "passed"]
    (WORK / "rerun.jsonl").unlink(missing_ok=True)
    if failed:
        # Each failure once more, on a fresh fleet: one that passes is reported intermittent
        # (and stays a failure), so a cause is never assigned to a failure that does not recur.
        print(f"sdk-suite: the {len(failed)} failures again, on a fresh fleet...", flush=True)
        again = WORK / "rerun.txt"
        again.write_text("\n".join(failed) + "\n")
        sessions["rerun"] = _session.run(
            python, root, WORK / "rerun.jsonl", fleet=True, paths=_files(failed),
            selection=again, timeout=args.timeout,
        )  # fmt: skip
    if not args.only:
        print("sdk-suite: the SDK's examples, in-process and on FleetRunner...", flush=True)
        sessions["examples"] = _examples.run(python, root, EXAMPLES, timeout=args.timeout)
    meta = {
        "sdk_version": _sdist.VERSION,
        "sdk_sha256": _sdist.SHA256,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "in_process_s": f"{sessions['in-process'].seconds:.0f}",
        "fleet_s": f"{sessions['fleet'].seconds:.0f}",
        "rerun_s": f"{sessions['rerun'].seconds:.0f}" if "rerun" in sessions else "0",
        "examples_s": f"{sessions['examples'].seconds:.0f}" if "examples" in sessions else "0",
    }
    (WORK / "meta.json").write_text(json.dumps(meta, indent=1))
    return conclude(selected, meta, write=not args.only, check=not args.only)


def conclude(selected: list[str], meta: dict[str, str], *, write: bool, check: bool) -> int:
    """Compare the last run's records, write the page, hold the floor (exit status)."""
    expectations = _causes.load()
    figures = _report.compare(
        selected,
        _session.read(WORK / "in-process.jsonl"),
        _session.read(WORK / "fleet.jsonl"),
        expectations,
        rerun=_session.read(WORK / "rerun.jsonl"),
    )
    (WORK / "results.json").write_text(
        json.dumps(
            {
                **meta,
                "rate": figures.rate,
                "baseline": figures.baseline,
                "drift": figures.drift,
                "failed": {n: c.id for n, c in figures.failed.items()},
            },
            indent=1,
        )
    )
    examples = _session.read(EXAMPLES)
    if write:
        PAGE.write_text(_report.render(figures, expectations, meta, examples=examples))
    print(
        f"sdk-suite: {len(figures.passed)} of {len(figures.baseline)} in-process passes pass on "
        f"FleetRunner ({100 * figures.rate:.1f}%; floor {100 * expectations.floor:.1f}%); "
        f"{figures.count(documented=True)} fail on documented deviations, "
        f"{figures.count(documented=False)} on other causes; "
        f"{len(figures.drift)} selected tests drifted"
    )
    for cause, nodeids in figures.by_cause():
        print(f"  {len(nodeids):5d}  {cause.id}: {cause.title}")
    if not check:
        return 0
    examples_failed = _examples_summary(examples)
    # A selected test that failed in-process this time (a timing-sensitive SDK test on a busy
    # machine) is reported on the page but does not fail the run: the comparison is made on
    # this run's in-process passes. A test gone from the suite, or no longer calling the
    # runner, means the selection itself is stale.
    stale = {n: why for n, why in figures.drift.items() if not why.endswith(" in-process")}
    if stale:
        print(
            "sdk-suite: the selection drifted (see docs/sdk-suite.md); rebuild it with "
            "`python -m tests.sdk_suite select` and commit selected.txt",
            file=sys.stderr,
        )
        return 1
    if figures.rate < expectations.floor:
        print(
            "sdk-suite: below the floor in tests/sdk_suite/causes.toml: a change broke tests "
            "that passed on FleetRunner (see docs/sdk-suite.md)",
            file=sys.stderr,
        )
        return 1
    return 1 if examples_failed else 0


def _examples_summary(record: dict[str, dict[str, Any]]) -> bool:
    """Print how the examples' last run went; whether it failed (a test that did not pass, or
    no test recorded: a session that collected nothing or died first)."""
    failed = {n: t for n, t in record.items() if t["outcome"] != "passed"}
    print(
        f"sdk-suite: {len(record) - len(failed)} of {len(record)} runs of the SDK's examples "
        f"are the same on FleetRunner as in-process (log {EXAMPLES.with_suffix('.log')})"
    )
    for nodeid, entry in sorted(failed.items()):
        lines = str(entry.get("exc_message") or entry.get("crash") or "").splitlines() or [""]
        print(f"  {entry['outcome']}: {nodeid}: {entry.get('exc_type', '')}: {lines[0]}")
    return bool(failed) or not record


def examples(args: argparse.Namespace) -> int:
    """Only the SDK's examples, in-process and on FleetRunner (no page)."""
    python = os.path.abspath(args.python)  # not resolved: a venv's python is a symlink
    root = _prepare(python)
    print("sdk-suite: the SDK's examples, in-process and on FleetRunner...", flush=True)
    session = _examples.run(python, root, EXAMPLES, timeout=args.timeout)
    return 1 if _examples_summary(session.tests) or session.returncode != 0 else 0


def report(args: argparse.Namespace) -> int:
    """The page again from the last run's records (after editing causes.toml)."""
    meta = json.loads((WORK / "meta.json").read_text())
    return conclude(read_selection(), meta, write=True, check=True)


_NOT_COLLECTED = re.compile(r"^ERROR (\S+\.py)\b")


def select(args: argparse.Namespace) -> int:
    """A whole in-process run of the suite, recorded; selected.txt rewritten from it."""
    python = os.path.abspath(args.python)  # not resolved: a venv's python is a symlink
    root = _prepare(python)
    print("sdk-suite: the whole suite in-process, recording runner calls...", flush=True)
    session = _session.run(
        python, root, WORK / "select.jsonl", fleet=False, paths=args.paths or ["tests"],
        timeout=args.timeout, extra=["--continue-on-collection-errors"],
    )  # fmt: skip
    tests = session.tests
    calls = [t for t in tests.values() if t.get("runner")]
    passed = [t["nodeid"] for t in calls if t["outcome"] == "passed"]
    direct = [t for t in tests.values() if not t.get("runner") and t.get("agent_runner")]
    log = session.log.read_text().splitlines()
    uncollected = sorted({m.group(1) for line in log if (m := _NOT_COLLECTED.match(line))})
    header = [
        f"# The tests of openai-agents {_sdist.VERSION} (sdist sha256 {_sdist.SHA256[:16]}...)",
        "# that call agents.Runner.run / run_streamed / run_sync and pass in-process.",
        "# Written by `python -m tests.sdk_suite select` from a whole run of the suite",
        f"# ({len(tests)} tests ran in {session.seconds:.0f} s): {len(calls)} call the runner,",
        f"# {len(calls) - len(passed)} of them do not pass in-process; {len(direct)} other tests",
        "# drive the SDK's AgentRunner directly, not through Runner (not selected).",
        f"# Not collected ({len(uncollected)} files: they import a package the sdk-suite extra",
        "# leaves out (model providers, sandboxes, voice services) or files the sdist lacks):",
        *(f"#   {path}" for path in uncollected),
    ]
    SELECTED.write_text("\n".join([*header, *passed]) + "\n")
    print(f"sdk-suite: {len(passed)} tests selected into {SELECTED.relative_to(REPO)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m tests.sdk_suite", description=__doc__)
    parser.add_argument("--python", default=DEFAULT_PYTHON, help="the SDK suite's virtualenv")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per test")
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="both runs of the selection; the page")
    run_parser.add_argument(
        "--only", nargs="*", default=(), help="only node ids containing one of these (no page)"
    )
    commands.add_parser("report", help="the page again from the last run's records")
    commands.add_parser("examples", help="only the SDK's examples, in-process and on FleetRunner")
    select_parser = commands.add_parser("select", help="rebuild selected.txt")
    select_parser.add_argument("paths", nargs="*", help="test paths (default: the whole suite)")
    args = parser.parse_args(argv)
    commands_run = {"run": run, "report": report, "select": select, "examples": examples}
    return commands_run[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
