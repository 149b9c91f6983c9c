"""Flags and settings that cannot work are refused before anything starts: a usage error
that names the flag or variable, never a traceback (``--concurrency 0`` stalled its pool,
``-1`` crashed with a ValueError)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from toolfleet.app.cli import main

TOOLS = "toolfleet.app.demo:tools"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--concurrency", "0"], "Invalid value for '--concurrency': 0 is not in the range x>=1"),
        (["--concurrency", "-1"], "Invalid value for '--concurrency': -1 is not in the range"),
        (["--concurrency", "many"], "Invalid value for '--concurrency': 'many' is not a valid"),
        (["--lease-s", "0"], "Invalid value for '--lease-s': 0.0 is not in the range x>=1.0"),
        (["--lease-s", "-5"], "Invalid value for '--lease-s'"),
        (["--pool", "a/b"], "Invalid value for '--pool': 'a/b': a pool names a Kafka topic"),
        (["--pool", ""], "Invalid value for '--pool'"),
    ],
)
def test_a_worker_flag_that_makes_no_sense_is_a_usage_error(args: list[str], says: str) -> None:
    done = CliRunner().invoke(main, ["worker", "--tools", TOOLS, *args])
    assert done.exit_code == 2, done.output
    assert says in done.output
    assert done.exception is None or isinstance(done.exception, SystemExit)


@pytest.mark.parametrize(
    ("tools", "says"),
    [
        ("mypkg.tools:tools", "cannot import 'mypkg.tools' (No module named 'mypkg')"),
        ("toolfleet.app.demo:nothing", "module 'toolfleet.app.demo' has no attribute 'nothing'"),
        ("toolfleet.app.demo", "expected module:attribute"),
        ("toolfleet.app.demo:run_demo", "is a function, not a ToolRegistry"),
    ],
)
def test_tools_that_cannot_be_loaded_are_a_usage_error_naming_the_flag(
    tools: str, says: str
) -> None:
    done = CliRunner().invoke(main, ["worker", "--tools", tools])
    assert done.exit_code == 2, done.output
    assert "Invalid value for '--tools'" in done.output and says in done.output


def test_a_setting_that_does_not_validate_names_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLFLEET_PARTITIONS", "abc")
    monkeypatch.setenv("TOOLFLEET_KAFKA_SASL_PASSWORD", "hunter2")
    monkeypatch.setenv("TOOLFLEET_KAFKA_SASL_MECHANISM", "NOT-A-MECHANISM")
    done = CliRunner().invoke(main, ["planner"])
    assert done.exit_code == 1, done.output
    assert "invalid setting: " in done.output
    assert "TOOLFLEET_PARTITIONS=abc: Input should be a valid integer" in done.output
    assert "TOOLFLEET_KAFKA_SASL_MECHANISM=NOT-A-MECHANISM" in done.output
    assert "hunter2" not in done.output


def test_the_real_command_prints_one_usage_error_and_no_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "toolfleet", "worker", "--tools", TOOLS, "--concurrency", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr + done.stdout
    assert done.stderr.strip().splitlines()[-1] == (
        "Error: Invalid value for '--concurrency': -1 is not in the range x>=1."
    )
